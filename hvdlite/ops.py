"""Collectives on NumPy arrays. Every call goes through the engine's queue and
negotiation; ``*_async`` forms return a handle for :func:`synchronize`.
What each collective means is :mod:`hvdlite.collectives`, shared with the
torch and TensorFlow front ends; this module is its NumPy adapter."""
import numpy as np

from . import _binding, collectives, exceptions, request
from .compression import Compression, as_spec
from .process_sets import process_set_id
from .request import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (public names)

_CODES_BY_DTYPE = {np.dtype(name): code for name, code in _binding.DTYPE_CODES.items()
                   if name != "bfloat16"}


def _dtype_code(dtype, what):
    code = _CODES_BY_DTYPE.get(dtype)
    if code is None:  # e.g. ml_dtypes.bfloat16, or a dtype the engine lacks
        code = request.dtype_code(np.dtype(dtype).name, what)
    return code


def _check_array(a, what):
    if isinstance(a, np.generic):  # a NumPy scalar travels as a 0-d array
        raise exceptions.InvalidArgumentError(
            f"{what} takes a numpy.ndarray, not the scalar {type(a).__name__}; "
            "wrap it with numpy.asarray(x)")
    if not isinstance(a, np.ndarray):
        raise exceptions.InvalidArgumentError(
            f"{what} takes a numpy.ndarray, not {type(a).__name__}; the torch and TensorFlow "
            "adapters live in hvdlite.torch and hvdlite.tensorflow")
    if not a.flags.c_contiguous:
        raise exceptions.InvalidArgumentError(
            f"{what}: the array is not C-contiguous (shape {a.shape}, strides {a.strides}); "
            "pass numpy.ascontiguousarray(a)")
    return _dtype_code(a.dtype, what)


def _check_reduce(a, op, what):
    code = _check_array(a, what)
    op = request.check_op(op, what)
    request.check_reduction(op, np.dtype(a.dtype).name, what)
    return code, op


def _address(a):
    return _binding.ffi.from_buffer(a, require_writable=False)


class _NumpyArrays(collectives.Adapter):
    def dtype_code(self, a, what):
        return _check_array(a, what)

    def address(self, a):
        return _address(a)

    def wrap(self, owned, nbytes, shape, dtype):
        count = int(np.prod(shape)) if shape else 1
        if nbytes == 0 or count == 0:
            return np.empty(shape, dtype=dtype)
        return np.frombuffer(_binding.ffi.buffer(owned, nbytes), dtype=dtype, count=count).reshape(shape)

    def int_vector(self, values):
        return np.asarray(values, dtype=np.int64)


_ARRAYS = _NumpyArrays()


def synchronize(handle):
    """Waits for an async collective and returns its result (raises its error)."""
    if not isinstance(handle, _binding.Handle):
        raise exceptions.InvalidArgumentError(f"synchronize() takes a handle, not {type(handle).__name__}")
    return handle.wait()


def poll(handle):
    """True when the collective behind ``handle`` has completed."""
    if not isinstance(handle, _binding.Handle):
        raise exceptions.InvalidArgumentError(f"poll() takes a handle, not {type(handle).__name__}")
    return handle.poll()


def _check_out(out, tensor, what):
    if out is None:
        return np.empty_like(tensor)
    _check_array(out, what)
    if not out.flags.writeable:
        raise exceptions.InvalidArgumentError(
            f"{what}: out= is read-only; pass a writable array (or leave out= unset)")
    if out.shape != tensor.shape or out.dtype != tensor.dtype:
        raise exceptions.InvalidArgumentError(
            f"{what}: out= must have the input's shape {tensor.shape} and dtype {tensor.dtype}, "
            f"not {out.shape} {out.dtype}")
    return out


_BOOL_CODE = _binding.DTYPE_CODES["bool"]
# Reduce ops without a dtype rule of their own (Adasum has one).
_PLAIN_OPS = frozenset(code for code in request.OP_NAMES if code != Adasum)


def _fast_array_code(a):
    """The dtype code of a writable-or-not C-contiguous ndarray, or None when the
    checks with messages must run (anything unusual)."""
    if a.__class__ is np.ndarray and a.flags.c_contiguous:
        return _CODES_BY_DTYPE.get(a.dtype)
    return None


def allreduce_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=Compression.none, out=None):
    # Checked with plain type tests first: this runs once per tensor per step,
    # and the general checks (with their messages) only when one fails.
    code = _fast_array_code(tensor)
    if code is None or op.__class__ is not int or op not in _PLAIN_OPS or code == _BOOL_CODE:
        code, op = _check_reduce(tensor, op, "allreduce")
    if (out is None or out.__class__ is not np.ndarray or not out.flags.c_contiguous
            or not out.flags.writeable or out.shape != tensor.shape or out.dtype != tensor.dtype):
        out = _check_out(out, tensor, "allreduce")
    if prescale_factor.__class__ is not float:
        prescale_factor = request.factor(prescale_factor, "prescale_factor", "allreduce")
    if postscale_factor.__class__ is not float:
        postscale_factor = request.factor(postscale_factor, "postscale_factor", "allreduce")
    return collectives.allreduce_fast(
        name, code, tensor.shape, _address(tensor), _address(out), op, prescale_factor,
        postscale_factor, as_spec(compression),
        0 if process_set is None else process_set_id(process_set), (tensor, out), out)


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None, compression=Compression.none, out=None):
    """Reduces ``tensor`` over all ranks; returns a new array on every rank
    (or fills ``out``, which may be ``tensor`` itself for an in-place reduction).

    ``op=Adasum`` combines floating-point tensors as Horovod's Adasum does, on a
    power-of-2 number of ranks (process sets included)."""
    return synchronize(allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                                       process_set, compression, out))


def grouped_allreduce_async(tensors, op=Average, name=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, compression=Compression.none):
    return [allreduce_async(t, op, n, prescale_factor, postscale_factor, process_set, compression)
            for t, n in zip(tensors, request.group_names(name, len(tensors)))]


def grouped_allreduce(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None, compression=Compression.none):
    return request.wait_all(grouped_allreduce_async(tensors, op, name, prescale_factor,
                                                    postscale_factor, process_set, compression))


def allgather_async(tensor, name=None, process_set=None):
    req = collectives.allgather_request(_check_array(tensor, "allgather"), tensor.shape, name,
                                        process_set)
    tensor = tensor.reshape(req["shape"])
    return collectives.submit(req, _ARRAYS, tensor, keep=tensor,
                              finish=collectives.engine_output(_ARRAYS, tensor.dtype))


def allgather(tensor, name=None, process_set=None):
    """Concatenates every rank's ``tensor`` along the first dimension (which may
    differ per rank; the other dimensions must agree)."""
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """``root_rank`` is a rank of the job (global), as in Horovod, also with a process set."""
    req = collectives.broadcast_request(_check_array(tensor, "broadcast"), tensor.shape, name,
                                        root_rank, process_set, "broadcast")
    out = np.empty_like(tensor)
    return collectives.submit(req, _ARRAYS, tensor, output=out, keep=(tensor, out))


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns ``root_rank``'s ``tensor`` on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    req = collectives.alltoall_request(_check_array(tensor, "alltoall"), tensor.shape, name,
                                       splits, process_set, "alltoall")
    return collectives.submit(req, _ARRAYS, tensor, keep=tensor,
                              finish=collectives.alltoall_result(_ARRAYS, tensor.dtype, process_set))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends ``splits[i]`` rows of ``tensor`` (in order) to rank i; returns
    (received rows concatenated in rank order, rows received from each rank).
    Without ``splits`` the first dimension is divided equally."""
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, op=Average, name=None, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0, compression=Compression.none):
    code, op = _check_reduce(tensor, op, "reducescatter")
    req = collectives.reducescatter_request(code, tensor.shape, name, op, prescale_factor,
                                            postscale_factor, as_spec(compression), process_set,
                                            "reducescatter")
    return collectives.submit(req, _ARRAYS, tensor, keep=tensor,
                              finish=collectives.engine_output(_ARRAYS, tensor.dtype))


def reducescatter(tensor, op=Average, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0, compression=Compression.none):
    """Reduces ``tensor`` over ranks and returns this rank's block of rows: the
    first dimension is split as evenly as possible, earlier ranks taking one
    more row when it does not divide."""
    return synchronize(reducescatter_async(tensor, op, name, process_set, prescale_factor,
                                           postscale_factor, compression))


def barrier(process_set=None):
    """Returns once every rank of the set has called barrier()."""
    collectives.barrier(process_set)


def join(process_set=None):
    """Tells the other ranks this rank has run out of data. Until every rank
    of the set has joined, this rank takes part in their allreduces with zeros
    (and in their barriers); any other collective issued meanwhile fails with
    an error on the ranks that issued it, as in Horovod. Blocks until all ranks
    have joined; returns the rank that joined last."""
    return collectives.join(process_set)
