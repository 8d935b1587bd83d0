"""Gradient compression, run inside the engine on every reducing collective.

Pass ``compression=Compression.fp16`` (or ``Compression.topk(0.01)``) to
``allreduce``/``grouped_allreduce``/``reducescatter`` or to a
``DistributedOptimizer``. The engine compresses fused buffers on the way to
the wire and decompresses on the way back; nothing happens in Python.

The compressors also have Horovod's methods, ``compress(tensor) -> (tensor,
ctx)`` and ``decompress(tensor, ctx)``, on torch, TensorFlow and NumPy
tensors. A subclass of :class:`Compressor` that overrides them (Horovod's way
of writing a custom compressor) is applied by the front end around an
uncompressed engine collective, as Horovod does.
"""
import math
import sys

from . import exceptions


def _framework_cast(tensor, dtype_name):
    """``tensor`` cast to the floating dtype ``dtype_name``, in its own framework."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        return tensor.to(getattr(torch, dtype_name))
    tf = sys.modules.get("tensorflow")
    if tf is not None and (tf.is_tensor(tensor) or isinstance(tensor, tf.Variable)):
        return tf.cast(tensor, getattr(tf, dtype_name))
    import numpy as np
    return np.asarray(tensor).astype(dtype_name)


def _dtype_name(tensor):
    d = getattr(tensor, "dtype", None)
    name = getattr(d, "name", None)
    if isinstance(name, str):
        return name                       # numpy, TensorFlow
    return str(d).replace("torch.", "")   # torch


_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


class Compressor:
    """What crosses the wire for a reducing collective. Immutable.

    ``compress``/``decompress`` are Horovod's interface; the base class
    passes tensors through unchanged."""

    kind = "none"  # the engine's compressor of that name does the work
    ratio = 0.0
    error_feedback = False

    @staticmethod
    def compress(tensor):
        """Returns (tensor to send, context for decompress)."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Undoes compress() on the reduced tensor."""
        return tensor

    def spec(self):
        """(engine code, top-k ratio, error feedback) for the C API."""
        return (_engine_code(self.kind), float(self.ratio), int(bool(self.error_feedback)))

    def __eq__(self, other):
        return isinstance(other, Compressor) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.spec())


class NoneCompressor(Compressor):
    """Full precision on the wire."""

    kind = "none"

    def __repr__(self):
        return "Compression.none"


class FP16Compressor(Compressor):
    """float32 gradients cross the wire as float16 and are summed in float32
    precision; half the bytes."""

    kind = "fp16"

    @staticmethod
    def compress(tensor):
        """Floating-point tensors become float16 (ctx: the original dtype);
        others pass unchanged."""
        name = _dtype_name(tensor)
        if name in _FLOAT_NAMES and name != "float16":
            return _framework_cast(tensor, "float16"), name
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else _framework_cast(tensor, ctx)

    def __repr__(self):
        return "Compression.fp16"


class TopKCompressor(Compressor):
    """Each rank sends its ceil(ratio * n) largest-magnitude entries with their
    indices (tensors of fewer than 1024 entries whole); with error feedback the
    rest is kept and added to the next step."""

    kind = "topk"

    def __init__(self, ratio=0.01, error_feedback=True):
        try:
            ratio = float(ratio)
        except (TypeError, ValueError):
            raise exceptions.InvalidArgumentError(f"topk ratio must be a number, not {ratio!r}") from None
        if not (0.0 < ratio <= 1.0) or math.isnan(ratio):
            raise exceptions.InvalidArgumentError(
                f"topk ratio must be in (0, 1], got {ratio}; e.g. Compression.topk(0.01) keeps 1%")
        self.ratio = ratio
        self.error_feedback = bool(error_feedback)

    def __repr__(self):
        return f"Compression.topk(ratio={self.ratio}, error_feedback={self.error_feedback})"


class Compression:
    """Namespace of compressors, as in Horovod: ``Compression.none``,
    ``Compression.fp16``, and ``Compression.topk(ratio, error_feedback)``."""

    none = NoneCompressor()
    fp16 = FP16Compressor()

    @staticmethod
    def topk(ratio=0.01, error_feedback=True):
        return TopKCompressor(ratio, error_feedback)


_NONE_SPEC = (0, 0.0, 0)
# The classes above that name an engine compressor of their own.
_ENGINE_CLASSES = tuple(cls for cls in Compressor.__subclasses__() if "kind" in vars(cls))
_codes = {}


def _engine_code(kind):
    """The C API's code of the engine's compressor called ``kind``: each
    compressor registers itself in the engine (csrc/compressors/registry.h)."""
    code = _codes.get(kind)
    if code is None:
        from ._binding import lib
        code = lib.hvd_compression_code(kind.encode())
        if code < 0:
            raise exceptions.InvalidArgumentError(f"this build of the engine has no '{kind}' compressor")
        _codes[kind] = code
    return code


def is_engine_compressor(compression):
    """True for hvdlite's own compressors (instances or classes), which run
    inside the engine; False for a subclass that overrides compress() or
    decompress() (it runs in Python, see module doc)."""
    cls = compression if isinstance(compression, type) else type(compression)
    if not (isinstance(cls, type) and issubclass(cls, _ENGINE_CLASSES)):
        return False
    base = next(b for b in cls.__mro__ if b in _ENGINE_CLASSES)
    return (getattr(cls, "compress") is getattr(base, "compress")
            and getattr(cls, "decompress") is getattr(base, "decompress"))


def as_spec(compression):
    if compression is None or compression.__class__ is NoneCompressor:
        return _NONE_SPEC
    if isinstance(compression, type) and issubclass(compression, Compressor):
        compression = compression()
    if not isinstance(compression, Compressor):
        raise exceptions.InvalidArgumentError(
            f"compression must be Compression.none, Compression.fp16, Compression.topk(...) or an "
            f"object with compress(tensor) and decompress(tensor, ctx), not {compression!r}")
    return compression.spec()
