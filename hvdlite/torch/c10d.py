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
tensors the caller owns). Sends, receives and monitored_barrier go over MPI
on a communicator of the group's own (c10d_p2p.py). What is supported is
listed in docs/ddp.md.

Timeouts: the group's (``init_process_group(timeout=)``,
``new_group(timeout=)``, torch's 30 minutes by default) is what a work's
``wait()`` without a timeout of its own waits at most (c10d_work.py); futures
(DDP's gradients) complete with the engine, whose HVDLITE_TIMEOUT_SECONDS
bounds its waits for a peer. A collective that some rank never makes (or
makes with another shape) waits in negotiation instead: where
torch.distributed starts the engine, the default group's timeout becomes the
stall inspector's HVDLITE_STALL_SHUTDOWN_TIME_SECONDS unless that is set
(rendezvous.start_engine), so such a wait ends with a StallError on every
rank, as torch ends it with a timeout. Under TORCH_DISTRIBUTED_DEBUG=DETAIL
a group compares each collective across its ranks before running it
(``_Names.check``), so ranks that differ raise at once.

Tensors: the backend takes CPU and CUDA tensors (registered for both) and
hands them to mpi_ops as they are; mpi_ops picks the path per tensor. CPU
tensors run on the engine; CUDA tensors on hvdlite's device path (device.py:
the engine negotiates, the device executor runs NCCL on groups of its own),
or staged through host memory where NCCL cannot run;
HVDLITE_DEVICE_TRANSPORT=gloo sends CPU tensors through the executor on gloo.
Results come back the same way on every path (in the caller's tensor, or as
a tensor on the input's device that the work copies into the outputs).

Completion: a :class:`HvdliteWork` holds the engine's handles. ``wait()``
waits on them in the calling thread. ``get_future()`` returns a
``torch.futures.Future`` that completes when the engine does: the engine
calls back on its own thread (``hvd_on_completion``, asked for when the
future is first asked for), the callback only queues the handle, and one
thread here finishes the work (copies results into the caller's tensors)
and completes the future, which runs the callbacks chained with ``then()``
(DDP's communication hooks) there. Whichever of the two comes first
finishes the work; the future completes either way. An engine error fails
the future where C++ sees it too: DDP's backward raises it (c10d_work.py).
A device job's handles complete through the same callbacks, called on the
device executor's thread when it reports the job done. A work on CUDA
tensors has a CUDA future (see HvdliteWork): its waiters' streams wait for
the results.
"""
import functools
import queue
import sys
import threading
import time
import traceback
from datetime import timedelta

import hvdlite_torch_plugin
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup
from torch.distributed import distributed_c10d

from hvdlite import _binding, basics, collectives, exceptions, objects, request
from hvdlite.compression import Compression
from hvdlite.process_sets import _add_process_set_as_member, global_process_set
from hvdlite.request import Average, Max, Min, Product, Sum

from . import c10d_p2p, mpi_ops, rendezvous
from .c10d_work import OutcomeWork

BACKEND = hvdlite_torch_plugin.BACKEND

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
        bitwise = kind in (_RED.BAND, _RED.BOR, _RED.BXOR)
        raise exceptions.InvalidArgumentError(
            f"{what}: the hvdlite backend reduces with SUM, AVG, MIN, MAX, PRODUCT and "
            f"PREMUL_SUM, not {kind}" + (" (hvdlite's engine has no bitwise reductions; use a "
                                         "gloo group for them: dist.new_group(backend=\"gloo\"))"
                                         if bitwise else ""))
    return _OPS[kind], 1.0


def _tensors(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _flat(items):
    """The tensors in nested lists of tensors (None and empty lists allowed)."""
    out = []
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif item is not None:
            out.extend(_flat(item))
    return out


def _copy_into(output, result, what):
    if result is output:
        return  # the engine wrote into the caller's tensor
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
# reduce-scatters. Alternating calls outside a backward pass (Join's count
# of the ranks still training, then a joined rank's shadow allreduce) keep
# their names every round.
#
# A name is reused once the collective that last had it has completed on this
# rank: should it still be in flight (a pattern such as A, B, A of async
# calls), the call waits for it first. That cannot deadlock: every rank
# issued the earlier collective before this one, so it completes without
# this rank's later calls.
# <n> wraps at this: a long run of one shape reuses its names. As large as
# the response cache's default capacity (a longer run evicts its own names
# anyway): a wrapped name still in flight makes the call wait, which stops the
# engine fusing the rest of the run.
_RUN_LIMIT = 1024
_WAIT_SLICE_SECONDS = 0.2  # a waiting thread comes back from C this often (Ctrl-C)
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
    """The engine names of one group's collectives (see above); with
    ``check_set`` (TORCH_DISTRIBUTED_DEBUG=DETAIL), each collective is first
    checked to be the same on every rank of that process set."""

    def __init__(self, group, check_set=None):
        self._group = group     # the group's tag
        self._prefix = f"c10d.{group}"
        self._check_set = check_set
        self._checked = 0       # collectives checked so far
        self._lock = threading.Lock()
        self._last = None       # <what> of the previous call
        self._run = 0
        self._task = -1         # autograd graph task of the previous call (-1: none)
        self._in_flight = {}    # name -> engine handle ids of its latest collective
        self._generation = _engine_generation[0]

    def check(self, call, what=None):
        """Where checks are on, raises TensorMismatchError on every rank of the
        group unless each rank's next collective is the same ``call`` (the
        torch.distributed function, with its root) of the same ``what``. torch's
        TORCH_DISTRIBUTED_DEBUG=DETAIL wraps gloo and NCCL groups to compare
        each collective's operation, dtypes and shapes first; this group is
        not a backend torch can wrap, so it compares here: ``what`` holds
        exactly what the engine needs the ranks to agree on, ``call`` what
        torch's check compares besides (reduce and all_reduce are one
        allreduce to the engine). Without it such a desync stalls until the
        stall inspector ends it."""
        if self._check_set is None:
            return
        mine = call if what is None else f"{call} ({what})"
        with self._lock:
            self._checked += 1
            number = self._checked
        every = objects.allgather_object(mine, name=f"{self._prefix}.check",
                                         process_set=self._check_set)
        if all(c == mine for c in every):
            return
        calls = {}
        for group_rank, c in enumerate(every):
            calls.setdefault(c, []).append(group_rank)
        raise exceptions.TensorMismatchError(
            f"TORCH_DISTRIBUTED_DEBUG=DETAIL: the ranks of group {self._group} "
            f"make different collectives as its collective {number}: "
            + "; ".join(f"ranks {ranks} {c}" for c, ranks in calls.items())
            + " (in parentheses the engine's operation, reduce op or root, dtype and shape). Every "
            "rank of a group must make the same collectives in the same order, with the same "
            "dtypes and shapes")

    def start(self, call, parts):
        """Submits the engine collectives ``parts``, ``[(what, submit)]``, of
        one torch.distributed ``call``: each ``submit(name)`` under the next
        name for its ``what``. Checked as one, so ranks that pass different
        numbers of tensors to a coalesced call differ too. Returns the handles."""
        if self._check_set is not None:  # no joined names on DDP's path unless checking
            self.check(call, "; ".join(what for what, _ in parts) or None)
        return [self._submit(what, submit) for what, submit in parts]

    def _submit(self, what, submit):
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


def _on_completion_thread():
    return _completions is not None and threading.current_thread() is _completions._thread


def _watch(work, ids):
    global _completions
    if _completions is None:
        with _completions_lock:
            if _completions is None:
                _completions = _Completions()
    _completions.watch(work, ids)


def _cuda_devices(tensors):
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}
    return sorted(devices, key=lambda d: d.index)


class HvdliteWork(OutcomeWork):
    """A c10d Work over hvdlite handles; ``finish(results)`` (once, on
    whichever thread gets there first) writes the results where c10d wants
    them and returns the future's value. ``timeout``: the group's, what
    ``wait()`` without one waits at most (c10d_work.py).

    CUDA tensors (``tensors``: the collective's inputs and outputs): the
    executor's results are ordered after its NCCL work on the stream current
    in the thread that finishes; the future is a CUDA one of their devices,
    so completing it records events on that thread's streams, and its waiters
    (``wait()``, ``then()`` callbacks, DDP's reducer) wait on those events on
    their own streams."""

    def __init__(self, handles, finish, what, timeout=None, tensors=()):
        self._devices = _cuda_devices(tensors)
        super().__init__(what, timeout, self._devices)
        self._handles = handles
        self._finish = finish
        self._ids = [i for h in handles for i in _engine_ids(h)]
        self._lock = threading.Lock()
        self._remaining = 0
        self._watched = False   # the engine's callbacks are asked for by get_future()

    def _complete(self):
        if self._outcome is None:
            self._settle_with(lambda: self._finish(request.wait_all(self._handles)))

    def wait(self, timeout=timedelta(0)):
        """Blocks until the collective completed and its results are in place,
        at most ``timeout``, or the group's timeout where that is 0 (c10d's
        default); HvdliteTimeoutError after that (the collective goes on)."""
        limit, words = self._wait_limit(timeout)
        if limit > 0 and self._outcome is None:
            deadline = time.monotonic() + limit
            for i in self._ids:
                # 1 done, -1 already collected by another thread, 0 not yet.
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._timed_out(words)
                    if _binding.lib.hvd_wait(i, min(left, _WAIT_SLICE_SECONDS)) != 0:
                        break
        self._complete()
        self._raise_outcome()
        if self._devices:
            self._future.wait()   # this thread's current streams wait for the results
        return True

    def get_future(self):
        if _on_completion_thread():
            # Asked from a callback of another work's future (torch's PowerSGD
            # hook waits on the future of the allreduce it starts there): the
            # completion thread would wait on itself, so it finishes this work
            # at once. The engine runs the collective without this thread.
            self._complete()
            return self._future
        with self._lock:
            watch, self._watched = not self._watched and self._outcome is None, True
        if watch:
            _watch(self, list(self._ids))
        return self._future


# ---------------------------------------------------------------- the process group

class HvdliteProcessGroup(ProcessGroup):
    """A torch.distributed process group whose collectives run on hvdlite's
    engine, over hvdlite's global process set or the process set of its ranks."""

    def __init__(self, store, rank, size, process_set, timeout, group_id=None, comm=None):
        # (torch 2.13: only the (rank, size) constructor makes a Python subclass;
        # (store, rank, size) fails with "not an alias instance".)
        super().__init__(rank, size)
        self._store = store
        self._process_set = process_set
        self._ranks = list(process_set.ranks)   # group rank -> job rank
        self._timeout = timeout
        self._comm = comm       # MPI communicator of the group's messages (c10d_p2p.py)
        self._p2p = None if comm is None else c10d_p2p.PointToPoint(comm, timeout)
        self._group_name = None
        # torch names each group alike on every member ("0" for the default
        # group); the process set tells groups apart where it does not.
        tag = group_id if group_id else f"set{process_set.process_set_id}"
        detail = dist.get_debug_level() == dist.DebugLevel.DETAIL
        self._names = _Names(tag, process_set if detail else None)

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

    def _work(self, handles, finish, what, *tensors):
        """The Work of ``handles``; ``tensors``: the collective's inputs and
        outputs, single tensors or lists (lists of lists)."""
        return HvdliteWork(handles, finish, what, self._timeout, _flat(tensors))

    def _allreduce_part(self, tensor, op, prescale=1.0, inplace=True, compression=Compression.none):
        """One named allreduce (hvdlite op), in place or into a new tensor: a
        ``(what, submit)`` for _Names.start."""
        start = mpi_ops.allreduce_async_ if inplace else mpi_ops.allreduce_async
        what = f"allreduce.{_OP_NAMES.get(op, op)}"
        if compression is not Compression.none:
            what += f".{compression.kind}"
        what += f".{_dtype(tensor)}.{_shape(tensor.shape)}"
        return what, lambda name: start(
            tensor, name=name, op=op, prescale_factor=prescale, process_set=self._process_set,
            compression=compression)

    def _allreduce_start(self, tensor, op, compression=Compression.none):
        """The handle of one in-place allreduce (the DDP hooks' bucket)."""
        return self._names.start("all_reduce", [self._allreduce_part(
            tensor, op, compression=compression)])[0]

    # ---- allreduce
    def allreduce(self, tensors, opts=None, call="all_reduce"):
        tensors = _tensors(tensors)
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, "allreduce")
        handles = self._names.start(call, [self._allreduce_part(t, op, prescale) for t in tensors])
        return self._work(handles, lambda _results: tensors, "allreduce", tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts, call="all_reduce_coalesced")

    def _root(self, opts, what, argument):
        """The root's rank in this group, checked: every rank checks alike, so
        a bad one fails on all of them at once instead of stalling the rest."""
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self.size():
            raise exceptions.InvalidArgumentError(
                f"{what}: {argument} (the root rank) is {root}, not one of this group's "
                f"{self.size()} ranks (0 to {self.size() - 1})")
        return root

    def reduce(self, tensors, opts=None):
        """The root gets the reduction; other ranks' tensors stay as they were."""
        tensors = _tensors(tensors)
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, "reduce")
        dst = self._root(opts, "reduce", "dst")
        handles = self._names.start(f"reduce(dst={dst})", [
            self._allreduce_part(t, op, prescale, inplace=self.rank() == dst) for t in tensors])
        return self._work(handles, lambda _results: tensors, "reduce", tensors)

    # ---- broadcast
    def broadcast(self, tensors, opts=None):
        tensors = _tensors(tensors)
        root = self._ranks[self._root(opts, "broadcast", "src")]
        handles = self._names.start("broadcast", [(
            f"broadcast.{root}.{_dtype(t)}.{_shape(t.shape)}",
            lambda name, t=t: mpi_ops.broadcast_async_(t, root, name=name,
                                                       process_set=self._process_set))
            for t in tensors])
        return self._work(handles, lambda _results: tensors, "broadcast", tensors)

    # ---- allgather
    def _gather_flat(self, call, inputs, outputs=()):
        """``outputs[i]`` (optional): a tensor the engine may gather input i
        into, when it holds exactly the result (all_gather_into_tensor)."""
        outputs = list(outputs) + [None] * (len(inputs) - len(outputs))
        # Ranks may send different numbers of elements: the name has the dtype only.
        return self._names.start(call, [(
            f"allgather.{_dtype(t)}",
            lambda name, t=t, o=o: mpi_ops._allgather_async(t.reshape(-1), name, self._process_set, o))
            for t, o in zip(inputs, outputs)])

    def allgather(self, output_lists, inputs, opts=None):
        inputs = _tensors(inputs)

        def finish(results):
            for outputs, result in zip(output_lists, results):
                _split_into(outputs, result, "allgather")
            return output_lists
        return self._work(self._gather_flat("all_gather", inputs), finish, "allgather", output_lists,
                          inputs)

    allgather_coalesced = allgather

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        outputs, inputs = _tensors(outputs), _tensors(inputs)

        def finish(results):
            for output, result in zip(outputs, results):
                _copy_into(output, result, "all_gather_into_tensor")
            return outputs
        return self._work(self._gather_flat("all_gather_into_tensor", inputs, outputs), finish,
                          "all_gather_into_tensor",
                          outputs, inputs)

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    # c10d's names before torch 2.13 (C++ callers may still use them)
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=None):
        """Every rank gathers (hvdlite has no rooted gather); the root keeps it."""
        inputs = _tensors(inputs)
        dst = self._root(opts, "gather", "dst")
        root = self.rank() == dst

        def finish(results):
            if root:
                for outputs, result in zip(output_lists, results):
                    _split_into(outputs, result, "gather")
            return output_lists if root else []
        return self._work(self._gather_flat(f"gather(dst={dst})", inputs), finish, "gather",
                          output_lists, inputs)

    # ---- reducescatter
    def _reducescatter(self, outputs, stacked, opts, what):
        """``stacked[i]``: one row per rank, each row ``outputs[i]``'s size."""
        op, prescale = _reduce_op(opts if opts is not None else dist.ReduceOp.SUM, what)
        handles = self._names.start(what, [(
            f"reducescatter.{_OP_NAMES.get(op, op)}.{_dtype(s)}.{_shape(s.shape)}",
            lambda name, s=s, o=o: mpi_ops._reducescatter_async(
                s, name, op, self._process_set, prescale, 1.0, Compression.none, output=o))
            for s, o in zip(stacked, outputs)])

        def finish(results):
            for output, result in zip(outputs, results):
                _copy_into(output, result, what)
            return outputs
        return self._work(handles, finish, what, outputs, stacked)

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
    def _alltoall_start(self, call, tensor, splits, output=None):
        """``output``: a tensor the engine may write the received rows into."""
        # The first dimension differs between ranks: the name has the others.
        rest = f".{_shape(tensor.shape[1:])}" if tensor.dim() > 1 else ""
        return self._names.start(call, [(
            f"alltoall.{_dtype(tensor)}{rest}",
            lambda name: mpi_ops._alltoall_async(tensor, splits, name, self._process_set, output))])[0]

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        splits = list(input_split_sizes) or None
        handle = self._alltoall_start("all_to_all_single", input, splits, output)

        def finish(results):
            rows, received = results[0]
            if output_split_sizes and list(output_split_sizes) != received.tolist():
                raise exceptions.InvalidArgumentError(
                    f"{what}: output_split_sizes {list(output_split_sizes)}, but the ranks sent "
                    f"{received.tolist()} rows")
            _copy_into(output, rows, what)
            return [output]
        return self._work([handle], finish, what, output, input)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        """``inputs[j]`` goes to group rank j, ``outputs[j]`` comes from it."""
        flat = torch.cat([t.reshape(-1) for t in inputs])
        handle = self._alltoall_start("all_to_all", flat, [t.numel() for t in inputs])

        def finish(results):
            _split_into(outputs, results[0][0], "alltoall")
            return outputs
        return self._work([handle], finish, "alltoall", outputs, inputs)

    def scatter(self, outputs, input_lists, opts=None):
        """An alltoall in which only the root sends."""
        outputs = _tensors(outputs)
        root = self._root(opts, "scatter", "src")
        if self.rank() == root:
            flat = torch.cat([t.reshape(-1) for t in input_lists[0]])
            splits = [t.numel() for t in input_lists[0]]
        else:
            flat = outputs[0].new_empty(0)
            splits = [0] * self.size()
        handle = self._alltoall_start(f"scatter(src={root})", flat, splits)

        def finish(results):
            _copy_into(outputs[0], results[0][0], "scatter")
            return outputs
        return self._work([handle], finish, "scatter", outputs, input_lists)

    # ---- control
    def barrier(self, opts=None):
        self._names.check("barrier")
        handle = _binding.enqueue(**collectives.barrier_request(self._process_set))
        return self._work([handle], lambda _results: None, "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """torch's ``dist.monitored_barrier`` (which hvdlite.torch lets through
        for this backend): see c10d_p2p.PointToPoint.monitored_barrier."""
        self._point_to_point("monitored_barrier").monitored_barrier(
            self.rank(), timeout, wait_all_ranks)

    # ---- point to point (c10d_p2p.py): group ranks, c10d's tags
    def _point_to_point(self, what):
        if self._p2p is None:
            raise exceptions.InvalidArgumentError(
                f"{what}: this hvdlite group has no communicator of its own "
                "(it was destroyed, or made without one)")
        return self._p2p

    def send(self, tensors, dstRank, tag=0):
        return self._point_to_point("send").send(_tensors(tensors), dstRank, tag)

    def recv(self, tensors, srcRank, tag=0):
        return self._point_to_point("recv").recv(_tensors(tensors), srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._point_to_point("recv").recv_anysource(_tensors(tensors), tag)

    def shutdown(self):
        """destroy_process_group(): frees the group's communicator; the
        engine stays (it belongs to hvdlite, which stops it at exit or at
        hvdlite.shutdown())."""
        comm, self._comm, self._p2p = self._comm, None, None
        c10d_p2p.free_comm(comm)

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


def _start_engine(group_size, group_rank, timeout):
    if not basics.is_initialized():
        if group_size > 1 and not hvdlite_torch_plugin.launched_by_mpi():
            raise _launch_error(group_size, group_rank, "this process was not started by an MPI "
                                "launcher")
        rendezvous.start_engine(timeout)


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
    _start_engine(size, rank, getattr(backend_options, "timeout", None))
    group_id = getattr(backend_options, "group_id", None)
    process_set = _process_set(ranks, rank, size, group_id)
    comm = c10d_p2p.make_comm(None if process_set is global_process_set else process_set.ranks)
    return HvdliteProcessGroup(backend_options.store, rank, size, process_set,
                               backend_options.timeout, group_id, comm)


def register():
    """Registers the "hvdlite" backend with torch.distributed (torch's entry
    point may have done it: hvdlite_torch_plugin), lets ``env://`` take what
    it lacks from MPI, and ties the backend to the engine (once); returns
    whether torch.distributed is there."""
    if not dist.is_available():
        return False
    hvdlite_torch_plugin.register_backend()
    if not _registered[0]:
        _registered[0] = True
        basics.add_engine_hooks(_engine_started, lambda: None)
        _let_monitored_barrier_through()
    return True


_registered = [False]


def _let_monitored_barrier_through():
    """torch's ``dist.monitored_barrier`` refuses every backend but gloo
    before it asks the group; for a group of this backend it asks the group
    (HvdliteProcessGroup.monitored_barrier), for any other it is torch's
    own. Replaced once, in torch.distributed and its distributed_c10d
    module; a script that imported the function before hvdlite.torch keeps
    torch's."""
    original = distributed_c10d.monitored_barrier
    if getattr(original, "hvdlite", False):
        return

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = distributed_c10d._get_default_group() if group is None else group
        if not distributed_c10d._rank_not_in_group(group) and isinstance(pg, HvdliteProcessGroup):
            return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return original(group, timeout, wait_all_ranks)
    monitored_barrier.hvdlite = True
    distributed_c10d.monitored_barrier = monitored_barrier
    if getattr(dist, "monitored_barrier", None) is original:
        dist.monitored_barrier = monitored_barrier
