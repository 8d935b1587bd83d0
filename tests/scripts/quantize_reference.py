"""The engine's block quantizer (csrc/compressors/quantize.{h,cc}) in NumPy,
bit for bit: every rank's wire form, its error-feedback residual and the
gathered sum, so rank-side tests can compare the engine's result exactly.

Every float32 operation is the engine's, in its order: the scale a / qmax,
the magnitude |x| / a * qmax, the exact fraction, the decode q * scale and
the sum in rank order; stochastic draws use the same SplitMix64 hashing.
"""
import numpy as np

M64 = 0xFFFFFFFFFFFFFFFF
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    """SplitMix64's finaliser on a Python int below 2**64 or a uint64 array."""
    if isinstance(z, np.ndarray):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def name_hash(name):
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) & M64
    return h


def wire_bytes(count, bits=4, block_size=64):
    return 4 * (-(-count // block_size)) + (count * bits + 7) // 8


class QuantizeReference:
    """One compressor per rank, as each rank's engine keeps it: step counts
    (stochastic draws) and residuals (error feedback) per tensor name."""

    def __init__(self, ranks, bits=4, block_size=64, stochastic=False, seed=0, error_feedback=False):
        self.ranks, self.bits, self.block = ranks, bits, block_size
        self.qmax = (1 << (bits - 1)) - 1
        self.stochastic, self.seed, self.error_feedback = stochastic, seed, error_feedback
        self.steps = {}       # (rank, name) -> compressions so far
        self.residuals = {}   # (rank, name) -> float32 residual

    def _key(self, rank, name):
        step = self.steps.get((rank, name), 0)
        self.steps[(rank, name)] = step + 1
        return mix64((mix64(self.seed ^ name_hash(name)) + step * GOLDEN) & M64)

    def _uniform(self, key, index, bits):
        z = np.uint64(key) ^ ((bits.astype(np.uint64) << np.uint64(32)) | index.astype(np.uint64))
        return (mix64(z) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)

    def encode(self, x, key):
        """(codes as q + qmax + 1 with 0 for non-finite, one scale per block)."""
        x = np.ascontiguousarray(x, np.float32)
        n, zero, qmax = x.size, self.qmax + 1, np.float32(self.qmax)
        bits = x.view(np.uint32)
        finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
        codes = np.zeros(n, np.int64)
        scales = np.zeros(-(-n // self.block), np.float32)
        for b, first in enumerate(range(0, n, self.block)):
            sl = slice(first, min(n, first + self.block))
            xb, fb, bb = x[sl], finite[sl], bits[sl]
            amax = np.array(np.where(fb, bb & np.uint32(0x7FFFFFFF), 0).max(), np.uint32).view(np.float32)
            if amax == 0:
                codes[sl] = np.where(fb, zero, 0)
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                m = np.abs(np.where(fb, xb, np.float32(0))) / amax * qmax
            whole = m.astype(np.int64)
            frac = m - whole.astype(np.float32)
            if self.stochastic:
                up = self._uniform(key, np.arange(sl.start, sl.stop), bb) < frac
            else:
                up = (frac > np.float32(0.5)) | ((frac == np.float32(0.5)) & (whole % 2 == 1))
            q = whole + up
            q = np.where((bb >> np.uint32(31)) != 0, -q, q)
            codes[sl] = np.where(fb, q + zero, 0)
            scales[b] = amax / qmax
        return codes, scales

    def decode(self, codes, scales):
        per_value = np.repeat(scales, self.block)[:codes.size]
        with np.errstate(invalid="ignore"):
            values = (codes - (self.qmax + 1)).astype(np.float32) * per_value
        return np.where(codes == 0, np.float32(np.nan), values)

    def sent(self, x, name, rank):
        """What rank ``rank`` sends for float32 ``x`` (decoded), its residual updated."""
        x = np.asarray(x, np.float32).ravel()
        if self.error_feedback:
            residual = self.residuals.get((rank, name))
            if residual is None or residual.size != x.size:
                residual = np.zeros_like(x)
            x = x + residual
        key = self._key(rank, name) if self.stochastic else 0
        values = self.decode(*self.encode(x, key))
        if self.error_feedback:
            with np.errstate(invalid="ignore"):
                residual = x - values
            self.residuals[(rank, name)] = np.where(np.isfinite(residual), residual, np.float32(0))
        return values

    def reduce(self, xs, name, average=False):
        """The engine's result of an allreduce of every rank's ``xs[r]``
        (float32, or float16 widened and the result rounded back once)."""
        dtype = np.asarray(xs[0]).dtype
        total = np.zeros(np.asarray(xs[0]).size, np.float32)
        for r, x in enumerate(xs):
            total = total + self.sent(np.asarray(x).astype(np.float32), name, r)
        if average:
            total = total * np.float32(1.0 / len(xs))
        return total.reshape(np.asarray(xs[0]).shape).astype(dtype)
