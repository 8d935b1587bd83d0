"""Compressors on the wire (fp16, bf16, top-k and its DGC options, PowerSGD,
the 4- and 8-bit block quantizer) against NumPy references, with the bytes
they put on the wire.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 and 4 ranks through shared memory and
at 2 ranks through MPI. Each case starts its own engine with its HVDLITE_*
settings (the ``engine`` fixture of engine_fixture.py).
"""
import numpy as np

import hvdlite as hvd
from engine_fixture import SHM_OFF, delta, engine  # noqa: F401  (engine: a fixture)
from harness.checks import expect, require
from quantize_reference import QuantizeReference, wire_bytes


# ---------------------------------------------------------------- compression

def grad(r, step, size=20000, salt=0):
    return np.random.default_rng(1000 * r + step + salt).standard_normal(size).astype(np.float32)


# The engine sends tensors smaller than this whole (csrc/compressors/topk.h).
TOPK_SEND_WHOLE_BELOW = 1024


def topk_k(size, ratio):
    return size if size < TOPK_SEND_WHOLE_BELOW else max(1, int(np.ceil(ratio * size)))


def topk_dense(x, ratio):
    k = topk_k(x.size, ratio)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def test_fp16_allreduce_wire_bytes_and_rounding(engine):
    r, n = engine()
    x = grad(r, 0)
    before = hvd.engine_stats()
    got = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16, name="fp16.one")
    mid = hvd.engine_stats()
    hvd.allreduce(x, op=hvd.Average, name="fp32.one")
    after = hvd.engine_stats()
    xs = [grad(k, 0).astype(np.float64) for k in range(n)]
    ref = sum(xs) / n
    bound = (n + 1) * 2.0 ** -11 * sum(np.abs(v) for v in xs) / n + 1e-7
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= bound), f"fp16 error {err.max()} beyond rounding"
    assert got.dtype == np.float32
    fp16_bytes = delta(before, mid, "wire_bytes_fp16")
    fp32_bytes = delta(mid, after, "wire_bytes_none")
    assert fp16_bytes == x.size * 2 and fp32_bytes == x.size * 4, (fp16_bytes, fp32_bytes)
    # One host: the halves go through shared memory unless it is turned off,
    # and either wire sums them as the MPI op does (float32, rounded once per
    # addition): at 2 ranks that is exactly half(half(x0) + half(x1)).
    assert (delta(before, mid, "shm_collectives") == 0) == SHM_OFF, delta(before, mid, "shm_collectives")
    if n == 2:
        halves = [grad(k, 0).astype(np.float16).astype(np.float32) for k in range(n)]
        exact = (halves[0] + halves[1]).astype(np.float16).astype(np.float32) * np.float32(0.5)
        assert np.array_equal(got, exact), "fp16 sum differs from the MPI op's arithmetic"


def test_fp16_fused_group(engine):
    """Several tensors fused under fp16."""
    r, n = engine()
    xs = [grad(r, 1, 1000 + 10 * i) for i in range(8)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16.group")
    for i, got in enumerate(outs):
        ref = sum(grad(k, 1, 1000 + 10 * i).astype(np.float64) for k in range(n))
        np.testing.assert_allclose(got, ref, atol=(n + 1) * 2.0 ** -11 * 4 * n)


def test_fp16_reducescatter(engine):
    r, n = engine()
    m = np.ascontiguousarray(grad(r, 2, 6 * n).reshape(2 * n, 3))
    got = hvd.reducescatter(m, op=hvd.Sum, compression=hvd.Compression.fp16)
    full = sum(grad(k, 2, 6 * n).reshape(2 * n, 3).astype(np.float64) for k in range(n))
    np.testing.assert_allclose(got, full[2 * r:2 * r + 2], atol=(n + 1) * 2.0 ** -11 * 4 * n)


def test_topk_allreduce_and_wire_bytes(engine):
    r, n = engine()
    ratio = 0.01
    x = grad(r, 3)
    before = hvd.engine_stats()
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.topk(ratio, error_feedback=False),
                        name="topk.one")
    after = hvd.engine_stats()
    want = sum(topk_dense(grad(k, 3), ratio).astype(np.float64) for k in range(n))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    k = int(np.ceil(ratio * x.size))
    assert delta(before, after, "wire_bytes_topk") == k * 8, delta(before, after, "wire_bytes_topk")


def test_topk_fused_average(engine):
    """Average and several tensors fused: each tensor selects its own k, and
    those under TOPK_SEND_WHOLE_BELOW elements go whole."""
    r, n = engine()
    sizes = [500 + 300 * i for i in range(6)]
    xs = [grad(r, 4, size) for size in sizes]
    before = hvd.engine_stats()
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, name="topk.group",
                                 compression=hvd.Compression.topk(0.05, error_feedback=False))
    after = hvd.engine_stats()
    for size, got in zip(sizes, outs):
        want = sum(topk_dense(grad(kk, 4, size), 0.05).astype(np.float64) for kk in range(n)) / n
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert delta(before, after, "wire_bytes_topk") == sum(8 * topk_k(s, 0.05) for s in sizes)


def test_topk_error_feedback_converges(engine):
    """Nothing is lost: the running sum converges to the true one."""
    r, n = engine()

    def running_error(ef, steps=40, ratio=0.1):
        hvd.reset_compression_state()
        total_got = np.zeros(2000)
        total_true = np.zeros(2000)
        errors = []
        for t in range(steps):
            g = grad(r, 100 + t, 2000)
            total_got += hvd.allreduce(g, op=hvd.Average, name=f"ef.{ef}",
                                       compression=hvd.Compression.topk(ratio, error_feedback=ef))
            total_true += sum(grad(kk, 100 + t, 2000).astype(np.float64) for kk in range(n)) / n
            errors.append(np.linalg.norm(total_got - total_true) / np.linalg.norm(total_true))
        return errors
    with_ef = running_error(True)
    without = running_error(False)
    assert with_ef[-1] < 0.5 * without[-1], (with_ef[-1], without[-1])
    assert with_ef[-1] < with_ef[4], f"error feedback should converge: {with_ef[4]} -> {with_ef[-1]}"


def test_topk_bad_input(engine):
    engine()
    for bad in (0.0, 1.5, -0.1):
        expect(hvd.InvalidArgumentError, lambda: hvd.Compression.topk(bad), "(0, 1]")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(np.ones(10, np.int32), compression=hvd.Compression.topk(0.1)), "float32")


def bf16_round(x):
    """float32 -> nearest bfloat16 (ties to even), kept as float32."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def test_bf16_allreduce_wire_bytes_and_rounding(engine):
    r, n = engine()
    x = grad(r, 5) * np.float32(1e30)  # beyond fp16's range, within bfloat16's
    before = hvd.engine_stats()
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16, name="bf16.one")
    after = hvd.engine_stats()
    assert got.dtype == np.float32 and np.all(np.isfinite(got))
    assert delta(before, after, "wire_bytes_bf16") == x.size * 2, delta(before, after, "wire_bytes_bf16")
    xs = [grad(k, 5).astype(np.float64) * 1e30 for k in range(n)]
    bound = (n + 1) * 2.0 ** -8 * sum(np.abs(v) for v in xs)
    err = np.abs(got.astype(np.float64) - sum(xs))
    assert np.all(err <= bound), f"bf16 error {(err / bound).max()} x the rounding bound"
    if n == 2:  # both wires sum as the MPI op does: bf16(bf16(x0) + bf16(x1))
        parts = [bf16_round(grad(k, 5) * np.float32(1e30)) for k in range(n)]
        assert np.array_equal(got, bf16_round(parts[0] + parts[1])), "bf16 sum differs from the op's arithmetic"
    # Horovod's interface on NumPy: compress() casts (ml_dtypes' bfloat16) and decompress() undoes it.
    require("ml_dtypes")
    wire, ctx = hvd.Compression.bf16.compress(x)
    assert str(wire.dtype) == "bfloat16" and ctx == "float32"
    back = hvd.Compression.bf16.decompress(wire, ctx)
    assert back.dtype == np.float32 and np.array_equal(back, bf16_round(x))


def test_bf16_reducescatter_and_fused(engine):
    r, n = engine()
    m = np.ascontiguousarray(grad(r, 6, 6 * n).reshape(2 * n, 3))
    got = hvd.reducescatter(m, op=hvd.Sum, compression=hvd.Compression.bf16)
    full = sum(grad(k, 6, 6 * n).reshape(2 * n, 3).astype(np.float64) for k in range(n))
    np.testing.assert_allclose(got, full[2 * r:2 * r + 2], atol=(n + 1) * 2.0 ** -8 * 4 * n)
    xs = [grad(r, 7, 500 + 7 * i) for i in range(6)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, compression=hvd.Compression.bf16, name="bf16.group")
    for i, o in enumerate(outs):
        ref = sum(grad(k, 7, 500 + 7 * i).astype(np.float64) for k in range(n)) / n
        np.testing.assert_allclose(o, ref, atol=(n + 1) * 2.0 ** -8 * 4)


class DGCReference:
    """Deep Gradient Compression as the engine composes it (clip -> momentum
    correction -> error feedback -> top-k at the warm-up's density, momentum
    masked where sparse), every rank simulated in NumPy."""

    def __init__(self, n, size, ratio, momentum, warmup, clip):
        self.n, self.ratio, self.m, self.warmup, self.clip = n, ratio, np.float32(momentum), warmup, clip
        self.u = [np.zeros(size, np.float32) for _ in range(n)]
        self.v = [np.zeros(size, np.float32) for _ in range(n)]
        self.round = 0

    def step(self, grads):
        ratio = self.ratio if self.round >= self.warmup else self.ratio ** (self.round / self.warmup)
        self.round += 1
        size = grads[0].size
        k = topk_k(size, ratio)
        total = np.zeros(size, np.float32)
        for r in range(self.n):
            g = grads[r]
            norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
            if self.clip and norm > self.clip:
                g = g * np.float32(self.clip / norm)
            self.u[r] = self.m * self.u[r] + g
            t = self.u[r] + self.v[r]
            idx = np.argsort(-np.abs(t), kind="stable")[:k]
            sent = np.zeros_like(t)
            sent[idx] = t[idx]
            self.v[r] = t - sent
            if k < size:
                self.u[r][sent != 0] = 0
            total += sent
        return total, k


def test_topk_dgc_against_reference(engine):
    """Momentum correction, warm-up and clipping against DGCReference over
    steps that cross the end of the warm-up; wire bytes follow the density."""
    r, n = engine()
    size, ratio, warmup, clip = 20000, 0.01, 4, 120.0
    comp = hvd.Compression.topk(ratio, momentum_correction=0.9, warmup_steps=warmup, clip_norm=clip)
    ref = DGCReference(n, size, ratio, 0.9, warmup, clip)
    for t in range(8):
        before = hvd.engine_stats()
        got = hvd.allreduce(grad(r, 200 + t, size), op=hvd.Sum, compression=comp, name="dgc.one")
        after = hvd.engine_stats()
        want, k = ref.step([grad(kk, 200 + t, size) for kk in range(n)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
        assert delta(before, after, "wire_bytes_topk") == 8 * k, (t, delta(before, after, "wire_bytes_topk"), k)
    same = hvd.allgather(got[None], name="dgc.same")
    assert all(np.array_equal(same[i], got) for i in range(n)), "ranks differ"
    # reset_compression_state() starts the warm-up over: dense again.
    hvd.reset_compression_state()
    before = hvd.engine_stats()
    hvd.allreduce(grad(r, 299, size), op=hvd.Sum, compression=comp, name="dgc.one")
    assert delta(before, hvd.engine_stats(), "wire_bytes_topk") == 8 * size
    # Tensors the engine sends whole keep ordinary momentum: u = m u + g, nothing masked.
    small = [grad(r, 300 + t, 100) for t in range(3)]
    u = np.zeros(100, np.float32)
    for t in range(3):
        got = hvd.allreduce(small[t], op=hvd.Sum, compression=comp, name="dgc.small")
        us = []
        for kk in range(n):
            uk = np.zeros(100, np.float32)
            for tt in range(t + 1):
                uk = np.float32(0.9) * uk + grad(kk, 300 + tt, 100)
            us.append(uk)
        np.testing.assert_allclose(got, sum(us), rtol=1e-5, atol=1e-5)


def test_topk_dgc_arguments(engine):
    engine()
    expect(hvd.InvalidArgumentError, lambda: hvd.Compression.topk(0.01, momentum_correction=1.0), "[0, 1)")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.Compression.topk(0.01, error_feedback=False, momentum_correction=0.9),
           "error_feedback=True")
    expect(hvd.InvalidArgumentError, lambda: hvd.Compression.topk(0.01, warmup_steps=-1), ">= 0")
    expect(hvd.InvalidArgumentError, lambda: hvd.Compression.topk(0.01, clip_norm=-1.0), "clip_norm")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(np.ones(10, np.float32), name="dgc.true",
                                 compression=hvd.Compression.topk(0.01, momentum_correction=True)),
           "DistributedOptimizer", "momentum_correction=0.9")
    # Options are part of what ranks must agree on, like the ratio.
    assert hvd.Compression.topk(0.01, warmup_steps=3) == hvd.Compression.topk(0.01, warmup_steps=3)
    assert hvd.Compression.topk(0.01, warmup_steps=3) != hvd.Compression.topk(0.01, warmup_steps=4)


def _splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


def powersgd_start(name, cols, rank):
    """The engine's first Q^T (rank x cols): uniform in [-1, 1) from SplitMix64
    seeded with the FNV-1a hash of the tensor's name."""
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    out = np.empty(cols * rank, np.float32)
    state = h
    for i in range(out.size):
        state, z = _splitmix(state)
        out[i] = np.float32((z >> 11) * 2.0 ** -52 - 1.0)
    return out.reshape(rank, cols)


def gram_schmidt(p):
    p = p.astype(np.float64)
    for j in range(p.shape[1]):
        for k in range(j):
            p[:, j] -= (p[:, j] @ p[:, k]) * p[:, k]
        norm = np.linalg.norm(p[:, j])
        if norm > 0:
            p[:, j] /= norm
    return p


def test_powersgd_against_reference(engine):
    """Rank-2 PowerSGD of a 40 x 30 matrix (with a dense vector fused beside
    it) against NumPy: dense for start_iter rounds, then P = M Q, orthonormal
    P, Q = M^T P, P Q^T, error feedback and warm start; wire bytes."""
    r, n = engine()
    rows, cols, rank, start = 40, 30, 2, 2
    comp = hvd.Compression.powersgd(rank=rank, start_iter=start)
    q = powersgd_start("psgd.0", cols, rank).T.astype(np.float64)  # cols x rank
    errors = [np.zeros((rows, cols)) for _ in range(n)]
    for t in range(6):
        def mat(k):
            return grad(k, 400 + t, rows * cols).reshape(rows, cols)
        vec = grad(r, 500 + t, 50)
        before = hvd.engine_stats()
        got_m, got_v = hvd.grouped_allreduce([mat(r), vec], op=hvd.Sum, compression=comp, name="psgd")
        after = hvd.engine_stats()
        want_v = sum(grad(k, 500 + t, 50).astype(np.float64) for k in range(n))
        np.testing.assert_allclose(got_v, want_v, rtol=1e-5, atol=1e-5)
        if t < start:
            want_m = sum(mat(k).astype(np.float64) for k in range(n))
            wire = (rows * cols + 50) * 4
        else:
            ms = [mat(k).astype(np.float64) + errors[k] for k in range(n)]
            p = gram_schmidt(sum(m @ q for m in ms))
            q_sum = sum(m.T @ p for m in ms)
            want_m = p @ q_sum.T
            errors = [m - want_m / n for m in ms]
            q = q_sum / n
            wire = (rows * rank + 50 + cols * rank) * 4
        scale = np.abs(want_m).max()
        np.testing.assert_allclose(got_m, want_m, rtol=0, atol=2e-4 * scale, err_msg=f"step {t}")
        assert delta(before, after, "wire_bytes_powersgd") == wire, (t, delta(before, after, "wire_bytes_powersgd"))
    same = hvd.allgather(got_m[None], name="psgd.same")
    assert all(np.array_equal(same[i], got_m) for i in range(n)), "ranks differ"


def test_powersgd_arguments(engine):
    engine()
    for bad in (0, 65, 1.5, True):
        expect(hvd.InvalidArgumentError, lambda: hvd.Compression.powersgd(rank=bad), "rank")
    expect(hvd.InvalidArgumentError, lambda: hvd.Compression.powersgd(start_iter=-1), ">= 0")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.reducescatter(np.ones((4, 4), np.float32), compression=hvd.Compression.powersgd(2)),
           "allreduce only")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.allreduce(np.ones((4, 4), np.float64), compression=hvd.Compression.powersgd(2)),
           "float32")


# ---------------------------------------------------------------- block quantization

def same_bits(got, want):
    """Bitwise equality (NaNs included) of two arrays of one float dtype."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    unsigned = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    return np.array_equal(got.view(unsigned), want.view(unsigned))


def assert_same_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape)
    if not same_bits(got, want):
        g, w = got.ravel().astype(np.float32), want.ravel().astype(np.float32)
        bad = np.flatnonzero(~((g == w) | (np.isnan(g) & np.isnan(w))))
        raise AssertionError(f"{what}: {bad.size} values differ from the NumPy reference, first at "
                             f"{bad[:5]}: {g[bad[:5]]} != {w[bad[:5]]}")


def same_on_every_rank(result, name):
    everyone = hvd.allgather(np.ascontiguousarray(result)[None], name=name)
    return all(same_bits(everyone[i], everyone[0]) for i in range(len(everyone)))


def test_quantize_4bit_fused_sizes_not_multiple_of_block(engine):
    """Tensors of 1 to 4097 values, most not a multiple of the 64-value block,
    fused in one bucket: every rank's result is the reference's, bit for bit."""
    r, n = engine()
    sizes = [1, 2, 63, 64, 65, 127, 1000, 4097]
    comp = hvd.Compression.quantize(bits=4, rounding="nearest", error_feedback=False)
    ref = QuantizeReference(n, bits=4, block_size=64)
    outs = hvd.grouped_allreduce([grad(r, 600, s) for s in sizes], op=hvd.Sum, compression=comp, name="q4.sizes")
    for i, (size, got) in enumerate(zip(sizes, outs)):
        want = ref.reduce([grad(k, 600, size) for k in range(n)], f"q4.sizes.{i}")
        assert_same_bits(got, want, f"{size} values")
    assert same_on_every_rank(outs[-1], "q4.sizes.same"), "ranks differ"


def test_quantize_wire_bytes_about_an_eighth_of_float32(engine):
    """engine_stats() counts 4 bits per value and a float32 scale per 64
    values: 0.1406 of float32's bytes (bits=8: 0.2656)."""
    r, n = engine()
    x = grad(r, 601)
    before = hvd.engine_stats()
    hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.quantize(), name="q4.bytes")
    mid = hvd.engine_stats()
    hvd.allreduce(x, op=hvd.Average, name="q4.bytes.dense")
    after = hvd.engine_stats()
    q4, dense = delta(before, mid, "wire_bytes_quantize"), delta(mid, after, "wire_bytes_none")
    assert q4 == 4 * 313 + 10000 == wire_bytes(x.size) == hvd.Compression.quantize().wire_bytes(x.size), q4
    assert dense == 4 * x.size, dense
    assert abs(q4 / dense - (1 / 8 + 1 / 64)) < 1e-4, q4 / dense
    before = hvd.engine_stats()
    hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.quantize(bits=8), name="q8.bytes")
    q8 = delta(before, hvd.engine_stats(), "wire_bytes_quantize")
    assert q8 == wire_bytes(x.size, bits=8) == 4 * 313 + 20000, q8


def test_quantize_8bit_matches_reference(engine):
    r, n = engine()
    comp = hvd.Compression.quantize(bits=8, block_size=128, rounding="nearest", error_feedback=False)
    ref = QuantizeReference(n, bits=8, block_size=128)
    got = hvd.allreduce(grad(r, 602, 5000), op=hvd.Average, compression=comp, name="q8.one")
    assert_same_bits(got, ref.reduce([grad(k, 602, 5000) for k in range(n)], "q8.one", average=True), "8 bits")
    err = np.abs(got - sum(grad(k, 602, 5000) for k in range(n)) / n).max()
    assert err < 0.05, f"8-bit error {err}"


def test_quantize_stochastic_rounding_is_seeded(engine):
    """Stochastic rounding draws from (seed, name, step, index, value): the
    reference reproduces every step bit for bit, and another seed rounds
    differently."""
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="stochastic", error_feedback=False, seed=7)
    ref = QuantizeReference(n, stochastic=True, seed=7)
    for t in range(3):
        got = hvd.allreduce(grad(r, 603 + t, 3000), op=hvd.Average, compression=comp, name="q4.sr")
        want = ref.reduce([grad(k, 603 + t, 3000) for k in range(n)], "q4.sr", average=True)
        assert_same_bits(got, want, f"step {t}")
    other = hvd.allreduce(grad(r, 603, 3000), op=hvd.Average, name="q4.sr",
                          compression=hvd.Compression.quantize(rounding="stochastic", error_feedback=False, seed=8))
    first = QuantizeReference(n, stochastic=True, seed=8).reduce([grad(k, 603, 3000) for k in range(n)], "q4.sr",
                                                                 average=True)
    assert_same_bits(other, first, "seed 8, its first step")
    assert not same_bits(other, QuantizeReference(n, stochastic=True, seed=7).reduce(
        [grad(k, 603, 3000) for k in range(n)], "q4.sr", average=True)), "seeds 7 and 8 rounded alike"


def test_quantize_float16_input(engine):
    """float16 tensors are widened, quantized with error feedback, summed in
    float32 and rounded back once: float16 results, the reference's bits."""
    r, n = engine()
    comp = hvd.Compression.quantize()
    ref = QuantizeReference(n, error_feedback=True)
    before = hvd.engine_stats()
    for t in range(3):
        xs = [grad(k, 606 + t, 1000).astype(np.float16) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Average, compression=comp, name="q4.half")
        assert got.dtype == np.float16
        assert_same_bits(got, ref.reduce(xs, "q4.half", average=True), f"step {t}")
    assert delta(before, hvd.engine_stats(), "wire_bytes_quantize") == 3 * wire_bytes(1000)


def test_quantize_bfloat16_input(engine):
    ml_dtypes = require("ml_dtypes")
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="nearest", error_feedback=False)
    xs = [grad(k, 609, 777).astype(ml_dtypes.bfloat16) for k in range(n)]
    got = hvd.allreduce(xs[r], op=hvd.Sum, compression=comp, name="q4.bf16")
    want = QuantizeReference(n).reduce(xs, "q4.bf16")
    assert str(got.dtype) == "bfloat16" and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_quantize_zeros_stay_exact(engine):
    """An all-zero tensor, zero blocks beside non-zero ones and -0.0: exact zeros."""
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="stochastic", error_feedback=False)
    zeros = hvd.allreduce(np.zeros(300, np.float32), op=hvd.Sum, compression=comp, name="q4.zeros")
    assert np.array_equal(zeros, np.zeros(300, np.float32)) and not np.signbit(zeros).any()
    x = np.full(256, -0.0, np.float32)
    x[64:128] = grad(r, 610, 64)  # block 1 only
    got = hvd.allreduce(x, op=hvd.Sum, compression=comp, name="q4.zero.blocks")
    assert np.all(got[:64] == 0) and np.all(got[128:] == 0), "zero blocks moved"
    assert np.count_nonzero(got[64:128]) > 32, "block 1 lost"


def test_quantize_one_huge_value_costs_only_its_block(engine):
    """A value of 1e30 on rank 0 sets its block's scale: that block's other
    values round to 0 on rank 0, every other block keeps its resolution, and
    the huge value itself arrives to float32 precision."""
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="nearest", error_feedback=False)
    xs = [grad(k, 611, 640) for k in range(n)]
    xs[0][70] = np.float32(1e30)
    got = hvd.allreduce(xs[r], op=hvd.Sum, compression=comp, name="q4.huge")
    assert_same_bits(got, QuantizeReference(n).reduce(xs, "q4.huge"), "huge value")
    assert abs(got[70] / 1e30 - 1) < 1e-6, got[70]
    exact = sum(x.astype(np.float64) for x in xs)
    others = np.r_[0:64, 128:640]
    # Rounding to nearest: at most half a step (block max / 7 / 2) per rank.
    half_step = sum(np.abs(x[:640].reshape(10, 64)).max(axis=1) / 14 for x in xs[1:])
    half_step += np.abs(xs[0][:640].reshape(10, 64)).max(axis=1) / 14
    bound = np.repeat(half_step, 64)[others] * (1 + 1e-5)
    assert np.all(np.abs(got[others] - exact[others]) <= bound), "other blocks lost resolution"


def test_quantize_nan_and_inf_arrive_as_nan(engine):
    """NaN and +-inf inputs decode as NaN at their positions on every rank
    (documented propagation); the rest of their blocks keeps the finite
    values' scale, and error feedback keeps no residual for them, so the next
    step is finite again."""
    r, n = engine()
    comp = hvd.Compression.quantize()   # nearest, with error feedback
    ref = QuantizeReference(n, error_feedback=True)
    xs = [grad(k, 612, 300) for k in range(n)]
    xs[0][5] = np.nan
    xs[n - 1][100] = np.inf
    xs[n - 1][101] = -np.inf
    got = hvd.allreduce(xs[r], op=hvd.Sum, compression=comp, name="q4.nan")
    assert_same_bits(got, ref.reduce(xs, "q4.nan"), "with NaN and inf")
    assert np.array_equal(np.flatnonzero(~np.isfinite(got)), [5, 100, 101]) and np.isnan(got[[5, 100, 101]]).all()
    clean = [grad(k, 613, 300) for k in range(n)]
    after = hvd.allreduce(clean[r], op=hvd.Sum, compression=comp, name="q4.nan")
    assert np.isfinite(after).all(), "a non-finite value stayed in the residual"
    assert_same_bits(after, ref.reduce(clean, "q4.nan"), "the step after")
    assert same_on_every_rank(got, "q4.nan.same"), "ranks differ"


def test_quantize_identical_on_every_rank(engine):
    """Stochastic rounding with error feedback over a fused group and several
    steps: every rank ends with the same bits (and the reference's)."""
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="stochastic", seed=3)
    ref = QuantizeReference(n, stochastic=True, seed=3, error_feedback=True)
    sizes = [100, 2049, 64]
    for t in range(4):
        outs = hvd.grouped_allreduce([grad(r, 620 + t, s) for s in sizes], op=hvd.Average, compression=comp,
                                     name="q4.same")
        for i, (s, got) in enumerate(zip(sizes, outs)):
            want = ref.reduce([grad(k, 620 + t, s) for k in range(n)], f"q4.same.{i}", average=True)
            assert_same_bits(got, want, f"step {t}, tensor {i}")
        assert same_on_every_rank(np.concatenate(outs), f"q4.same.check.{t}"), f"step {t}: ranks differ"


def test_quantize_error_feedback_converges(engine):
    """The sum over steps of the quantized averages approaches the true sum
    with error feedback (the error stays one residual), not without."""
    r, n = engine()

    def running_error(ef, steps=30):
        hvd.reset_compression_state()
        total_got, total_true, errors = np.zeros(2000), np.zeros(2000), []
        comp = hvd.Compression.quantize(error_feedback=ef)
        for t in range(steps):
            total_got += hvd.allreduce(grad(r, 700 + t, 2000), op=hvd.Average, name=f"q4.ef.{ef}", compression=comp)
            total_true += sum(grad(k, 700 + t, 2000).astype(np.float64) for k in range(n)) / n
            errors.append(np.linalg.norm(total_got - total_true) / np.linalg.norm(total_true))
        return errors
    with_ef, without = running_error(True), running_error(False)
    assert with_ef[-1] < 0.5 * without[-1], (with_ef[-1], without[-1])
    assert with_ef[-1] < 0.5 * with_ef[0], f"error feedback should converge: {with_ef[0]} -> {with_ef[-1]}"
    assert with_ef[-1] < 0.05, with_ef[-1]


def test_quantize_error_feedback_matches_reference(engine):
    r, n = engine()
    comp = hvd.Compression.quantize(block_size=32)
    ref = QuantizeReference(n, block_size=32, error_feedback=True)
    for t in range(4):
        got = hvd.allreduce(grad(r, 640 + t, 1001), op=hvd.Sum, compression=comp, name="q4.efref")
        assert_same_bits(got, ref.reduce([grad(k, 640 + t, 1001) for k in range(n)], "q4.efref"), f"step {t}")


def test_quantize_reducescatter(engine):
    """Reducescatter: the whole tensor quantized, gathered and summed, each
    rank keeping its rows; float32 and float16."""
    r, n = engine()
    comp = hvd.Compression.quantize(rounding="nearest", error_feedback=False)
    for dtype in (np.float32, np.float16):
        xs = [grad(k, 650, 2 * n * 50).reshape(2 * n, 50).astype(dtype) for k in range(n)]
        got = hvd.reducescatter(xs[r], op=hvd.Average, compression=comp)
        want = QuantizeReference(n).reduce(xs, "rs", average=True)[2 * r:2 * r + 2]
        assert got.dtype == dtype
        assert_same_bits(got, want, f"{np.dtype(dtype).name} reducescatter")


def test_quantize_other_dtypes_go_uncompressed(engine):
    """float64 and integer tensors cross as they are, as under fp16."""
    r, n = engine()
    before = hvd.engine_stats()
    got = hvd.allreduce(np.arange(100, dtype=np.float64) * (r + 1), op=hvd.Sum,
                        compression=hvd.Compression.quantize(), name="q4.f64")
    assert np.array_equal(got, np.arange(100, dtype=np.float64) * (n * (n + 1) // 2))
    ints = hvd.allreduce(np.full(10, r, np.int32), op=hvd.Sum, compression=hvd.Compression.quantize(), name="q4.i32")
    assert np.array_equal(ints, np.full(10, n * (n - 1) // 2, np.int32))
    assert delta(before, hvd.engine_stats(), "wire_bytes_quantize") == 0


def test_quantize_ranks_must_agree(engine):
    """The quantizer's arguments are part of what ranks must agree on."""
    r, n = engine()
    expect(hvd.TensorMismatchError,
           lambda: hvd.allreduce(np.ones(10, np.float32), name="q4.mismatch",
                                 compression=hvd.Compression.quantize(seed=0 if r != 1 else 1)),
           "q4.mismatch", "compression", "seed=1")
    got = hvd.allreduce(np.ones(10, np.float32), op=hvd.Sum, compression=hvd.Compression.quantize(), name="q4.after")
    assert np.array_equal(got, np.full(10, n, np.float32)), got
