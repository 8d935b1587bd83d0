"""The request layer every front end (NumPy, torch, TensorFlow) goes through.

A front end turns its tensor into an address, a dtype name and a shape, and
the functions here decide what the call means, once for all frameworks:
the reduce-op and dtype tables, the rules for Average/Sum/Adasum and the
deprecated ``average=``, pre/postscale and ``gradient_predivide_factor``,
root ranks, alltoall splits, 0-d tensors, sparse (IndexedSlices / sparse
COO) reductions, Python-side compressors, and "wait for every handle, then
raise the first error". :mod:`hvdlite.collectives` builds each collective's
engine request from these rules.

Nothing here imports torch or TensorFlow.
"""
import math

from . import _binding, exceptions
from .compression import Compressor, as_spec, is_engine_compressor
from .process_sets import global_process_set, process_set_id, set_root_rank

# ---------------------------------------------------------------- reduce ops

# The engine's ReduceOp codes, from its C API.
_REDUCE = _binding.REDUCE_OP_CODES
Average, Sum, Min, Max, Product, Adasum = (
    _REDUCE["average"], _REDUCE["sum"], _REDUCE["min"], _REDUCE["max"], _REDUCE["product"],
    _REDUCE["adasum"])
OP_NAMES = {code: name.title() for name, code in _REDUCE.items()}


def op_name(op):
    return OP_NAMES.get(op, repr(op))


def resolve_op(op, average, what, default=Average):
    """The reduce op of a call that takes Horovod's ``op=`` and the deprecated
    ``average=`` (True: Average, False: Sum). Raises for both or an unknown op."""
    if average is not None:
        if op is not None:
            raise exceptions.InvalidArgumentError(
                f"{what}: pass op= or the deprecated average=, not both")
        return Average if average else Sum
    if op is None:
        return default
    return check_op(op, what)


def check_op(op, what):
    if op.__class__ is not int or op not in OP_NAMES:
        if isinstance(op, int) and not isinstance(op, bool) and int(op) in OP_NAMES:
            return int(op)
        raise exceptions.InvalidArgumentError(
            f"{what}: op must be one of Average, Sum, Min, Max, Product, Adasum (got {op!r})")
    return op


def gradient_op(op, what, allowed=(Average, Sum)):
    """The reduce op of a gradient wrapper (Keras DistributedOptimizer,
    DistributedGradientTape): Horovod reduces gradients with Average or Sum
    only there."""
    op = check_op(Average if op is None else op, what)
    if op not in allowed:
        raise exceptions.InvalidArgumentError(
            f"{what}: op must be {' or '.join(op_name(o) for o in allowed)} for gradients, "
            f"not {op_name(op)}")
    return op


def backward_passes(value, what):
    """``backward_passes_per_step``: an int >= 1 (gradients of that many
    backward passes are accumulated locally before one reduction)."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or value.__index__() < 1:
        raise exceptions.InvalidArgumentError(
            f"{what}: backward_passes_per_step must be an int >= 1, got {value!r}")
    return value.__index__()


# ---------------------------------------------------------------- dtypes

DTYPE_CODES = _binding.DTYPE_CODES
FLOAT_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64"))


def dtype_code(dtype_name, what):
    """The engine's code for a dtype given by name ("float32", "int16", ...)."""
    code = DTYPE_CODES.get(dtype_name)
    if code is None:
        raise exceptions.UnsupportedDTypeError(
            f"{what}: dtype {dtype_name} is not supported by hvdlite; use one of: "
            f"{', '.join(DTYPE_CODES)}")
    return code


def check_reduction(op, dtype_name, what, process_set=None):
    """Rules of a reducing collective that depend on op and dtype together."""
    if dtype_name == "bool" and op != Adasum:
        raise exceptions.InvalidArgumentError(
            f"{what}: bool tensors cannot be reduced; cast to uint8 or int32 first")
    if op == Adasum:
        if dtype_name not in FLOAT_DTYPES:
            raise exceptions.InvalidArgumentError(
                f"{what}: Adasum combines floating-point tensors, not {dtype_name}; cast to "
                "float32 or use op=Sum")


# ---------------------------------------------------------------- factors

def factor(value, label, what):
    """A finite float for pre/postscale factors."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise exceptions.InvalidArgumentError(
            f"{what}: {label} must be a finite number, not {value!r}") from None
    if not math.isfinite(f):
        raise exceptions.InvalidArgumentError(f"{what}: {label} must be a finite number, not {f}")
    return f


def predivide_factor(value, op, what):
    """Validates ``gradient_predivide_factor``: a finite, non-zero number,
    meaningful with op=Average only (as in Horovod)."""
    f = factor(value, "gradient_predivide_factor", what)
    if f == 0.0:
        raise exceptions.InvalidArgumentError(
            f"{what}: gradient_predivide_factor must be a non-zero number, got {value!r}")
    if f != 1.0 and op != Average:
        raise exceptions.InvalidArgumentError(
            f"{what}: gradient_predivide_factor is only meaningful with op=Average (got op="
            f"{op_name(op)})")
    return f


def gradient_scales(op, predivide, postscale=1.0):
    """(engine op, prescale, postscale) reducing gradients with a predivide
    factor f: the engine divides by f before the sum and multiplies the
    average by f after it (the same average, with smaller partial sums)."""
    if op == Average and predivide != 1.0:
        return Average, 1.0 / predivide, predivide * postscale
    return op, 1.0, postscale


# ---------------------------------------------------------------- compression

def split_compression(compression, what="compression"):
    """(engine spec, python compressor or None).

    hvdlite's own compressors run inside the engine. Any other object with
    Horovod's ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor,
    ctx)`` (a user's subclass of ``Compressor``) runs in the front end around
    an uncompressed engine collective, as in Horovod."""
    if compression is None or is_engine_compressor(compression):
        return as_spec(compression), None
    if isinstance(compression, type) and issubclass(compression, Compressor) and \
            is_engine_compressor(compression):
        return as_spec(compression), None
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return as_spec(None), compression
    return as_spec(compression), None  # raises with the list of what is accepted


def compresses(spec, dtype_name):
    """Whether the engine compression ``spec`` applies to a tensor of this
    dtype: floating-point data only; other dtypes travel plain, so a gradient
    list mixing dtypes can share one compression setting."""
    return spec != as_spec(None) and dtype_name in FLOAT_DTYPES


# ---------------------------------------------------------------- process sets and roots

def set_id(process_set):
    return process_set_id(global_process_set if process_set is None else process_set)


def set_size(process_set):
    pid = set_id(process_set)
    if pid == 0:
        return _binding.check(_binding.lib.hvd_size())
    return _binding.check(_binding.lib.hvd_process_set_size(pid))


def set_rank(process_set):
    """This rank's position in the set (-1 when not a member)."""
    pid = set_id(process_set)
    if pid == 0:
        return _binding.check(_binding.lib.hvd_rank())
    return _binding.lib.hvd_process_set_rank(pid)


def root_in_set(root_rank, process_set, what):
    """Horovod's root_rank is a rank of the job; the engine wants its
    position within the process set."""
    return set_root_rank(root_rank, process_set, what)


# ---------------------------------------------------------------- alltoall splits

def splits_list(splits, what):
    """Alltoall splits as a list of ints (None: divide equally). Accepts a
    list, tuple or 1-d array/tensor of integers, as Horovod does. Non-integer
    splits raise UnsupportedDTypeError, both a TypeError (what Horovod's
    TensorFlow op raises) and a ValueError (what its torch op raises)."""
    if splits is None:
        return None
    values = splits
    if hasattr(values, "numpy") and callable(values.numpy):  # torch / TF eager tensors
        values = values.numpy()
    if hasattr(values, "dtype") and hasattr(values, "reshape"):
        kind = getattr(values.dtype, "kind", None)
        if kind is not None and kind not in "iu":
            raise exceptions.UnsupportedDTypeError(
                f"{what}: splits must be integers, not {values.dtype}; pass an int32/int64 "
                "tensor or a list of ints")
        values = values.reshape(-1).tolist()
    if isinstance(values, (int,)) or not hasattr(values, "__iter__"):
        raise exceptions.InvalidArgumentError(
            f"{what}: splits must be a list or 1-d tensor of ints (one per rank), not {splits!r}")
    out = []
    for s in values:
        if isinstance(s, bool) or not isinstance(s, int):
            if hasattr(s, "__index__"):
                s = s.__index__()
            else:
                raise exceptions.UnsupportedDTypeError(
                    f"{what}: splits must be whole row counts, got {s!r}; pass one int per rank")
        if s < 0:
            raise exceptions.InvalidArgumentError(
                f"{what}: splits must not be negative, got {s}")
        out.append(int(s))
    return out


# ---------------------------------------------------------------- shapes

# ---------------------------------------------------------------- waiting

def wait_all(handles):
    """Waits for every handle (so no buffer is freed while the engine still
    uses it), then raises the first error; returns the results in order."""
    results, first_error = [], None
    for h in handles:
        try:
            results.append(h.wait())
        except exceptions.HvdliteError as e:
            first_error = first_error or e
            results.append(None)
    if first_error is not None:
        raise first_error
    return results


class GroupHandle:
    """One handle for several engine handles (grouped collectives, sparse
    reductions): done when every member is; ``combine`` builds the result."""

    __slots__ = ("handles", "combine", "_done", "_result")

    def __init__(self, handles, combine=list):
        self.handles = handles
        self.combine = combine
        self._done = False
        self._result = None

    def poll(self):
        return all(h.poll() for h in self.handles)

    def wait(self):
        if not self._done:
            self._result = self.combine(wait_all(self.handles))
            self._done = True
        return self._result


def check_handle(handle, what):
    if not isinstance(handle, (_binding.Handle, GroupHandle)):
        raise exceptions.InvalidArgumentError(
            f"{what}() takes a handle returned by an *_async collective, not {type(handle).__name__}")


def group_names(name, n):
    """Names of a grouped collective's members from its base name."""
    return [f"{name}.{i}" if name else None for i in range(n)]


# ---------------------------------------------------------------- sparse reductions

def sparse_rule(op, prescale, postscale, what):
    """Sparse tensors (tf.IndexedSlices, torch sparse COO) are reduced by
    gathering every rank's (indices, values); only Sum and Average can be
    expressed that way, and pre/postscale are not applied (Horovod raises
    NotImplementedError for both). Returns the factor to scale the gathered
    values by."""
    if op not in (Average, Sum):
        raise NotImplementedError(
            f"{what}: sparse tensors can only be averaged or summed, not reduced with "
            f"{op_name(op)}; densify them first")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError(
            f"{what}: prescale_factor and postscale_factor are not supported for sparse tensors; "
            "scale the values yourself or densify the tensor first")
    return op
