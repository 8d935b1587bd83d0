"""Compressors on the wire (fp16, bf16, top-k and its DGC options, PowerSGD)
against NumPy references, with the bytes they put on the wire.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 and 4 ranks through shared memory and
at 2 ranks through MPI. Each case starts its own engine with its HVDLITE_*
settings (the ``engine`` fixture of engine_fixture.py).
"""
import numpy as np

import hvdlite as hvd
from engine_fixture import SHM_OFF, delta, engine  # noqa: F401  (engine: a fixture)
from harness.checks import expect, require


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
