"""Gradient compression, run inside the engine on every reducing collective.

Pass ``compression=Compression.fp16`` (or ``.bf16``, ``Compression.topk(0.01)``,
``Compression.powersgd(rank=2)``, ``Compression.quantize(bits=4)``) to
``allreduce``/``grouped_allreduce``/
``reducescatter`` or to a ``DistributedOptimizer``. The engine compresses fused
buffers on the way to the wire and decompresses on the way back; nothing
happens in Python.

The compressors also have Horovod's methods, ``compress(tensor) -> (tensor,
ctx)`` and ``decompress(tensor, ctx)``, on torch, TensorFlow and NumPy
tensors. A subclass of :class:`Compressor` that overrides them (Horovod's way
of writing a custom compressor) is applied by the front end around an
uncompressed engine collective, as Horovod does.
"""
import math
import sys
import warnings

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
    if dtype_name == "bfloat16" or str(getattr(tensor, "dtype", "")) == "bfloat16":
        try:
            import ml_dtypes  # noqa: F401  (NumPy's bfloat16 comes from it)
        except ImportError:
            raise exceptions.InvalidArgumentError(
                "bfloat16 NumPy arrays need the ml_dtypes package (pip install ml_dtypes); "
                "the engine's Compression.bf16 itself does not") from None
        return np.asarray(tensor).astype(ml_dtypes.bfloat16 if dtype_name == "bfloat16" else dtype_name)
    return np.asarray(tensor).astype(dtype_name)


def _dtype_name(tensor):
    d = getattr(tensor, "dtype", None)
    name = getattr(d, "name", None)
    if isinstance(name, str):
        return name                       # numpy, TensorFlow
    return str(d).replace("torch.", "")   # torch


_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def _narrow(tensor, wire):
    """Horovod's compress() of a 16-bit float compressor: floating-point
    tensors become ``wire`` (ctx: their dtype), others pass unchanged."""
    name = _dtype_name(tensor)
    if name in _FLOAT_NAMES and name != wire:
        return _framework_cast(tensor, wire), name
    return tensor, None


def _widen(tensor, ctx):
    """decompress() after _narrow."""
    return tensor if ctx is None else _framework_cast(tensor, ctx)


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
        """(engine code, top-k ratio, error feedback, config id) for the C API."""
        return (_engine_code(self.kind), float(self.ratio), int(bool(self.error_feedback)), 0)

    def _key(self):
        """What makes two compressors the same (equal objects reduce alike)."""
        return (self.kind, float(self.ratio), bool(self.error_feedback))

    def __eq__(self, other):
        return isinstance(other, Compressor) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


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
        return _narrow(tensor, "float16")

    @staticmethod
    def decompress(tensor, ctx):
        return _widen(tensor, ctx)

    def __repr__(self):
        return "Compression.fp16"


class BF16Compressor(Compressor):
    """float32 gradients cross the wire as bfloat16 and are summed in float32
    precision; half the bytes, float32's range (no overflow where fp16 would
    overflow), 8 bits of mantissa."""

    kind = "bf16"

    @staticmethod
    def compress(tensor):
        """Floating-point tensors become bfloat16 (ctx: the original dtype);
        others pass unchanged. NumPy has no bfloat16 of its own: there it
        needs the ``ml_dtypes`` package (TensorFlow installs it)."""
        return _narrow(tensor, "bfloat16")

    @staticmethod
    def decompress(tensor, ctx):
        return _widen(tensor, ctx)

    def __repr__(self):
        return "Compression.bf16"


def _number(value, what):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise exceptions.InvalidArgumentError(f"{what} must be a number, not {value!r}") from None
    if math.isnan(value):
        raise exceptions.InvalidArgumentError(f"{what} must be a number, not nan")
    return value


def _count(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise exceptions.InvalidArgumentError(f"{what} must be an integer >= 0, not {value!r}")
    return value


class TopKCompressor(Compressor):
    """Each rank sends its ceil(ratio * n) largest-magnitude entries with their
    indices (tensors of fewer than 1024 entries whole); with error feedback the
    rest is kept and added to the next step.

    Deep Gradient Compression's additions (Lin et al., 2018), each a
    decorator around top-k in the engine:

    - ``momentum_correction``: the optimizer's momentum applied per rank
      before selection (velocity u = m u + g feeds the accumulation), and a
      sent entry's velocity cleared (momentum factor masking). ``True`` takes
      it from the optimizer that a ``DistributedOptimizer`` wraps (and sets
      that optimizer's own momentum to 0); a number gives it directly (then
      apply the result with plain SGD). Needs error feedback.
    - ``warmup_steps``: a tensor's first steps send a density falling
      exponentially from dense to ``ratio`` (ratio ** (step / warmup_steps)).
    - ``clip_norm``: each tensor's gradient on each rank is scaled to an L2
      norm of at most this before it accumulates (DGC divides the global
      clipping limit by sqrt(ranks)).
    """

    kind = "topk"

    def __init__(self, ratio=0.01, error_feedback=True, momentum_correction=None, warmup_steps=0,
                 clip_norm=None):
        ratio = _number(ratio, "topk ratio")
        if not (0.0 < ratio <= 1.0):
            raise exceptions.InvalidArgumentError(
                f"topk ratio must be in (0, 1], got {ratio}; e.g. Compression.topk(0.01) keeps 1%")
        self.ratio = ratio
        self.error_feedback = bool(error_feedback)
        if momentum_correction is None or momentum_correction is False:
            momentum_correction = 0.0
        if momentum_correction is not True:
            momentum_correction = _number(momentum_correction, "topk momentum_correction")
            if not (0.0 <= momentum_correction < 1.0):
                raise exceptions.InvalidArgumentError(
                    f"topk momentum_correction must be True (the optimizer's momentum) or a momentum "
                    f"in [0, 1), got {momentum_correction}")
        if momentum_correction and not self.error_feedback:
            raise exceptions.InvalidArgumentError(
                "topk momentum_correction accumulates what top-k leaves out: it needs "
                "error_feedback=True")
        self.momentum_correction = momentum_correction
        self.warmup_steps = _count(warmup_steps, "topk warmup_steps")
        if momentum_correction and not self.warmup_steps and ratio < 0.01:
            warnings.warn(
                f"Compression.topk({ratio:g}, momentum_correction=...) without warmup_steps loses "
                "accuracy at ratios this small (digits, 4 ranks, top-k 0.1 %: 94.67 % with momentum "
                "correction alone, 96.96 % with the warm-up and clipping, 97.56 % uncompressed); "
                "give warmup_steps= (and clip_norm=), or use Compression.dgc(ratio, "
                "steps_per_epoch=...)", UserWarning, stacklevel=3)
        clip_norm = 0.0 if clip_norm is None else _number(clip_norm, "topk clip_norm")
        if clip_norm < 0:
            raise exceptions.InvalidArgumentError(f"topk clip_norm must be > 0 (None: off), got {clip_norm}")
        self.clip_norm = clip_norm

    def _key(self):
        return (self.kind, self.ratio, self.error_feedback, self.momentum_correction, self.warmup_steps,
                self.clip_norm)

    def with_momentum(self, momentum):
        """This compressor with ``momentum_correction=True`` resolved to the
        optimizer's ``momentum`` (the DistributedOptimizers call it)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # said once, when the user made this one
            return TopKCompressor(self.ratio, self.error_feedback, float(momentum), self.warmup_steps,
                                  self.clip_norm or None)

    def spec(self):
        if self.momentum_correction is True:
            raise exceptions.InvalidArgumentError(
                "Compression.topk(momentum_correction=True) takes the momentum from the optimizer a "
                "DistributedOptimizer wraps; with allreduce() and other direct calls give the "
                "momentum, e.g. momentum_correction=0.9, and apply the result with plain SGD")
        if not (self.momentum_correction or self.warmup_steps or self.clip_norm):
            return super().spec()
        return (_engine_code(self.kind), 0.0, 0,
                _config_id(self.kind, ratio=self.ratio, error_feedback=self.error_feedback,
                           momentum=self.momentum_correction, warmup_steps=self.warmup_steps,
                           clip_norm=self.clip_norm))

    def __repr__(self):
        extra = ""
        if self.momentum_correction:
            extra += f", momentum_correction={self.momentum_correction}"
        if self.warmup_steps:
            extra += f", warmup_steps={self.warmup_steps}"
        if self.clip_norm:
            extra += f", clip_norm={self.clip_norm}"
        return f"Compression.topk(ratio={self.ratio}, error_feedback={self.error_feedback}{extra})"


class PowerSGDCompressor(Compressor):
    """PowerSGD (Vogels et al., 2019): each matrix gradient (rows x the rest of
    its dimensions) crosses the wire as rank-``rank`` factors P and Q found by
    one power-iteration step warm-started from the last, in two fused
    allreduces, with error feedback; tensors with one dimension, and matrices
    too small to gain, go dense. The first ``start_iter`` steps of each tensor
    go dense (no error kept). Allreduce only (not reducescatter)."""

    kind = "powersgd"

    def __init__(self, rank=1, start_iter=10):
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 64:
            raise exceptions.InvalidArgumentError(f"powersgd rank must be an integer in [1, 64], not {rank!r}")
        self.rank = rank
        self.start_iter = _count(start_iter, "powersgd start_iter")

    def _key(self):
        return (self.kind, self.rank, self.start_iter)

    def spec(self):
        return (_engine_code(self.kind), 0.0, 0,
                _config_id(self.kind, rank=self.rank, start_iter=self.start_iter))

    def __repr__(self):
        return f"Compression.powersgd(rank={self.rank}, start_iter={self.start_iter})"


class QuantizeCompressor(Compressor):
    """Block quantization: each tensor is cut into blocks of ``block_size``
    values, and each block crosses the wire as one float32 scale (the
    largest magnitude of its finite values / qmax) and one integer code in
    [-qmax, qmax] per value (qmax = 7 for ``bits=4``, two codes per byte;
    127 for ``bits=8``). Codes cannot be summed on the wire: every rank's form
    is gathered and every rank adds them up in rank order, so all ranks get
    the same bits. float16 and bfloat16 tensors are quantized too (from
    float32, and the sum rounded back once).

    ``rounding``: ``"nearest"`` (ties to even) or ``"stochastic"`` (up with
    probability of the fraction: unbiased), drawn from a hash of ``seed``,
    the tensor's name, its step count, the position and the value, so the
    result is reproducible. ``None`` picks nearest with error feedback (which
    carries the rounding error to the next step anyway) and stochastic
    without. ``error_feedback``: what rounding lost is kept per tensor in the
    engine and added to the next step. A NaN or inf value arrives as NaN at
    its position on every rank (the rest of its block is unharmed), and
    error feedback keeps nothing for it."""

    kind = "quantize"

    def __init__(self, bits=4, block_size=64, rounding=None, error_feedback=True, seed=0):
        if isinstance(bits, bool) or not isinstance(bits, int) or bits not in (4, 8):
            raise exceptions.InvalidArgumentError(
                f"quantize bits must be 4 or 8, not {bits!r}; e.g. Compression.quantize(bits=4)")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or \
                not 2 <= block_size <= _QUANTIZE_MAX_BLOCK:
            raise exceptions.InvalidArgumentError(
                f"quantize block_size must be an integer in [2, {_QUANTIZE_MAX_BLOCK}] (values per "
                f"scale; 64 by default), not {block_size!r}")
        self.error_feedback = bool(error_feedback)
        if rounding is None:
            rounding = "nearest" if self.error_feedback else "stochastic"
        if rounding not in ("nearest", "stochastic"):
            raise exceptions.InvalidArgumentError(
                f"quantize rounding must be 'nearest' or 'stochastic' (None: nearest with "
                f"error_feedback, stochastic without), not {rounding!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
            raise exceptions.InvalidArgumentError(
                f"quantize seed must be an integer in [0, 2**63), not {seed!r}")
        self.bits, self.block_size, self.rounding, self.seed = bits, block_size, rounding, seed

    def _key(self):
        return (self.kind, self.bits, self.block_size, self.rounding, self.error_feedback, self.seed)

    def spec(self):
        return (_engine_code(self.kind), 0.0, 0,
                _config_id(self.kind, error_feedback=self.error_feedback, bits=self.bits,
                           block_size=self.block_size, stochastic=self.rounding == "stochastic",
                           seed=self.seed))

    def wire_bytes(self, count):
        """The bytes one rank sends for a tensor of ``count`` values: a
        float32 scale per block, then ``bits`` per value."""
        blocks = -(-count // self.block_size)
        return 4 * blocks + (count * self.bits + 7) // 8

    def __repr__(self):
        return (f"Compression.quantize(bits={self.bits}, block_size={self.block_size}, "
                f"rounding={self.rounding!r}, error_feedback={self.error_feedback}, seed={self.seed})")


_QUANTIZE_MAX_BLOCK = 65536   # csrc/compressors/quantize.h


class Compression:
    """Namespace of compressors, as in Horovod: ``Compression.none``,
    ``Compression.fp16``, and hvdlite's ``Compression.bf16``,
    ``Compression.topk(ratio, error_feedback, momentum_correction,
    warmup_steps, clip_norm)``, ``Compression.powersgd(rank, start_iter)``
    and ``Compression.quantize(bits, block_size, rounding, error_feedback,
    seed)``."""

    none = NoneCompressor()
    fp16 = FP16Compressor()
    bf16 = BF16Compressor()

    @staticmethod
    def topk(ratio=0.01, error_feedback=True, momentum_correction=None, warmup_steps=0, clip_norm=None):
        return TopKCompressor(ratio, error_feedback, momentum_correction, warmup_steps, clip_norm)

    @staticmethod
    def powersgd(rank=2, start_iter=10):
        """PowerSGD at the paper's setting (Vogels et al., 2019: rank 2, error
        feedback, warm-started factors), dense for each tensor's first
        ``start_iter`` steps."""
        return PowerSGDCompressor(rank, start_iter)

    @staticmethod
    def quantize(bits=4, block_size=64, rounding=None, error_feedback=True, seed=0):
        """Block quantization (see :class:`QuantizeCompressor`) at 4 bits, as
        Streaming DiLoCo sends its outer gradients: per block of 64 values a
        float32 scale and 4-bit codes, 0.14 of float32's bytes (bits=8: 0.27),
        gathered from every rank; rounding to nearest with error feedback."""
        return QuantizeCompressor(bits, block_size, rounding, error_feedback, seed)

    @staticmethod
    def dgc(ratio=0.001, steps_per_epoch=None, warmup_epochs=4, max_norm=None, size=None):
        """Deep Gradient Compression (Lin et al., 2018) as the paper runs it:
        top-k at ``ratio`` with error feedback, momentum correction from the
        wrapped optimizer's momentum, a warm-up whose density falls from dense
        to ``ratio`` over the first ``warmup_epochs`` epochs of
        ``steps_per_epoch`` steps each, and local clipping of each gradient at
        ``max_norm / sqrt(size)`` (the global clipping norm shared among
        ``size`` ranks; default: hvdlite's size; ``max_norm=None``: none).

        ``steps_per_epoch`` (e.g. ``len(train_loader)``) scales the warm-up to
        the run; it has no default because a warm-up of the wrong length is
        where DGC loses accuracy."""
        if steps_per_epoch is None:
            raise exceptions.InvalidArgumentError(
                "Compression.dgc needs steps_per_epoch (e.g. len(train_loader)): its warm-up spans "
                f"the first warmup_epochs={warmup_epochs} epochs; or build it yourself with "
                "Compression.topk(ratio, momentum_correction=True, warmup_steps=W, clip_norm=C)")
        steps = _count(steps_per_epoch, "Compression.dgc steps_per_epoch")
        epochs = _number(warmup_epochs, "Compression.dgc warmup_epochs")
        if steps < 1 or epochs < 0:
            raise exceptions.InvalidArgumentError(
                f"Compression.dgc: steps_per_epoch must be >= 1 and warmup_epochs >= 0, got "
                f"{steps_per_epoch} and {warmup_epochs}")
        clip = None
        if max_norm is not None:
            max_norm = _number(max_norm, "Compression.dgc max_norm")
            if max_norm <= 0:
                raise exceptions.InvalidArgumentError(f"Compression.dgc max_norm must be > 0, got {max_norm}")
            if size is None:
                from . import basics
                size = basics.size()
            clip = max_norm / math.sqrt(_count(size, "Compression.dgc size") or 1)
        return TopKCompressor(ratio, True, True, int(round(steps * epochs)), clip)


_NONE_SPEC = (0, 0.0, 0, 0)
# The classes above that name an engine compressor of their own.
_ENGINE_CLASSES = tuple(cls for cls in Compressor.__subclasses__() if "kind" in vars(cls))
_codes = {}
_engine_compressor_classes = {}   # (class, compress, decompress) -> is_engine_compressor


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


def wants_optimizer_momentum(compression):
    """Whether ``compression`` is top-k with ``momentum_correction=True``."""
    return isinstance(compression, TopKCompressor) and compression.momentum_correction is True


def resolve_momentum_correction(compression, momenta, nesterov, what):
    """(compression, whether the optimizer's own momentum must be set to 0)
    for an optimizer whose parameter groups have ``momenta``:
    ``momentum_correction=True`` becomes the optimizer's momentum, which the
    engine then applies before top-k instead of the optimizer after it."""
    if not wants_optimizer_momentum(compression):
        return compression, False
    values = set(momenta)
    if not values or any(not isinstance(m, (int, float)) or isinstance(m, bool) for m in values):
        raise exceptions.InvalidArgumentError(
            f"{what}: Compression.topk(momentum_correction=True) takes the momentum of the wrapped "
            "optimizer, which has none (SGD with momentum= has one); give the momentum as a number "
            "or leave momentum_correction off")
    if len(values) > 1:
        raise exceptions.InvalidArgumentError(
            f"{what}: momentum_correction=True needs one momentum for every parameter group, "
            f"found {sorted(values)}")
    if nesterov:
        raise exceptions.InvalidArgumentError(
            f"{what}: momentum_correction applies plain (heavy-ball) momentum; the optimizer uses "
            "Nesterov momentum: set nesterov=False or leave momentum_correction off")
    momentum = float(values.pop())
    return compression.with_momentum(momentum), momentum > 0


_config_ids = {}


def _config_id(kind, ratio=0.0, error_feedback=False, momentum=0.0, warmup_steps=0, clip_norm=0.0,
               rank=0, start_iter=0, bits=0, block_size=0, stochastic=False, seed=0):
    """The engine's id of a compressor with options (c_api.h's
    hvd_compression_config), registered once per process."""
    key = (kind, float(ratio), bool(error_feedback), float(momentum), int(warmup_steps),
           float(clip_norm), int(rank), int(start_iter), int(bits), int(block_size), bool(stochastic),
           int(seed))
    cid = _config_ids.get(key)
    if cid is None:
        from ._binding import lib, last_error
        cid = lib.hvd_compression_config(_engine_code(kind), *key[1:])
        if cid < 0:
            raise exceptions.InvalidArgumentError(last_error())
        _config_ids[key] = cid
    return cid


def is_engine_compressor(compression):
    """True for hvdlite's own compressors (instances or classes), which run
    inside the engine; False for a subclass that overrides compress() or
    decompress() (it runs in Python, see module doc)."""
    cls = compression if isinstance(compression, type) else type(compression)
    # Asked on every collective: remembered per class and its two methods.
    key = (cls, getattr(cls, "compress", None), getattr(cls, "decompress", None))
    known = _engine_compressor_classes.get(key)
    if known is None:
        known = isinstance(cls, type) and issubclass(cls, _ENGINE_CLASSES)
        if known:
            base = next(b for b in cls.__mro__ if b in _ENGINE_CLASSES)
            known = key[1] is getattr(base, "compress") and key[2] is getattr(base, "decompress")
        _engine_compressor_classes[key] = known
    return known


def as_spec(compression):
    if compression is None or compression.__class__ is NoneCompressor:
        return _NONE_SPEC
    if isinstance(compression, type) and issubclass(compression, Compressor):
        compression = compression()
    if not isinstance(compression, Compressor):
        raise exceptions.InvalidArgumentError(
            f"compression must be Compression.none, Compression.fp16, Compression.bf16, "
            f"Compression.topk(...), Compression.powersgd(...), Compression.quantize(...) or an "
            f"object with compress(tensor) and decompress(tensor, ctx), not {compression!r}")
    return compression.spec()
