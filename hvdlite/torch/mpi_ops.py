"""Horovod's collectives on torch tensors.

Every call hands the tensor's address, dtype and shape to the engine; nothing
is negotiated, fused or compressed in Python. What the arguments mean (ops,
dtypes, factors, splits, sparse rules) is decided by :mod:`hvdlite.request`,
shared with the NumPy and TensorFlow front ends. Contiguous CPU tensors travel
without copies: allreduce and broadcast write straight into the output (or,
for the ``*_`` in-place forms, into the tensor itself); allgather, alltoall and
reducescatter results live in engine-allocated memory that the returned tensor
wraps.

The synchronous out-of-place forms are autograd functions, so a tensor that
requires grad gets a gradient through them, with Horovod's rules
(:mod:`hvdlite.collectives` describes each collective and its rule once).
"""
import torch

import hvdlite
from hvdlite import _binding, collectives, exceptions, request
from hvdlite.compression import Compression
from hvdlite.process_sets import global_process_set, process_set_id
from hvdlite.request import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (public names)

from . import device

_DTYPE_CODES = {
    getattr(torch, name): code for name, code in _binding.DTYPE_CODES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


# ---------------------------------------------------------------- checks

def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _check_tensor(tensor, what):
    """Returns the engine dtype code, or raises a clear error."""
    if not isinstance(tensor, torch.Tensor):
        raise exceptions.InvalidArgumentError(
            f"{what} takes a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise exceptions.InvalidArgumentError(
            f"{what}: the tensor is on {tensor.device}; hvdlite takes CPU tensors and CUDA tensors "
            "(through NCCL, or copied to the host); move it with tensor.cpu()")
    if tensor.layout != torch.strided:
        raise exceptions.InvalidArgumentError(
            f"{what}: {tensor.layout} tensors are not supported; pass a dense tensor "
            "(tensor.to_dense()), or use sparse_allreduce_async for sparse COO tensors")
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        code = request.dtype_code(_dtype_name(tensor.dtype), what)
    return code


def _resolve_op(op, average, what):
    return request.resolve_op(op, average, what)


def _check_reduce(tensor, op, what):
    code = _check_tensor(tensor, what)
    request.check_reduction(op, _dtype_name(tensor.dtype), what)
    return code


def _set_root(root_rank, process_set, what):
    """Horovod's root_rank is a global rank; the engine wants the position in the set."""
    return request.root_in_set(root_rank, process_set, what)


_set_size = request.set_size
_set_rank = request.set_rank


class _TorchTensors(collectives.Adapter):
    def dtype_code(self, tensor, what):
        return _check_tensor(tensor, what)

    def address(self, tensor):
        return tensor.data_ptr()

    def wrap(self, owned, nbytes, shape, dtype):
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        # torch.frombuffer keeps the buffer alive, which keeps the engine's memory.
        return torch.frombuffer(_binding.ffi.buffer(owned, nbytes), dtype=dtype).view(shape)

    def int_vector(self, values):
        return torch.tensor(values, dtype=torch.int32)


_TENSORS = _TorchTensors()


def _engine_tensor(dtype):
    """finish= callback: wraps the engine-allocated result without a copy."""
    return collectives.engine_output(_TENSORS, dtype)


def _result_into(output, dtype):
    """submit()'s arguments for a result the engine may write into the caller's
    ``output`` (torch.distributed's output tensors): its size, and a finish=
    that returns it when the engine did (the result was exactly that long)
    and the engine-allocated result otherwise. None where the engine cannot
    write into it (not a contiguous CPU tensor of the result's dtype)."""
    if (output is None or output.device.type != "cpu" or output.dtype != dtype or
            not output.is_contiguous() or output.numel() == 0):
        return None
    nbytes = output.numel() * output.element_size()
    return dict(output=output, output_bytes=nbytes,
                finish=collectives.engine_output_into(_TENSORS, dtype, output, nbytes))


class _Gradients(collectives.GradientOps):
    """The gradient rules' collectives on torch tensors, over one process set.
    ``rows``/``shapes``: the forward inputs' first dimensions and shapes
    (allgather's own_rows)."""

    def __init__(self, process_set, rows=None, shapes=None):
        self.process_set = process_set
        self.rows = rows
        self.shapes = shapes

    def allreduce(self, grads, op, prescale, postscale):
        return grouped_allreduce(list(grads), op=op, prescale_factor=prescale,
                                 postscale_factor=postscale, process_set=self.process_set)

    def allgather(self, grads):
        return [allgather(g.contiguous(), process_set=self.process_set) for g in grads]

    def alltoall(self, grad, splits):
        return synchronize(alltoall_async(grad.contiguous(), splits, process_set=self.process_set))[0]

    def own_rows(self, reduced):
        ps = self.process_set
        rows = synchronize(allgather_async(torch.tensor(self.rows, dtype=torch.int64).reshape(1, -1),
                                           process_set=ps))
        offsets = rows[:_set_rank(ps)].sum(dim=0)
        return [g.narrow(0, int(o), n).reshape(shape)
                for g, o, n, shape in zip(reduced, offsets, self.rows, self.shapes)]

    def times(self, grads, factor):
        return [g * factor for g in grads]


# ---------------------------------------------------------------- device tensors

def _staged(tensor, run, target=None):
    """Host staging: ``run`` enqueues a host copy of ``tensor``; the result
    comes back to the tensor's device (into ``target`` for in-place forms)."""
    host = tensor.detach().to("cpu", copy=True)
    with device.staging():
        handle = run(host)

    def back(results):
        result = results[0]
        if isinstance(result, tuple):       # alltoall: (rows, received splits)
            return (result[0].to(tensor.device),) + tuple(result[1:])
        result = result.to(tensor.device)
        if target is None:
            return result
        with torch.no_grad():
            target.copy_(result)
        return target
    return request.GroupHandle([handle], back)


# ---------------------------------------------------------------- handles

_GroupHandle = request.GroupHandle


def poll(handle):
    """True once the collective behind ``handle`` has completed; then
    :func:`synchronize` returns without blocking."""
    request.check_handle(handle, "poll")
    return handle.poll()


def synchronize(handle):
    """Waits for an async collective and returns its result (a tensor, a list
    of tensors for grouped forms, or (tensor, received_splits) for alltoall).
    Raises the collective's error, an :class:`hvdlite.HvdliteError`."""
    request.check_handle(handle, "synchronize")
    return handle.wait()


# ---------------------------------------------------------------- allreduce

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                     compression, what):
    spec, python_compressor = request.split_compression(compression)
    if python_compressor is not None:
        return _python_compressed_allreduce(tensor, output, name, op, prescale_factor,
                                            postscale_factor, process_set, python_compressor,
                                            what)
    code = _check_reduce(tensor, op, what)
    pid = process_set_id(process_set)
    inplace = output is tensor
    ex = device.executor_for(tensor) if op != Adasum and device.executes(spec) else None
    if ex is not None:
        src = tensor.contiguous()
        return ex.submit(collectives.allreduce_request(code, tuple(src.shape), name, op,
                                                       prescale_factor, postscale_factor, spec,
                                                       pid, what), src, output)
    # Adasum and the compressors with engine state run on host memory: a CUDA
    # tensor goes there even with an executor.
    if device.needs_staging(tensor) or (tensor.device.type != "cpu" and ex is None):
        return _staged(tensor, lambda host: _allreduce_async(
            host, host, name, op, prescale_factor, postscale_factor, process_set, compression, what),
            target=output)
    if tensor.is_contiguous():
        src = tensor
    else:
        src = tensor.contiguous()
        if inplace:
            output = src
    if output is None or not output.is_contiguous():
        work = torch.empty_like(src, memory_format=torch.contiguous_format)
    else:
        work = output
    target = tensor if inplace else output
    finish = None
    if target is not None and target is not work:
        def finish(_handle_id):
            with torch.no_grad():
                target.copy_(work)
            return target

    return collectives.allreduce_fast(
        name, code, tuple(src.shape), src.data_ptr(), work.data_ptr(), op,
        request.factor(prescale_factor, "prescale_factor", what),
        request.factor(postscale_factor, "postscale_factor", what), spec, pid,
        (tensor, src, work), work, finish)


def _python_compressed_allreduce(tensor, output, name, op, prescale_factor, postscale_factor,
                                 process_set, compressor, what):
    """A user's compressor (Horovod's compress/decompress interface) wrapped
    around an uncompressed engine allreduce of what compress() returns."""
    _check_tensor(tensor, what)
    compressed, ctx = compressor.compress(tensor)
    handle = _allreduce_async(compressed, None, name, op, prescale_factor, postscale_factor,
                              process_set, None, what)

    def combine(results):
        out = compressor.decompress(results[0], ctx)
        if output is None:
            return out
        with torch.no_grad():
            output.copy_(out)
        return output
    return request.GroupHandle([handle], combine)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set,
                    compression=Compression.none):
    """Starts reducing ``tensor`` over the ranks of ``process_set``; returns a
    handle for :func:`synchronize`, which returns a new tensor. ``tensor`` must
    not be modified until then."""
    op = _resolve_op(op, average, "allreduce_async")
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                            process_set, compression, "allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set,
                     compression=Compression.none):
    """In-place form of :func:`allreduce_async`: ``synchronize`` returns ``tensor``
    itself, holding the result."""
    op = _resolve_op(op, average, "allreduce_async_")
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set, compression, "allreduce_async_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, compression=Compression.none):
    """Reduces ``tensor`` in place over all ranks and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, compression))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set, compression):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(_allreduce_async(tensor, None, name, op, prescale_factor,
                                            postscale_factor, process_set, compression,
                                            "allreduce"))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, ps = ctx.args
        grad, = collectives.allreduce_grad(_Gradients(ps), [grad_output], op, pre, post)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces ``tensor`` over the ranks of ``process_set`` (default: all) with
    ``op`` (Average, Sum, Min, Max, Product) and returns a new tensor of the same
    shape, dtype and device; ``tensor`` is not modified. ``compression``
    (Compression.none, .fp16, .topk(ratio)) runs inside the engine.
    Differentiable: the gradient is the allreduce of the output's gradient."""
    op = _resolve_op(op, average, "allreduce")
    return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, process_set,
                            compression)


_group_names = request.group_names


def _check_group(tensors, what):
    if isinstance(tensors, torch.Tensor) or not hasattr(tensors, "__iter__"):
        raise exceptions.InvalidArgumentError(f"{what} takes a list of tensors")
    return list(tensors)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set,
                            compression=Compression.none):
    """Starts allreduce of every tensor in the list (``name`` is a base name);
    one handle, whose ``synchronize`` returns the list of results."""
    tensors = _check_group(tensors, "grouped_allreduce_async")
    op = _resolve_op(op, average, "grouped_allreduce_async")
    handles = [_allreduce_async(t, None, n, op, prescale_factor, postscale_factor, process_set,
                                compression, "grouped_allreduce_async")
               for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return _GroupHandle(handles)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set,
                             compression=Compression.none):
    """In-place form of :func:`grouped_allreduce_async`."""
    tensors = _check_group(tensors, "grouped_allreduce_async_")
    op = _resolve_op(op, average, "grouped_allreduce_async_")
    handles = [_allreduce_async(t, t, n, op, prescale_factor, postscale_factor, process_set,
                                compression, "grouped_allreduce_async_")
               for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return _GroupHandle(handles)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set,
                       compression=Compression.none):
    """Reduces every tensor in the list in place; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, compression))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, compression,
                *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        handles = [_allreduce_async(t, None, n, op, prescale_factor, postscale_factor,
                                    process_set, compression, "grouped_allreduce")
                   for t, n in zip(tensors, _group_names(name, len(tensors)))]
        return tuple(synchronize(_GroupHandle(handles)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        return (None,) * 6 + tuple(collectives.allreduce_grad(_Gradients(ps), grads, op, pre, post))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """:func:`allreduce` of every tensor in the list; returns a list of new tensors."""
    tensors = _check_group(tensors, "grouped_allreduce")
    op = _resolve_op(op, average, "grouped_allreduce")
    if not tensors:
        return []
    return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                        compression, *tensors))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather; ``synchronize`` returns the concatenation along
    dimension 0 of every rank's tensor (first dimensions may differ)."""
    return _allgather_async(tensor, name, process_set)


def _allgather_async(tensor, name, process_set, output=None):
    """allgather_async; ``output`` (torch.distributed's): where the engine
    writes the result if it fits exactly (_result_into), returned then."""
    code = _check_tensor(tensor, "allgather_async")
    req = collectives.allgather_request(code, tuple(tensor.shape), name, process_set)
    src = tensor.contiguous().reshape(req["shape"])
    ex = device.executor_for(tensor)
    if ex is not None:
        return ex.submit(req, src)
    if device.needs_staging(tensor):
        return _staged(tensor, lambda host: allgather_async(host, name, process_set))
    into = _result_into(output, tensor.dtype) or dict(finish=_engine_tensor(tensor.dtype))
    return collectives.submit(req, _TENSORS, src, keep=(tensor, src, output), **into)


def _rows(tensors):
    return [t.shape[0] if t.dim() else 1 for t in tensors], [t.shape for t in tensors]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.gradients = _Gradients(process_set, *_rows([tensor]))
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad, = collectives.allgather_grad(ctx.gradients, [grad_output])
        return grad, None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along dimension 0; the other
    dimensions must agree. Returns a new tensor; differentiable."""
    _check_tensor(tensor, "allgather")
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of every tensor in the list; one handle."""
    tensors = _check_group(tensors, "grouped_allgather_async")
    return _GroupHandle([allgather_async(t, n, process_set)
                         for t, n in zip(tensors, _group_names(name, len(tensors)))])


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.gradients = _Gradients(process_set, *_rows(tensors))
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + tuple(collectives.allgather_grad(ctx.gradients, grads))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """:func:`allgather` of every tensor in the list; returns a list."""
    tensors = _check_group(tensors, "grouped_allgather")
    if not tensors:
        return []
    for t in tensors:
        _check_tensor(t, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast

def _broadcast_async(tensor, inplace, root_rank, name, process_set, what):
    code = _check_tensor(tensor, what)
    req = collectives.broadcast_request(code, tuple(tensor.shape), name, root_rank, process_set,
                                        what)
    src = tensor if tensor.is_contiguous() else tensor.contiguous()
    if device.needs_staging(tensor):
        return _staged(tensor, lambda host: _broadcast_async(host, True, root_rank, name, process_set, what),
                       target=tensor if inplace else None)
    work = src if inplace else torch.empty_like(src, memory_format=torch.contiguous_format)
    ex = device.executor_for(tensor)
    if ex is not None:
        handle = ex.submit(req, src, work)
        if inplace and work is not tensor:
            return request.GroupHandle([handle], lambda results: tensor.copy_(results[0]))
        return handle
    finish = None
    if inplace and work is not tensor:
        def finish(_handle_id):
            with torch.no_grad():
                tensor.copy_(work)
            return tensor
    return collectives.submit(req, _TENSORS, src, output=work, keep=(tensor, src, work),
                              finish=finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of ``root_rank``'s tensor (a global rank);
    ``synchronize`` returns a new tensor."""
    return _broadcast_async(tensor, False, root_rank, name, process_set, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place form of :func:`broadcast_async`: non-root ranks' ``tensor`` is overwritten."""
    return _broadcast_async(tensor, True, root_rank, name, process_set, "broadcast_async_")


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with ``root_rank``'s value on every rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(_broadcast_async(tensor, False, root_rank, name, process_set,
                                            "broadcast"))

    @staticmethod
    def backward(ctx, grad_output):
        grad, = collectives.broadcast_grad(_Gradients(ctx.process_set), [grad_output],
                                           hvdlite.rank() == ctx.root_rank)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``tensor`` on every rank (``root_rank`` is a global
    rank, also with a process set); ``tensor`` is not modified. Differentiable."""
    _check_tensor(tensor, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; ``synchronize`` returns (received rows, int32 tensor
    of rows received from each rank)."""
    return _alltoall_async(tensor, splits, name, process_set)


def _alltoall_async(tensor, splits, name, process_set, output=None):
    """alltoall_async; ``output`` as _allgather_async's, for the received rows."""
    code = _check_tensor(tensor, "alltoall_async")
    req = collectives.alltoall_request(code, tuple(tensor.shape), name, splits, process_set,
                                       "alltoall_async")
    src = tensor.contiguous()
    ex = device.executor_for(tensor)
    if ex is not None:
        return ex.submit(req, src)
    if device.needs_staging(tensor):
        return _staged(tensor, lambda host: alltoall_async(host, splits, name, process_set))
    into = _result_into(output, tensor.dtype) or {}
    into["finish"] = collectives.alltoall_result(_TENSORS, tensor.dtype, process_set, into.get("finish"))
    return collectives.submit(req, _TENSORS, src, keep=(tensor, src, output), **into)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):
        grad = collectives.alltoall_grad(_Gradients(ctx.process_set), grad_output, ctx.received)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends ``splits[i]`` rows of ``tensor`` (in order) to rank i and returns
    the rows received, concatenated in rank order. Without ``splits`` the first
    dimension is divided equally and only the tensor is returned; with
    ``splits`` it returns (tensor, int32 tensor of rows received from each
    rank), as Horovod does. Differentiable."""
    _check_tensor(tensor, "alltoall")
    split_list = request.splits_list(splits, "alltoall")
    output, received = _Alltoall.apply(tensor, split_list, name, process_set)
    return output if splits is None else (output, received)


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0, compression=Compression.none):
    """Starts a reducescatter; ``synchronize`` returns this rank's block of rows."""
    return _reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor,
                                compression)


def _reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor,
                         compression, output=None):
    """reducescatter_async; ``output`` as _allgather_async's, for this rank's block."""
    what = "reducescatter_async"
    op = _resolve_op(op, None, what)
    code = _check_reduce(tensor, op, what)
    spec = request.split_compression(compression)[0]
    req = collectives.reducescatter_request(code, tuple(tensor.shape), name, op, prescale_factor,
                                            postscale_factor, spec, process_set, what)
    src = tensor.contiguous()
    ex = device.executor_for(tensor) if device.executes(spec) else None
    if ex is not None:
        return ex.submit(req, src)
    if device.needs_staging(tensor) or tensor.device.type != "cpu":
        return _staged(tensor, lambda host: reducescatter_async(host, name, op, process_set, prescale_factor,
                                                                postscale_factor, compression))
    into = _result_into(output, tensor.dtype) or dict(finish=_engine_tensor(tensor.dtype))
    return collectives.submit(req, _TENSORS, src, keep=(tensor, src, output), **into)


def _reducescatter_grad(grads, op, pre, post, ps):
    return collectives.reducescatter_grad(_Gradients(ps), grads, op, pre, post, _set_size(ps))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor,
                compression):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor, compression))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, ps = ctx.args
        grad, = _reducescatter_grad([grad_output], op, pre, post, ps)
        return grad, None, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over the ranks and returns this rank's block of rows
    of the result: dimension 0 is split as evenly as possible, earlier ranks
    taking one more row when it does not divide. Differentiable."""
    op = _resolve_op(op, None, "reducescatter")
    _check_tensor(tensor, "reducescatter")
    return _Reducescatter.apply(tensor, name, op, process_set, prescale_factor, postscale_factor,
                                compression)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0,
                                compression=Compression.none):
    tensors = _check_group(tensors, "grouped_reducescatter_async")
    return _GroupHandle([reducescatter_async(t, n, op, process_set, prescale_factor,
                                             postscale_factor, compression)
                         for t, n in zip(tensors, _group_names(name, len(tensors)))])


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, compression,
                *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor, compression)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        return (None,) * 6 + tuple(_reducescatter_grad(grads, op, pre, post, ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """:func:`reducescatter` of every tensor in the list; returns a list."""
    tensors = _check_group(tensors, "grouped_reducescatter")
    op = _resolve_op(op, None, "grouped_reducescatter")
    if not tensors:
        return []
    for t in tensors:
        _check_tensor(t, "grouped_reducescatter")
    return list(_GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                            postscale_factor, compression, *tensors))


# ---------------------------------------------------------------- control

def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called barrier()."""
    hvdlite.barrier(process_set=process_set)


def join(device=-1, process_set=global_process_set):
    """Tells the other ranks this rank has run out of data: until every rank
    has joined, this rank takes part in their allreduces with zeros, so a
    DistributedOptimizer on the other ranks keeps averaging over all ranks
    (other collectives issued meanwhile fail, as in Horovod). Blocks until all
    ranks have joined and returns the rank that joined last. ``device`` is
    Horovod's GPU id for the zero tensors; a CPU build accepts and ignores it."""
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise exceptions.InvalidArgumentError(
            f"join(device=...) takes a GPU index or -1, not {device!r}")
    return int(hvdlite.join(process_set=process_set))


# ---------------------------------------------------------------- sparse

class _SparseHandle(request.GroupHandle):
    """Horovod returns a callable from sparse_allreduce_async; this handle is
    one, and also works with poll() and synchronize()."""

    __slots__ = ()

    def __call__(self):
        return self.wait()


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts reducing a sparse COO tensor: every rank's (indices, values) are
    gathered, and duplicates summed (values divided by the set size for
    Average). The result is a coalesced sparse tensor of the same size.
    Returns a handle; call it (Horovod's way) or pass it to synchronize()."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise exceptions.InvalidArgumentError(
            "sparse_allreduce_async takes a sparse COO torch.Tensor; use allreduce_async for "
            "dense tensors")
    op = request.sparse_rule(_resolve_op(op, None, "sparse_allreduce_async"), 1.0, 1.0,
                             "sparse_allreduce_async")
    t = tensor.coalesce()
    indices_h = allgather_async(t.indices().t().contiguous(), name=_named(name, "indices"),
                                process_set=process_set)
    values_h = allgather_async(t.values().contiguous(), name=_named(name, "values"),
                               process_set=process_set)
    n = _set_size(process_set)

    def combine(results):
        indices, values = results
        if op == Average:
            values = values / n
        return torch.sparse_coo_tensor(indices.t(), values, t.shape,
                                       check_invariants=False).coalesce()
    return _SparseHandle([indices_h, values_h], combine)


def _named(name, suffix):
    return f"{name}.{suffix}" if name else None


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline; ``%r`` in the path becomes the
    rank (every rank writes its own file), without it only rank 0 writes."""
    return hvdlite.start_timeline(file_path, mark_cycles=mark_cycles)


def stop_timeline():
    """Stops the timeline started by :func:`start_timeline` and closes the file."""
    return hvdlite.stop_timeline()
