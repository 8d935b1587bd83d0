"""Process sets: collectives over a subset of ranks (Horovod's API).

Adding and removing a set is collective over all ranks, in the same order
everywhere, as in Horovod. Front ends that create a group on its members
alone (torch.distributed's ``new_group``) add its set with
:func:`_add_process_set_as_member`, which only the members call."""
import threading
import weakref

from . import _binding, exceptions
from ._binding import ffi, lib


def _rank():
    return _binding.check(lib.hvd_rank())


def _size():
    return _binding.check(lib.hvd_size())


class ProcessSet:
    """A set of ranks. Create with ``ProcessSet([0, 2])`` and register with
    :func:`add_process_set` (or ``init(process_sets=[...])``)."""

    def __init__(self, ranks_or_comm):
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_group"):
            # An mpi4py communicator (Horovod accepts one): its members'
            # COMM_WORLD ranks.
            from mpi4py import MPI
            self.mpi_comm = ranks_or_comm
            group = ranks_or_comm.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                              MPI.COMM_WORLD.Get_group())
            group.Free()
        else:
            ranks = ranks_or_comm
        try:
            self.ranks = sorted(int(r) for r in ranks)
        except (TypeError, ValueError):
            raise exceptions.InvalidArgumentError(
                "ProcessSet takes a list of ranks or an mpi4py communicator, not "
                f"{ranks_or_comm!r}") from None
        if len(set(self.ranks)) != len(self.ranks):
            raise exceptions.InvalidArgumentError(f"process set ranks must be distinct: {ranks}")
        self.process_set_id = None

    def _require_id(self):
        if self.process_set_id is None:
            raise exceptions.InvalidArgumentError(
                f"process set {self.ranks} is not registered; call hvdlite.add_process_set() first")
        return self.process_set_id

    def size(self):
        return len(self.ranks)

    def rank(self):
        """This process's rank within the set, or -1 when not a member."""
        return lib.hvd_process_set_rank(self._require_id())

    def included(self):
        return _rank() in self.ranks

    def __repr__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


class _GlobalProcessSet(ProcessSet):
    def __init__(self):
        self.process_set_id = 0
        self.mpi_comm = None

    @property
    def ranks(self):
        return list(range(_size()))

    def size(self):
        return _size()

    def included(self):
        return True

    def __repr__(self):
        # Signatures show this object as a default value (help(), inspect):
        # that must work before init(), when the ranks are not known yet.
        ranks = self.ranks if lib.hvd_is_initialized() else None
        return f"ProcessSet(process_set_id=0, ranks={ranks}, mpi_comm={self.mpi_comm})"


global_process_set = _GlobalProcessSet()
_registry_lock = threading.Lock()
# ProcessSet objects bound to an id of the running engine.
_bound = weakref.WeakSet()


def _bind(process_set, pid):
    process_set.process_set_id = pid
    _bound.add(process_set)


def forget_registered_sets():
    """The engine that knew them is gone (hvdlite.abandon()): every bound
    ProcessSet is unregistered, so it can be added again to the next engine,
    whose ids start over (0 is its global set), as after Horovod's reset."""
    for process_set in list(_bound):
        process_set.process_set_id = None
    _bound.clear()


def process_set_id(process_set):
    """Accepts a ProcessSet, an id, or None (= global)."""
    if process_set is None:
        return 0
    if isinstance(process_set, ProcessSet):
        pid = process_set._require_id()
    elif isinstance(process_set, int):
        pid = process_set
    else:
        raise exceptions.InvalidArgumentError(
            f"process_set must be a ProcessSet or an int id, not {type(process_set).__name__}")
    # Checked here, not only by the engine, so that a TensorFlow op over an
    # unknown set fails where it is built (ValueError, as in Horovod).
    if pid != 0 and lib.hvd_is_initialized() and lib.hvd_process_set_size(pid) < 0:
        raise exceptions.InvalidArgumentError(
            f"there is no process set with id {pid} (never added, or removed); add it with "
            "add_process_set()")
    return pid


def set_root_rank(root_rank, process_set, what):
    """Horovod's root_rank is a rank of the job; the engine wants the root's
    position within the process set."""
    try:
        if isinstance(root_rank, float) and not root_rank.is_integer():
            raise ValueError  # 0.7 must not quietly become rank 0
        root_rank = int(root_rank)
    except (TypeError, ValueError):
        raise exceptions.InvalidArgumentError(
            f"{what}: root_rank must be an int, not {root_rank!r}") from None
    pid = process_set_id(process_set)
    if pid == 0:
        return root_rank  # the engine checks the range
    ranks = process_set.ranks if isinstance(process_set, ProcessSet) else \
        get_process_set_ids_and_ranks().get(pid, [])
    if root_rank not in ranks:
        raise exceptions.InvalidArgumentError(
            f"{what}: root_rank {root_rank} is not a member of process set {ranks}; root_rank "
            "is a rank of the job, as in Horovod")
    return ranks.index(root_rank)


def add_process_set(process_set):
    """Registers a set on every rank (all ranks must call this in the same order)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise exceptions.InvalidArgumentError(f"{process_set!r} is already registered")
    n = _size()
    bad = [r for r in process_set.ranks if r < 0 or r >= n]
    if bad or not process_set.ranks:
        raise exceptions.InvalidArgumentError(
            f"process set ranks must be a non-empty list in [0, {n}); got {process_set.ranks}")
    if process_set.ranks == list(range(n)):
        raise exceptions.InvalidArgumentError(
            f"add_process_set({process_set.ranks}): these are all ranks, the global process set "
            "(hvdlite.global_process_set); use it instead")
    for pid, ranks in get_process_set_ids_and_ranks().items():
        if ranks == process_set.ranks:
            raise exceptions.InvalidArgumentError(
                f"add_process_set({process_set.ranks}): a process set with these ranks is already "
                f"registered (id {pid}); a set of ranks may be registered once, as in Horovod")
    with _registry_lock:
        handle = _binding.enqueue(
            _binding.ADD_PROCESS_SET, dtype_code=0, shape=[], set_ranks=process_set.ranks,
            finish=lambda h: lib.hvd_handle_value(h))
        _bind(process_set, int(handle.wait()))
    return process_set


def _add_process_set_as_member(ranks, name):
    """The process set of ``ranks``, added by its members alone: every member
    calls this with the same ranks and ``name`` (unique among the adds in
    flight at once: torch.distributed's group name), the other ranks do not,
    and their engines register the set in the same round, so its id is the
    same everywhere. A set of these ranks already registered is returned
    without asking the engine (a second group of the same ranks shares it),
    and all ranks are the global process set."""
    process_set = ProcessSet(ranks)
    n = _size()
    if process_set.ranks == list(range(n)):
        return global_process_set
    bad = [r for r in process_set.ranks if r < 0 or r >= n]
    if bad or not process_set.ranks:
        raise exceptions.InvalidArgumentError(
            f"process set ranks must be a non-empty list in [0, {n}); got {process_set.ranks}")
    with _registry_lock:
        for pid, members in get_process_set_ids_and_ranks().items():
            if members == process_set.ranks:
                _bind(process_set, pid)
                return process_set
        # The engine refuses a non-member (it takes no part in the set's add).
        handle = _binding.enqueue(
            _binding.ADD_PROCESS_SET, name=name, dtype_code=0, shape=[],
            set_ranks=process_set.ranks, members_only=1, finish=lambda h: lib.hvd_handle_value(h))
        _bind(process_set, int(handle.wait()))
    return process_set


def register_at_init(entries, comm):
    """init(process_sets=...): registers the sets every rank listed and binds
    each entry to its id. A set given by a communicator may name different
    ranks on different ranks (each rank passes the part of a split it belongs
    to), so the sets registered are the union over all ranks: communicator sets
    first, then lists of ranks, each in rank order. Entries repeating an
    earlier one or the global set raise once the others are bound, and a later
    init() with a corrected list binds to the sets already registered."""
    sets = [e if isinstance(e, ProcessSet) else ProcessSet(e) for e in entries]
    seen = {tuple(range(_size()))}
    duplicates = []
    by_comm, by_ranks = [], []
    for i, ps in enumerate(sets):
        key = tuple(ps.ranks)
        if key in seen:
            duplicates.append(i)
            continue
        seen.add(key)
        (by_comm if ps.mpi_comm is not None else by_ranks).append(ps.ranks)
    everyone = comm.allgather((by_comm, by_ranks))
    union = []
    for part in (0, 1):
        for lists in everyone:
            union += [ranks for ranks in lists[part] if ranks not in union]
    ids = {tuple(ranks): pid for pid, ranks in get_process_set_ids_and_ranks().items()}
    for ranks in union:
        if tuple(ranks) not in ids:
            ids[tuple(ranks)] = add_process_set(ranks).process_set_id
    for i, ps in enumerate(sets):
        if i not in duplicates:
            _bind(ps, ids[tuple(ps.ranks)])
    if duplicates:
        i = duplicates[0]
        raise exceptions.InvalidArgumentError(
            f"init(process_sets=...): entry number {i}, {sets[i].ranks}, repeats an earlier entry "
            "or the global process set; list each set of ranks once (the others are registered, "
            "so init() can be called again with the corrected list)")


def remove_process_set(process_set):
    """Unregisters a set on every rank; its pending collectives fail. Returns
    whether a set was removed: False for the global set and for a set that is
    not registered, as in Horovod."""
    if isinstance(process_set, ProcessSet):
        pid = process_set.process_set_id
    elif isinstance(process_set, int):
        pid = process_set
    else:
        pid = process_set_id(process_set)  # raises: not a set
    if pid is None or pid == 0 or pid not in get_process_set_ids_and_ranks():
        return False
    handle = _binding.enqueue(_binding.REMOVE_PROCESS_SET, dtype_code=0, shape=[], target_set=pid)
    handle.wait()
    if isinstance(process_set, ProcessSet):
        process_set.process_set_id = None
        _bound.discard(process_set)
    return True


def get_process_set_ids_and_ranks():
    ids = ffi.new("int32_t[]", 1024)
    n = _binding.check(lib.hvd_process_set_ids(ids, 1024))
    out = {}
    for i in range(min(n, 1024)):
        ranks = ffi.new("int32_t[]", 65536)
        m = _binding.check(lib.hvd_process_set_ranks(ids[i], ranks, 65536))
        out[ids[i]] = [ranks[j] for j in range(min(m, 65536))]
    return out
