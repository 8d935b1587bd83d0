"""Collectives on device tensors: the engine agrees, torch.distributed runs them.

The engine treats a device tensor like any other (queue, negotiation, response
cache, fusion decisions, stall inspection, timeline) but never touches its
memory: it hands each agreed group to this module's executor thread as a job
(csrc/ops/device_jobs.h), in the same order on every rank. The executor runs the
job with torch.distributed's collectives on a process group of its own for the
job's process set: NCCL for CUDA tensors (on its own stream, after the stream
that produced the tensor), gloo for CPU tensors routed here with
HVDLITE_DEVICE_TRANSPORT=gloo (how CI runs this whole path without a GPU).
Fusion (one flat buffer per allreduce job), pre/post scaling, Average, fp16
compression and top-k with error feedback happen here with torch ops on the
tensor's device.

The executor's groups are c10d backends (ProcessGroupNCCL, ProcessGroupGloo)
that it constructs on a store of its own (rendezvous.mpi_tcp_store), outside
torch.distributed's registry of groups: it neither makes nor uses
torch.distributed's default group. So a script's own ``init_process_group``
works before or after hvdlite.init() (backend="hvdlite" too, whose creator
may start hvdlite, and with it this executor, before torch has set the
default group), ``destroy_process_group()`` leaves the executor's groups
alone, and the script's collectives never interleave with the executor's on
one group. The group of every rank is made at start (every rank is in init()
then); a process set's group at the set's first job, on the executor thread
(every member takes the jobs in the same order).

HVDLITE_DEVICE_TRANSPORT:

=========  ==================================================================
auto       (default) CUDA tensors: NCCL when torch has it and every rank of
           the host has a GPU of its own, else host staging. CPU tensors: the
           engine, as always.
nccl       CUDA tensors through NCCL (an error at init if unavailable)
gloo       CPU tensors through the executor on c10d's gloo (tests, CI)
host       host staging for every tensor the executor would take (tests)
=========  ==================================================================

Host staging copies a device tensor to host memory, runs the engine's own
path, and copies the result back.
"""
import itertools
import json
import math
import os
import sys
import threading
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from hvdlite import _binding, basics, engine_control, exceptions
from hvdlite.request import Average, Max, Min, Product, Sum

from .rendezvous import mpi_tcp_store

MODE_VAR = "HVDLITE_DEVICE_TRANSPORT"
MODES = ("auto", "nccl", "gloo", "host")
_TORCH_DTYPES = {code: getattr(torch, name) for name, code in _binding.DTYPE_CODES.items()
                 if isinstance(getattr(torch, name, None), torch.dtype)}
_C10D_OPS = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
             Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}
_FP16, _TOPK, _BF16 = (_binding.COMPRESSION_CODES[name] for name in ("fp16", "topk", "bf16"))
_EXECUTED_COMPRESSIONS = (_binding.COMPRESSION_CODES["none"], _FP16, _TOPK, _BF16)
# Neither gloo nor NCCL has 16-bit integers: they are reduced as int32 and
# moved as bytes.
_NO_WIRE_TYPE = (torch.int16, torch.uint16)
_NEXT_JOB_WAIT_S = 0.2      # the executor checks for a stop this often while idle

_executor = None
_lock = threading.Lock()
_staging_all = False    # mode "host", read at start(): needs_staging runs once per tensor
# What went where, for users and tests: jobs the executor ran, tensors staged.
counts = {"device_jobs": 0, "staged": 0}


def mode():
    value = os.environ.get(MODE_VAR, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise exceptions.InvalidArgumentError(
            f"{MODE_VAR}={value!r}: expected one of {', '.join(MODES)}")
    return value


def nccl_usable():
    """NCCL can run this job's CUDA tensors: torch has it, and each rank of
    this host has a GPU of its own (NCCL refuses two ranks on one GPU)."""
    return (torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()
            and basics.local_size() <= torch.cuda.device_count())


def start():
    """After hvdlite.init(): starts the executor where this job needs one
    (collective: every rank decides the same from the same settings)."""
    global _executor, _staging_all
    m = mode()
    _staging_all = m == "host"
    backend = None
    if m == "gloo":
        backend = "gloo"
    elif m == "nccl" or (m == "auto" and torch.cuda.is_available()):
        if nccl_usable():
            backend = "nccl"
        elif m == "nccl":
            raise exceptions.InvalidArgumentError(
                f"{MODE_VAR}=nccl, but NCCL cannot run here (torch.cuda.is_available()="
                f"{torch.cuda.is_available()}, NCCL in torch: {dist.is_available() and dist.is_nccl_available()}, "
                f"{basics.local_size()} ranks on this host for {torch.cuda.device_count()} GPUs)")
    with _lock:
        if _executor is not None and _executor.alive():
            return _executor
        _executor = None
        if backend:
            try:
                _executor = DeviceExecutor(backend).start()
            except exceptions.InvalidArgumentError as e:
                if m != "auto":
                    raise
                # Asked for nothing in particular: CUDA tensors still work, staged.
                sys.stderr.write("hvdlite: CUDA tensors will be copied through host memory: %s\n" % e)
        return _executor


def _reset_compression():
    ex = _executor
    if ex is not None:
        ex.reset_compression()


def stop():
    """After the engine stopped: the executor's thread has nothing left to
    take; wait for it to end (it tears its process group down)."""
    ex = _close()
    if ex is not None and ex._thread is not None and ex._thread is not threading.current_thread():
        ex._thread.join(timeout=30)


def abandon():
    """After hvdlite.abandon(): as stop(), without waiting. The thread may be
    in a collective that waits for the lost peer (gloo waits until the peer's
    socket closes or the group's timeout); it ends by itself then, and its
    jobs have failed already."""
    _close()


def _close():
    global _executor
    with _lock:
        ex, _executor = _executor, None
    if ex is not None:
        ex.close()
    return ex


def executor_for(tensor):
    """The executor that takes ``tensor``, or None (the engine's own path)."""
    ex = _executor
    if ex is None or not ex.alive():
        return None
    if ex.backend == "nccl":
        return ex if tensor.is_cuda else None
    return ex if tensor.device.type == "cpu" else None


_staging = threading.local()


class staging:
    """While a host copy is enqueued: it goes to the engine as it is."""

    def __enter__(self):
        _staging.active = True
        counts["staged"] += 1

    def __exit__(self, *exc):
        _staging.active = False


def needs_staging(tensor):
    """A tensor no executor takes and the engine cannot (or, in the "host"
    test mode, should not) read directly."""
    if getattr(_staging, "active", False):
        return False
    if tensor.device.type != "cpu":
        return executor_for(tensor) is None
    return _staging_all


def executes(spec):
    """Whether the executor implements the engine compression ``spec`` (the
    plain kinds); compressors with options (top-k's momentum correction,
    warm-up or clipping, PowerSGD) keep state in the engine, so a device
    tensor that uses them is staged through host memory instead."""
    code, _ratio, _error_feedback, config = spec
    return config == 0 and code in _EXECUTED_COMPRESSIONS


def backend_name():
    ex = _executor
    return ex.backend if ex is not None and ex.alive() else None


class _Pending:
    __slots__ = ("input", "output", "result", "ready", "done")

    def __init__(self, input_tensor, output):
        self.input = input_tensor
        self.output = output
        self.result = None
        self.ready = None       # CUDA: the producer stream's event the executor waits for
        self.done = None        # CUDA: the executor stream's event the consumer waits for


class DeviceExecutor:
    """One thread that takes the engine's device jobs in order and runs them."""

    def __init__(self, backend):
        self.backend = backend
        self._tokens = itertools.count(1)
        self._pending = {}
        self._store = None
        self._timeout = None
        self._world = None      # the group of every rank (process set 0)
        self._groups = {}       # (process set id, its ranks) -> group
        self._residuals = {}    # top-k error feedback: tensor name -> residual
        self._thread = None
        self._streams = {}      # CUDA device -> the executor's stream on it
        self._last_device = None
        # Held while the thread takes or reports a job: once closed, it never
        # reaches the engine again. The engine of a later init() would
        # otherwise hand its jobs to a thread still on the old groups, or
        # take this one's report for a job of its own (ids restart per engine).
        self._gate = threading.Lock()
        self._closed = False

    # ---- set-up -----------------------------------------------------------------
    def start(self):
        self._make_world()
        _binding.check(_binding.lib.hvd_device_enable(self.backend.encode()))
        self._thread = threading.Thread(target=self._loop, name="hvdlite-device", daemon=True)
        self._thread.start()
        return self

    def _make_world(self):
        """The store and the group of every rank (collective: at init())."""
        if self.backend == "gloo" and basics.local_size() == basics.size():
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # one host: nothing beyond loopback
        self._store = mpi_tcp_store(timedelta(seconds=60), name="hvdlite.device.rendezvous")
        seconds = float(os.environ.get("HVDLITE_TIMEOUT_SECONDS") or 0) or 600.0
        self._timeout = timedelta(seconds=seconds)
        self._world = self._new_group("world", list(range(basics.size())))

    def _new_group(self, tag, ranks):
        """A c10d backend of ``ranks`` (job ranks, this one among them) on the
        executor's store (collective over ``ranks``)."""
        store = dist.PrefixStore(f"hvdlite.device/{tag}/", self._store)
        rank, size = ranks.index(basics.rank()), len(ranks)
        name = f"hvdlite.device.{tag}"
        if self.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = False
            options._timeout = self._timeout
            options.global_ranks_in_group = ranks
            options.group_name = name
            group = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            group = dist.ProcessGroupGloo(store, rank, size, timeout=self._timeout)
            options = getattr(group, "options", None)
            if options is not None:
                options.global_ranks_in_group = ranks
                options.group_name = name
        group._set_sequence_number_for_group()
        return group

    def alive(self):
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def close(self):
        """The engine stopped (every job it gave failed with it): take and
        report no further job, whichever engine runs next."""
        with self._gate:
            self._closed = True

    def _group(self, job):
        pid = job["process_set"]
        if pid == 0:
            return self._world
        ranks = tuple(_set_ranks(pid))   # an id can come back for other ranks after a removal
        group = self._groups.get((pid, ranks))
        if group is None:
            tag = "set%d.%s" % (pid, "-".join(map(str, ranks)))
            group = self._groups[(pid, ranks)] = self._new_group(tag, list(ranks))
        return group

    def _shutdown_groups(self):
        groups = list(self._groups.values()) + ([self._world] if self._world is not None else [])
        self._groups.clear()
        self._world = None
        for group in groups:
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - a peer may be gone already
                pass
        self._store = None

    # ---- submitting (user threads) --------------------------------------------------
    def submit(self, req, src, output=None):
        """Enqueues request ``req`` (:mod:`hvdlite.collectives`) of ``src`` as
        a device tensor; the handle's result is what the executor leaves in
        the pending record (``output`` when given)."""
        token = next(self._tokens)
        pending = _Pending(src, output)
        if src.is_cuda:
            self._last_device = src.device
            pending.ready = torch.cuda.Event()
            pending.ready.record(torch.cuda.current_stream(src.device))
        self._pending[token] = pending

        def finish(_handle_id):
            if pending.done is not None:  # the consumer's stream waits for the collective
                torch.cuda.current_stream(src.device).wait_event(pending.done)
            return pending.result

        try:
            return _binding.enqueue(input_ptr=token, device=1, keep=(src, output), finish=finish,
                                    **req)
        except BaseException:
            self._pending.pop(token, None)
            raise

    # ---- the executor thread ------------------------------------------------------------
    def _loop(self):
        lib, ffi = _binding.lib, _binding.ffi
        status = ffi.new("int *")
        try:
            while True:
                with self._gate:
                    # Closed: the engine's queue is too, so a wait here is short.
                    if self._closed:
                        return
                    text = lib.hvd_device_next_job(_NEXT_JOB_WAIT_S, status)
                if status[0] == 0:
                    continue
                if status[0] < 0:
                    return
                try:
                    job = json.loads(ffi.string(text).decode())
                finally:
                    lib.hvd_free_output(text)
                self._run(job)
        finally:
            self._pending.clear()
            self._shutdown_groups()

    def _run(self, job):
        lib = _binding.lib
        try:
            entries = [(e, self._pending.pop(e["token"], None) if e["token"] else None)
                       for e in job["entries"]]
            run = getattr(self, "_" + job["op"])
            if self.backend == "nccl":
                # The CUDA current device is per thread: take the tensors'.
                cuda = next((p.input.device for _, p in entries if p is not None), None) or \
                    self._last_device or torch.device("cuda", basics.local_rank() % torch.cuda.device_count())
                with torch.cuda.device(cuda):
                    stream = self._streams.get(cuda)
                    if stream is None:
                        stream = self._streams[cuda] = torch.cuda.Stream(cuda)
                    with torch.cuda.stream(stream):
                        for _, p in entries:
                            if p is not None and p.ready is not None:
                                stream.wait_event(p.ready)
                        run(job, entries)
                        for _, p in entries:
                            if p is not None:
                                p.done = torch.cuda.Event()
                                p.done.record(stream)
            else:
                run(job, entries)
            counts["device_jobs"] += 1
            self._report(job["id"], 0, _binding.ffi.NULL)
        except Exception as e:  # noqa: BLE001 - reported to every waiting handle
            kind = lib.HVD_ERROR_SHUTDOWN if isinstance(e, (RuntimeError, dist.DistBackendError)) \
                else lib.HVD_ERROR_INTERNAL
            message = "device %s (%s) failed: %s: %s" % (job["op"], self.backend, type(e).__name__, e)
            if os.environ.get("HVDLITE_DEVICE_DEBUG"):
                traceback.print_exc()
            self._report(job["id"], kind, message.encode(errors="replace"))

    def _report(self, job_id, kind, message):
        with self._gate:
            if not self._closed:
                _binding.lib.hvd_device_job_done(job_id, kind, message)

    # ---- the collectives ------------------------------------------------------------------
    def _device(self):
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def _input(self, e, p):
        """The entry's tensor, or the zeros a joined rank contributes."""
        if p is not None:
            return p.input
        return torch.zeros(e["shape"], dtype=_TORCH_DTYPES[e["dtype"]], device=self._device())

    def _allreduce(self, job, entries):
        reduced = self._reduce(job, [(e, self._input(e, p)) for e, p in entries])
        for (e, p), value in zip(entries, reduced):
            if p is None:
                continue
            if p.output is not None:
                p.output.copy_(value.view_as(p.output))
                p.result = p.output
            else:
                p.result = value.reshape(e["shape"])

    def _reduce(self, job, tensors):
        """Flat results of an allreduce of ``tensors`` [(entry, tensor)], each
        in its own dtype: 16-bit floats summed in float32 and rounded once,
        integers in their own type, prescale before and postscale (and
        Average's 1/size) after, as the engine does."""
        op, size = job["reduce_op"], job["set_size"]
        dtype = tensors[0][1].dtype
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else \
            torch.int32 if dtype in _NO_WIRE_TYPE else dtype
        floating = acc.is_floating_point
        flats = []
        for e, t in tensors:
            x = t.detach().reshape(-1).to(acc)
            if e["prescale"] != 1.0:
                x = x * e["prescale"] if floating else (x.double() * e["prescale"]).to(acc)
            flats.append(x)
        sizes = [x.numel() for x in flats]
        buf = torch.cat(flats) if len(flats) > 1 else flats[0].clone()
        group = self._group(job)
        compression = job["compression"]
        if compression == _TOPK:
            buf = self._topk_allreduce(job, tensors, buf, sizes, group)
        elif compression in (_FP16, _BF16) and floating:
            wire = buf.half() if compression == _FP16 else buf.bfloat16()
            _all_reduce(wire, dist.ReduceOp.SUM, group)
            buf = wire.to(acc)
        else:
            _all_reduce(buf, _C10D_OPS[op], group)
        out = []
        for (e, t), piece in zip(tensors, torch.split(buf, sizes)):
            factor = e["postscale"] / size if op == Average else e["postscale"]
            if factor != 1.0:
                piece = piece * factor if floating else (piece.double() * factor).to(acc)
            out.append(piece.to(dtype))
        return out

    def _topk_allreduce(self, job, tensors, buf, sizes, group):
        """Each tensor keeps its k largest magnitudes (k = ratio x size, at
        least 1) plus, with error feedback, what it left out last time; the
        ranks allgather (index, value) and sum them."""
        ratio, feedback = job["topk_ratio"], job["error_feedback"]
        n_ranks = job["set_size"]
        dense = torch.zeros_like(buf)
        offset = 0
        for (e, _), n in zip(tensors, sizes):
            x = buf[offset:offset + n]
            if feedback:
                residual = self._residuals.get(e["name"])
                if residual is not None and residual.numel() == n:
                    x = x + residual
            k = _binding.lib.hvd_topk_count(n, ratio)
            index = torch.topk(x.abs(), k, sorted=False).indices
            values = x[index]
            if feedback:
                kept = torch.zeros_like(x)
                kept[index] = values
                self._residuals[e["name"]] = x - kept
            indices = [torch.empty_like(index) for _ in range(n_ranks)]
            gathered = [torch.empty_like(values) for _ in range(n_ranks)]
            _all_gather(indices, index, group)
            _all_gather(gathered, values, group)
            dense[offset:offset + n].index_add_(0, torch.cat(indices), torch.cat(gathered))
            offset += n
        return dense

    def reset_compression(self):
        self._residuals.clear()

    def _broadcast(self, job, entries):
        (e, p), = entries
        out = p.output if p is not None else self._input(e, None)
        if job["set_rank"] == job["root"] and p is not None and out.data_ptr() != p.input.data_ptr():
            out.copy_(p.input)
        wire = _as_wire(out)
        _broadcast(wire, job["root"], self._group(job))   # the root's rank in the set
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire.view(out.dtype).view_as(out))
        if p is not None:
            p.result = out

    def _allgather(self, job, entries):
        (e, p), = entries
        t = self._input(e, p).reshape(e["shape"])  # the engine's shape: a scalar is one row
        rows = job["rows"]
        trailing = list(t.shape[1:])
        most = max(rows)
        padded = torch.zeros([most] + trailing, dtype=t.dtype, device=t.device)
        padded[:t.shape[0]] = t
        wire = _as_wire(padded)
        parts = [torch.empty_like(wire) for _ in rows]
        _all_gather(parts, wire, self._group(job))
        if p is not None:
            p.result = torch.cat([part.view(t.dtype).reshape([most] + trailing)[:r]
                                  for part, r in zip(parts, rows)])

    def _reducescatter(self, job, entries):
        (e, p), = entries
        t = self._input(e, p)
        full = self._reduce(job, [(e, t)])[0].reshape(t.shape)
        rows, me = job["rows"], job["set_rank"]
        start = sum(rows[:me])
        if p is not None:
            p.result = full[start:start + rows[me]].clone()

    def _alltoall(self, job, entries):
        (e, p), = entries
        t = self._input(e, p)
        n, me = job["set_size"], job["set_rank"]
        matrix = job["splits"]
        send = [matrix[me * n + j] for j in range(n)]
        receive = [matrix[j * n + me] for j in range(n)]
        out = torch.empty([sum(receive)] + list(t.shape[1:]), dtype=t.dtype, device=t.device)
        # Rows cross whole, so a byte view of each row is the same split.
        _all_to_all(_as_wire(out), _as_wire(t), receive, send, self._group(job))
        if p is not None:
            p.result = (out, torch.tensor(receive, dtype=torch.int32))


def _as_wire(t):
    """``t`` as a tensor the backends can move: 16-bit integers as a
    [rows, bytes per row] uint8 view (rows stay rows, for splits)."""
    if t.dtype not in _NO_WIRE_TYPE:
        return t
    rows = t.shape[0] if t.dim() else 1
    per_row = math.prod(t.shape[1:]) if t.dim() else 1
    return t.contiguous().reshape(rows, per_row).view(torch.uint8)


def _set_ranks(pid):
    ranks = _binding.ffi.new("int32_t[]", basics.size())
    n = _binding.check(_binding.lib.hvd_process_set_ranks(pid, ranks, basics.size()))
    return [ranks[i] for i in range(n)]


# ---- the collectives on one of the executor's groups: what torch.distributed's
# functions of the same names do with async_op=False, called on the backend
# itself (the groups are not in torch.distributed's registry); ranks are the
# group's own.

def _options(kind, **fields):
    opts = getattr(_c10d, kind)()
    for name, value in fields.items():
        setattr(opts, name, value)
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    return opts


def _wait(work):
    if work is not None:
        work.wait()


def _all_reduce(tensor, op, group):
    _wait(group.allreduce([tensor], _options("AllreduceOptions", reduceOp=op)))


def _broadcast(tensor, root, group):
    _wait(group.broadcast([tensor], _options("BroadcastOptions", rootRank=root, rootTensor=0)))


def _all_gather(outputs, tensor, group):
    _wait(group.allgather([outputs], [tensor], _options("AllgatherOptions")))


def _all_to_all(output, tensor, output_splits, input_splits, group):
    _wait(group.alltoall_base(output, tensor, output_splits, input_splits,
                              _options("AllToAllOptions")))


engine_control.reset_hooks.append(_reset_compression)

__all__ = ["start", "stop", "abandon", "executor_for", "needs_staging", "backend_name", "nccl_usable", "mode", "counts"]
