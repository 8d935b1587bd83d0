"""hvdlite as a torch.distributed backend: ``init_process_group(backend="hvdlite")``.

``import hvdlite.torch`` registers the backend; a DDP (or any
torch.distributed) script then runs its collectives on hvdlite's engine with
one string changed, launched by ``hvdrun -np N`` or ``mpiexec -n N`` (see
docs/ddp.md)::

    import hvdlite.torch  # noqa: F401  (registers "hvdlite")
    dist.init_process_group(backend="hvdlite")
    model = DistributedDataParallel(model)

The group is MPI's world, as hvdlite's is: rank and size come from MPI, and
when the launch did not set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
torch's ``env://`` rendezvous takes them from MPI (rendezvous.py). Under
torchrun (no MPI) creating the group fails with an error that says how to
launch.

This module is a thin adapter: each c10d collective becomes the Horovod
collective of hvdlite.torch (mpi_ops.py, whose requests hvdlite.collectives
builds) with c10d's conventions around it (group ranks, reduce ops, output
tensors the caller owns). What is supported is listed in docs/ddp.md.

Completion: a :class:`HvdliteWork` holds the engine's handles. ``wait()``
waits on them in the calling thread. ``get_future()`` returns a
``torch.futures.Future`` that completes when the engine does: the engine
calls back on its own thread (``hvd_on_completion``, asked for when the
future is first asked for), the callback only queues the handle, and one
thread here finishes the work (copies results into the caller's tensors)
and completes the future, which runs the callbacks chained with ``then()``
(DDP's communication hooks) there. Whichever of the two comes first
finishes the work; the future completes either way.
"""
import queue
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

from hvdlite import _binding, basics, collectives, exceptions, request
from hvdlite.compression import Compression
from hvdlite.process_sets import _add_process_set_as_member, global_process_set
from hvdlite.request import Average, Max, Min, Product, Sum

from . import device, mpi_ops, rendezvous

BACKEND = "hvdlite"

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: Sum, _RED.AVG: Average, _RED.MIN: Min, _RED.MAX: Max, _RED.PRODUCT: Product}


def _reduce_op(opts, what):
    """(hvdlite op, prescale factor) of c10d options, a ReduceOp or a RedOpType.
    PREMUL_SUM is a Sum of the inputs times its factor."""
    op = getattr(opts, "reduceOp", opts)
    kind = getattr(op, "op", op)
    if kind == _RED.PREMUL_SUM:
        factor = op.factor
        return Sum, float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    if kind not in _OPS:
        raise exceptions.InvalidArgumentError(
            f"{what}: the hvdlite backend reduces with SUM, AVG, MIN, MAX, PRODUCT and "
            f"PREMUL_SUM, not {kind}")
    return _OPS[kind], 1.0


def _tensors(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _copy_into(output, result, what):
    if result.numel() != output.numel():
        raise exceptions.InvalidArgumentError(
            f"{what}: the output holds {output.numel()} elements but the ranks sent "
            f"{result.numel()}")
    with torch.no_grad():
        output.copy_(result.reshape(output.shape))


def _split_into(outputs, result, what):
    """Copies the 1-d ``result`` into ``outputs`` in order, each its own number
    of elements (allgather's per-rank outputs, alltoall's per-rank pieces)."""
    sizes = [o.numel() for o in outputs]
    if sum(sizes) != result.numel():
        raise exceptions.InvalidArgumentError(
            f"{what}: the outputs hold {sum(sizes)} elements but the ranks sent {result.numel()}")
    for o, piece in zip(outputs, result.reshape(-1).split(sizes)):
        _copy_into(o, piece, what)


# ---------------------------------------------------------------- engine names

# The engine's response cache recognises a collective by its name: a name
# that comes back with the same metadata skips the coordinator. c10d has no
# names, so the group makes them from what every rank sees alike, the order
# of its calls: ``c10d.<group>.<what>.<n>``, where ``<what>`` is the
# operation, reduce op, dtype and shape (the parts of the shape every rank
# shares) and ``<n>`` counts the calls of that same ``<what>`` in a row (0
# for the first, 1 for the next one just after it, ...). A run also ends
# where a backward pass begins or ends (autograd's graph task changes): DDP
# issues its bucket allreduces from the backward pass, in the same order
# every step, so each bucket gets the same name every step (two buckets of
# one size in a row get .0 and .1; a model of one bucket gets .0 every step,
# not .0, .1, .2, ... as one long run), and so do FSDP's all-gathers and
# reduce-scatters.
#
# A name is reused once the collective that last had it has completed on this
# rank: should it still be in flight (a pattern such as A, B, A of async
# calls), the call waits for it first. That cannot deadlock: every rank
# issued the earlier collective before this one, so it completes without
# this rank's later calls.
_RUN_LIMIT = 64        # <n> wraps at this: a long run of one shape reuses its names
_PRUNE_AT = 4096       # in-flight records kept before the completed ones are dropped
_OP_NAMES = {Sum: "sum", Average: "avg", Min: "min", Max: "max", Product: "product"}
_engine_generation = [0]


def _engine_started():
    _engine_generation[0] += 1     # handle ids start again: older records mean nothing


_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _dtype(tensor):
    return str(tensor.dtype).replace("torch.", "")


def _shape(shape):
    return "x".join(str(int(d)) for d in shape) or "scalar"


class _Names:
    """The engine names of one group's collectives (see above)."""

    def __init__(self, prefix):
        self._prefix = prefix
        self._lock = threading.Lock()
        self._last = None       # <what> of the previous call
        self._run = 0
        self._task = -1         # autograd graph task of the previous call (-1: none)
        self._in_flight = {}    # name -> engine handle ids of its latest collective
        self._generation = _engine_generation[0]

    def start(self, what, submit):
        """``submit(name)`` under the next name for ``what``; returns its handle."""
        with self._lock:
            if self._generation != _engine_generation[0]:
                self._in_flight.clear()
                self._generation = _engine_generation[0]
            task = _graph_task()
            if task != self._task:
                self._task, self._last = task, None
            if what == self._last:
                self._run = (self._run + 1) % _RUN_LIMIT
            else:
                self._last, self._run = what, 0
            name = f"{self._prefix}.{what}.{self._run}"
            previous = self._in_flight.pop(name, ())
        for i in previous:
            # 1: done; -1: done and released; 0: still in flight, wait on.
            while _binding.lib.hvd_wait(i, 0.2) == 0:
                pass
        handle = submit(name)
        ids = _engine_ids(handle)
        if ids:
            with self._lock:
                self._in_flight[name] = ids
                if len(self._in_flight) > _PRUNE_AT:
                    self._in_flight = {n: v for n, v in self._in_flight.items()
                                       if any(_binding.lib.hvd_poll(i) == 0 for i in v)}
        return handle


# ---------------------------------------------------------------- completion

def _engine_ids(handle):
    if isinstance(handle, request.GroupHandle):
        return [i for h in handle.handles for i in _engine_ids(h)]
    engine_id = handle.engine_id()
    return [] if engine_id is None else [engine_id]


class _Completions:
    """The engine's completion callbacks, taken on one thread of this module."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._works = {}        # engine handle id -> HvdliteWork
        self._lock = threading.Lock()
        self._thread = None
        # One C callback for every handle; it must stay alive as long as the engine may call it.
        self._callback = _binding.ffi.callback("hvd_completion_callback", self._notify)

    def _notify(self, handle_id, _arg):
        # On the engine's thread: queue and return (c_api.h: no calls into hvdlite here).
        self._queue.put(handle_id)

    def watch(self, work, ids):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hvdlite-c10d-completion",
                                                daemon=True)
                self._thread.start()
        work._remaining = len(ids)
        if not ids:
            work._complete()
            return
        for i in ids:
            self._works[i] = work
        for i in ids:
            if _binding.lib.hvd_on_completion(i, self._callback, _binding.ffi.NULL) != 0:
                self._queue.put(i)  # an unknown handle (engine stopped): the work reads why

    def _run(self):
        while True:
            work = self._works.pop(self._queue.get(), None)
            if work is None:
                continue
            work._remaining -= 1
            if work._remaining == 0:
                try:
                    work._complete()
                except BaseException:  # noqa: BLE001 - the thread must go on
                    traceback.print_exc(file=sys.stderr)


_completions = None
_completions_lock = threading.Lock()


def _watch(work, ids):
    global _completions
    if _completions is None:
        with _completions_lock:
            if _completions is None:
                _completions = _Completions()
    _completions.watch(work, ids)


class HvdliteWork(Work):
    """A c10d Work over hvdlite handles; ``finish(results)`` (once, on
    whichever thread gets there first) writes the results where c10d wants
    them and returns the future's value."""

    def __init__(self, handles, finish, what):
        super().__init__()
        self._handles = handles
        self._finish = finish
        self._what = what
        self._ids = [i for h in handles for i in _engine_ids(h)]
        self._future = torch.futures.Future()
        self._lock = threading.Lock()
        self._outcome = None    # (value, exception) once finished
        self._done = threading.Event()
        self._remaining = 0
        self._watched = False   # the engine's callbacks are asked for by get_future()

    def _complete(self):
        with self._lock:
            if self._outcome is not None:
                return
            try:
                self._outcome = (self._finish(request.wait_all(self._handles)), None)
            except BaseException as e:  # noqa: BLE001 - it belongs to the waiters
                self._outcome = (None, e)
        value, error = self._outcome
        try:
            if error is None:
                self._future.set_result(value)
            else:
                self._future.set_exception(error)
        finally:
            self._done.set()

    def wait(self, timeout=timedelta(0)):
        """Blocks until the collective completed and its results are in place
        (a timeout of 0, c10d's default, waits as long as it takes)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        if seconds > 0 and self._outcome is None:
            deadline = time.monotonic() + seconds
            for i in self._ids:
                left = deadline - time.monotonic()
                # 1 done, -1 already collected by another thread, 0 timed out.
                if left <= 0 or _binding.lib.hvd_wait(i, left) == 0:
                    raise exceptions.HvdliteTimeoutError(
                        f"{self._what} did not complete within {timeout}")
        self._complete()
        error = self._outcome[1]
        if error is not None:
            raise error
        return True

    def get_future(self):
        with self._lock:
            watch, self._watched = not self._watched and self._outcome is None, True
        if watch:
            _watch(self, list(self._ids))
        return self._future

    def is_completed(self):
        return self._outcome is not None

    def is_success(self):
        return self._outcome is not None and self._outcome[1] is None

    def exception(self):
        return None if self._outcome is None else self._outcome[1]

    def result(self):
        self.wait()
        value = self._outcome[0]
        return value if isinstance(value, list) else []

    def synchronize(self):
        self.wait()


# ---------------------------------------------------------------- the process group

class HvdliteProcessGroup(ProcessGroup):
    """A torch.distributed process group whose collectives run on hvdlite's
    engine, over hvdlite's global process set or the process set of its ranks."""

    def __init__(self, store, rank, size, process_set, timeout, group_id=None):
        # (torch 2.13: only the (rank, size) constructor makes a Python subclass;
        # (store, rank, size) fails with "not an alias instance".)
        super().__init__(rank, size)
        self._store = store
        self._process_set = process_set
        self._ranks = list(process_set.ranks)   # group rank -> job rank
        self._timeout = timeout
        self._group_name = None
        # torch names each group alike on every member ("0" for the default
        # group); the process set tells groups apart where it does not.
        tag = group_id if group_id else f"set{process_set.process_set_id}"
        self._names = _Names(f"c10d.{tag}")

    def getBackendName(self):
        return BACKEND

    # torch keeps a group's name in its backends, which a Python subclass does
    # not have: DeviceMesh (FSDP2) reads group_name and would find none.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    def __repr__(self):
        return f"HvdliteProcessGroup(rank={self.rank()}, size={self.size()}, ranks={self._ranks})"

    def _work(self, handles, finish, what):
        return HvdliteWork(handles, finish, what)

    def _allreduce_start(self, tensor, op, prescale=1.0, inplace=True,
                         compression=Compression.none):
        """One named allreduce (hvdlite op), in place or into a new tensor."""
        start = mpi_ops.allreduce_async_ if inplace else mpi_ops.allreduce_async
        what = f"allreduce.{_OP_NAMES.get(op, op)}"
        if compression is not Compression.none:
            what += f".{compression.kind}"
        what += f".{_dtype(tensor)}.{_shape(tensor.shape)}"
        return self._names.start(what, lambda name: start(
            tensor, name=name, op=op, prescale_factor=prescale, process_set=self._process_set,
            compression=compression))

    # ---- allreduce
    def allreduce(self, tensors, opts=None):
        tensors = _tensors(tensors)
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, "allreduce")
        handles = [self._allreduce_start(t, op, prescale) for t in tensors]
        return self._work(handles, lambda _results: tensors, "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        """The root gets the reduction; other ranks' tensors stay as they were."""
        tensors = _tensors(tensors)
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, "reduce")
        root = self.rank() == (opts.rootRank if opts is not None else 0)
        handles = [self._allreduce_start(t, op, prescale, inplace=root) for t in tensors]
        return self._work(handles, lambda _results: tensors, "reduce")

    # ---- broadcast
    def broadcast(self, tensors, opts=None):
        tensors = _tensors(tensors)
        root = self._ranks[opts.rootRank if opts is not None else 0]
        handles = [self._names.start(
            f"broadcast.{root}.{_dtype(t)}.{_shape(t.shape)}",
            lambda name, t=t: mpi_ops.broadcast_async_(t, root, name=name,
                                                       process_set=self._process_set))
            for t in tensors]
        return self._work(handles, lambda _results: tensors, "broadcast")

    # ---- allgather
    def _gather_flat(self, inputs):
        # Ranks may send different numbers of elements: the name has the dtype only.
        return [self._names.start(
            f"allgather.{_dtype(t)}",
            lambda name, t=t: mpi_ops.allgather_async(t.reshape(-1), name=name,
                                                      process_set=self._process_set))
            for t in inputs]

    def allgather(self, output_lists, inputs, opts=None):
        inputs = _tensors(inputs)

        def finish(results):
            for outputs, result in zip(output_lists, results):
                _split_into(outputs, result, "allgather")
            return output_lists
        return self._work(self._gather_flat(inputs), finish, "allgather")

    allgather_coalesced = allgather

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        outputs, inputs = _tensors(outputs), _tensors(inputs)

        def finish(results):
            for output, result in zip(outputs, results):
                _copy_into(output, result, "all_gather_into_tensor")
            return outputs
        return self._work(self._gather_flat(inputs), finish, "all_gather_into_tensor")

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    # c10d's names before torch 2.13 (C++ callers may still use them)
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=None):
        """Every rank gathers (hvdlite has no rooted gather); the root keeps it."""
        inputs = _tensors(inputs)
        root = self.rank() == (opts.rootRank if opts is not None else 0)

        def finish(results):
            if root:
                for outputs, result in zip(output_lists, results):
                    _split_into(outputs, result, "gather")
            return output_lists if root else []
        return self._work(self._gather_flat(inputs), finish, "gather")

    # ---- reducescatter
    def _reducescatter(self, outputs, stacked, opts, what):
        """``stacked[i]``: one row per rank, each row ``outputs[i]``'s size."""
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, what)
        handles = [self._names.start(
            f"reducescatter.{_OP_NAMES.get(op, op)}.{_dtype(s)}.{_shape(s.shape)}",
            lambda name, s=s: mpi_ops.reducescatter_async(
                s, name=name, op=op, prescale_factor=prescale, process_set=self._process_set))
            for s in stacked]

        def finish(results):
            for output, result in zip(outputs, results):
                _copy_into(output, result, what)
            return outputs
        return self._work(handles, finish, what)

    def _rows(self, output, input, what):
        n = self.size()
        if input.numel() != n * output.numel():
            raise exceptions.InvalidArgumentError(
                f"{what}: the input must hold {n} times the output's elements ({n} x "
                f"{output.numel()}), not {input.numel()}")
        return input.reshape(n, -1)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        what = "reduce_scatter_tensor"
        outputs, inputs = _tensors(outputs), _tensors(inputs)
        stacked = [self._rows(o, i, what) for o, i in zip(outputs, inputs)]
        return self._reducescatter(outputs, stacked, opts, what)

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        outputs = _tensors(outputs)
        stacked = []
        for output, inputs in zip(outputs, input_lists):
            if len(inputs) != self.size() or any(t.numel() != output.numel() for t in inputs):
                raise exceptions.InvalidArgumentError(
                    f"reduce_scatter: every rank passes {self.size()} inputs of the output's size "
                    f"({output.numel()} elements)")
            stacked.append(torch.cat([t.reshape(-1) for t in inputs]).reshape(self.size(), -1))
        return self._reducescatter(outputs, stacked, opts, "reduce_scatter")

    # ---- alltoall
    def _alltoall_start(self, tensor, splits):
        # The first dimension differs between ranks: the name has the others.
        rest = f".{_shape(tensor.shape[1:])}" if tensor.dim() > 1 else ""
        return self._names.start(
            f"alltoall.{_dtype(tensor)}{rest}",
            lambda name: mpi_ops.alltoall_async(tensor, splits, name=name,
                                                process_set=self._process_set))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        splits = list(input_split_sizes) or None
        handle = self._alltoall_start(input, splits)

        def finish(results):
            rows, received = results[0]
            if output_split_sizes and list(output_split_sizes) != received.tolist():
                raise exceptions.InvalidArgumentError(
                    f"{what}: output_split_sizes {list(output_split_sizes)}, but the ranks sent "
                    f"{received.tolist()} rows")
            _copy_into(output, rows, what)
            return [output]
        return self._work([handle], finish, what)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        """``inputs[j]`` goes to group rank j, ``outputs[j]`` comes from it."""
        flat = torch.cat([t.reshape(-1) for t in inputs])
        handle = self._alltoall_start(flat, [t.numel() for t in inputs])

        def finish(results):
            _split_into(outputs, results[0][0], "alltoall")
            return outputs
        return self._work([handle], finish, "alltoall")

    def scatter(self, outputs, input_lists, opts=None):
        """An alltoall in which only the root sends."""
        outputs = _tensors(outputs)
        root = opts.rootRank if opts is not None else 0
        if self.rank() == root:
            flat = torch.cat([t.reshape(-1) for t in input_lists[0]])
            splits = [t.numel() for t in input_lists[0]]
        else:
            flat = outputs[0].new_empty(0)
            splits = [0] * self.size()
        handle = self._alltoall_start(flat, splits)

        def finish(results):
            _copy_into(outputs[0], results[0][0], "scatter")
            return outputs
        return self._work([handle], finish, "scatter")

    # ---- control
    def barrier(self, opts=None):
        handle = _binding.enqueue(**collectives.barrier_request(self._process_set))
        return self._work([handle], lambda _results: None, "barrier")

    def _no_point_to_point(self, *args, **kwargs):
        raise NotImplementedError(
            "the hvdlite backend has no point-to-point send/recv yet; use a gloo group for them "
            "(dist.new_group(backend=\"gloo\"))")

    send = recv = recv_anysource = _no_point_to_point

    def shutdown(self):
        """destroy_process_group(): the engine stays (it belongs to hvdlite,
        which stops it at exit or at hvdlite.shutdown())."""

    def abort(self):
        """Stops hvdlite's engine: pending collectives fail on every rank."""
        basics.shutdown()


# ---------------------------------------------------------------- creating groups

def _launch_error(group_size, group_rank, why):
    return exceptions.InvalidArgumentError(
        f"the hvdlite backend runs on MPI's world, but {why} (torch.distributed asked for rank "
        f"{group_rank} of {group_size}). Launch the script with MPI: hvdrun -np N python "
        "script.py, or mpiexec -n N python script.py (torchrun starts ranks without MPI; "
        "with torchrun use backend=\"gloo\")")


def _start_engine(group_size, group_rank):
    if not basics.is_initialized():
        if group_size > 1 and not rendezvous.launched_by_mpi():
            raise _launch_error(group_size, group_rank, "this process was not started by an MPI "
                                "launcher")
        basics.init()
    if device.backend_name() is not None:
        raise exceptions.InvalidArgumentError(
            f"the hvdlite backend does not run beside hvdlite's device executor yet "
            f"({device.MODE_VAR}={device.mode()}, which runs on torch.distributed's default "
            f"group itself); set {device.MODE_VAR}=host")


def _process_set(ranks, group_rank, group_size, group_id):
    world = basics.size()
    if not ranks or list(ranks) == list(range(world)):
        if group_size != world or group_rank != basics.rank():
            raise _launch_error(group_size, group_rank, f"MPI started {world} ranks and this is "
                                f"rank {basics.rank()}")
        return global_process_set
    ranks = [int(r) for r in ranks]
    if ranks != sorted(ranks):
        raise exceptions.InvalidArgumentError(
            f"new_group(ranks={ranks}): the hvdlite backend takes a group's ranks in increasing "
            "order")
    # torch creates a group on its members only: they add its process set
    # among themselves (or share one of the same ranks), under a name that
    # every member gives alike, the group's.
    tag = group_id if group_id else "ranks." + ".".join(map(str, ranks))
    return _add_process_set_as_member(ranks, f"c10d.{tag}.add_process_set")


def _subgroup_before_init(ranks):
    """A group of some ranks while hvdlite is not started: starting it is
    collective over all ranks, and torch calls the backend on the members only."""
    if basics.is_initialized() or not ranks or not dist.is_initialized():
        return None
    if len(ranks) == dist.get_world_size():
        return None
    return exceptions.InvalidArgumentError(
        f"new_group(ranks={list(ranks)}) on the hvdlite backend before hvdlite is started: "
        "starting it is collective over all ranks, and torch.distributed creates a group on its "
        "members only. Call hvdlite.init() (hvdlite.torch.init()) on every rank first, or make "
        "hvdlite the default group's backend")


def create_process_group(backend_options, pg_options=None):
    """``Backend.register_backend``'s creator (extended API)."""
    size, rank = backend_options.group_size, backend_options.group_rank
    ranks = list(backend_options.global_ranks_in_group)
    error = _subgroup_before_init(ranks)
    if error is not None:
        raise error
    _start_engine(size, rank)
    group_id = getattr(backend_options, "group_id", None)
    process_set = _process_set(ranks, rank, size, group_id)
    return HvdliteProcessGroup(backend_options.store, rank, size, process_set,
                               backend_options.timeout, group_id)


def register():
    """Registers the "hvdlite" backend with torch.distributed (once) and
    lets ``env://`` take what it lacks from MPI; returns whether it is there."""
    if not dist.is_available():
        return False
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True,
                                      devices=["cpu"])
        basics.add_engine_hooks(_engine_started, lambda: None)
    rendezvous.install_env_fallback()
    return True
