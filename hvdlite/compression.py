"""Gradient compression, run inside the engine on every reducing collective.

Pass ``compression=Compression.fp16`` (or ``Compression.topk(0.01)``) to
``allreduce``/``grouped_allreduce``/``reducescatter`` or to a
``DistributedOptimizer``. The engine compresses fused buffers on the way to
the wire and decompresses on the way back; nothing happens in Python.
"""
import math

from . import exceptions


class Compressor:
    """What crosses the wire for a reducing collective. Immutable."""

    code = 0
    ratio = 0.0
    error_feedback = False

    def spec(self):
        """(engine code, top-k ratio, error feedback) for the C API."""
        return (self.code, float(self.ratio), int(bool(self.error_feedback)))

    def __eq__(self, other):
        return isinstance(other, Compressor) and self.spec() == other.spec()

    def __hash__(self):
        return hash(self.spec())


class NoneCompressor(Compressor):
    """Full precision on the wire."""

    code = 0

    def __repr__(self):
        return "Compression.none"


class FP16Compressor(Compressor):
    """float32 gradients cross the wire as float16 and are summed in float32
    precision; half the bytes."""

    code = 1

    def __repr__(self):
        return "Compression.fp16"


class TopKCompressor(Compressor):
    """Each rank sends its ceil(ratio * n) largest-magnitude entries with their
    indices (tensors of fewer than 1024 entries whole); with error feedback the
    rest is kept and added to the next step."""

    code = 2

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


def as_spec(compression):
    if compression is None or compression.__class__ is NoneCompressor:
        return _NONE_SPEC
    if compression is None:
        return NoneCompressor().spec()
    if isinstance(compression, type) and issubclass(compression, Compressor):
        compression = compression()
    if not isinstance(compression, Compressor):
        raise exceptions.InvalidArgumentError(
            f"compression must be Compression.none, Compression.fp16 or Compression.topk(...), "
            f"not {compression!r}")
    return compression.spec()
