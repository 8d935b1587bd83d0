"""Fusion, response cache, compression, timeline, stall inspector and engine
priority on real ranks.

A rank-side test module (see tests/rank_plugin.py); tests/test_engine_features.py
runs it at 2 and 4 ranks through shared memory and at 2 ranks through MPI.
Engine settings are read at init(), so each case starts its own engine with
its HVDLITE_* settings (the ``engine`` fixture). The wire is the launch's
choice: HVDLITE_SHM_ALLREDUCE stays as the launch set it for every engine.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import hvdlite as hvd
from checks import expect, require
from hvdlite import timeline

# Launched with HVDLITE_SHM_ALLREDUCE=0: every reduction must go through MPI.
SHM_OFF = os.environ.get("HVDLITE_SHM_ALLREDUCE") == "0"
# The launch's settings that every engine of the module keeps (the wire) and
# the harness's own variables; other HVDLITE_*/HOROVOD_* settings from the
# environment are removed so each case runs with defaults plus its own.
KEEP = ("HVDLITE_SHM_ALLREDUCE", "HVDLITE_RANK_REPORT", "HVDLITE_TEST_")
# The wire phase of a sum in the timeline.
WIRE = "MPI_ALLREDUCE" if SHM_OFF else "SHM_ALLREDUCE"


@pytest.fixture
def engine(monkeypatch):
    """``engine(**settings)`` shuts down any running engine, starts one with
    these settings and returns (rank, size). After the case: with
    HVDLITE_SHM_ALLREDUCE=0, no engine the case started reduced anything
    through shared memory; the engine is shut down, so the next case starts
    with its own settings."""
    shm_used = []

    def start(**settings):
        if hvd.is_initialized():
            shm_used.append(hvd.engine_stats()["shm_collectives"])
            hvd.shutdown()
        for key in [k for k in os.environ if k.startswith(("HVDLITE_", "HOROVOD_")) and not k.startswith(KEEP)]:
            monkeypatch.delenv(key)
        for key, value in settings.items():
            monkeypatch.setenv(key, str(value))
        hvd.init()
        return hvd.rank(), hvd.size()

    yield start
    if hvd.is_initialized():
        shm_used.append(hvd.engine_stats()["shm_collectives"])
        hvd.shutdown()
    if SHM_OFF:
        assert not any(shm_used), f"HVDLITE_SHM_ALLREDUCE=0, yet shared-memory collectives ran: {shm_used}"


@pytest.fixture
def shared_dir(rank):
    """A directory every rank of this host sees (rank 0's, broadcast), removed after the case."""
    from mpi4py import MPI
    path = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="hvdlite-features-") if rank == 0 else None, root=0)
    yield path
    MPI.COMM_WORLD.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def delta(before, after, key):
    return after[key] - before[key]


def test_init_accepts_dynamic_process_sets():
    """The first case: init(process_sets="dynamic") is Horovod's spelling (sets can be added any time)."""
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    first = hvd.add_process_set([0])
    if r == 0:
        assert np.array_equal(hvd.allreduce(np.full(2, 5, np.int64), op=hvd.Sum, process_set=first),
                              np.full(2, 5, np.int64))
    hvd.remove_process_set(first)
    got = hvd.allreduce(np.full(2, r, np.int64), op=hvd.Sum)
    assert np.array_equal(got, np.full(2, n * (n - 1) // 2, np.int64)), got


# ---------------------------------------------------------------- fusion

def mixed_inputs(r, steps_salt):
    rng = np.random.default_rng(10 * r + steps_salt)
    out = []
    for i in range(40):
        dtype = [np.float32, np.float64, np.int32, np.float16, np.int64][i % 5]
        n = [1, 7, 300, 5000, 70000][i % 5] + i  # some exceed the 64 KiB threshold
        if np.dtype(dtype).kind == "f":
            out.append(rng.standard_normal(n).astype(dtype))
        else:
            out.append(rng.integers(-1000, 1000, n).astype(dtype))
    return out


def run_mixed(r, op):
    xs = mixed_inputs(r, 1)
    handles = [hvd.allreduce_async(x, op=op, name=f"mixed.{i}") for i, x in enumerate(xs)]
    return [hvd.synchronize(h) for h in handles]


def test_fusion_matches_unfused(engine):
    results = {}
    for label, threshold in [("unfused", 0), ("fused", 64 * 1024)]:
        r, n = engine(HVDLITE_FUSION_THRESHOLD=threshold)
        before = hvd.engine_stats()
        results[label] = {op: run_mixed(r, op) for op in (hvd.Sum, hvd.Average)}
        stats = hvd.engine_stats()
        fused = delta(before, stats, "tensors_fused")
        if label == "unfused":
            assert fused == 0, f"threshold 0 must not fuse, fused {fused}"
        else:
            # How many share a bucket depends on which were ready everywhere in
            # the same round (timing); that some do is what this shows.
            assert fused >= 2 and delta(before, stats, "fused_buffers") >= 1, \
                f"expected fused tensors at 64 KiB, got {fused}"
    for op in (hvd.Sum, hvd.Average):
        for i, (a, b) in enumerate(zip(results["unfused"][op], results["fused"][op])):
            if n > 2 and a.dtype.kind == "f":
                # More ranks: MPI may pick another reduction order by message size.
                np.testing.assert_allclose(a, b, rtol=2e-3 if a.dtype == np.float16 else 1e-6)
            else:
                assert a.dtype == b.dtype and np.array_equal(a, b), f"fused != unfused for tensor {i} op {op}"
    # And the values are right.
    xs_all = [mixed_inputs(k, 1) for k in range(n)]
    for i, got in enumerate(results["fused"][hvd.Sum]):
        want = sum(x[i].astype(np.float64) for x in xs_all)
        tol = 2e-2 * n if got.dtype == np.float16 else 1e-5 * n
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


# ---------------------------------------------------------------- response cache

SHAPES = [(i % 7 + 1, 3) for i in range(50)]


def steady_steps(r, n, steps):
    """The same 50 named tensors every step; returns the cache hits they made."""
    before = hvd.engine_stats()
    for step in range(steps):
        xs = [np.full(s, r + step + i, np.float32) for i, s in enumerate(SHAPES)]
        hs = [hvd.allreduce_async(x, op=hvd.Sum, name=f"steady.{i}") for i, x in enumerate(xs)]
        for i, h in enumerate(hs):
            want = np.full(SHAPES[i], sum(k + step + i for k in range(n)), np.float32)
            assert np.array_equal(hvd.synchronize(h), want), f"step {step} tensor {i}"
    return delta(before, hvd.engine_stats(), "cache_hits")


def test_cache_steady_state_hits(engine):
    r, n = engine(HVDLITE_CACHE_CAPACITY=1024)
    hits = steady_steps(r, n, 20)
    assert hits >= 50 * 17, f"expected the steady loop to hit the cache, hits={hits}"


def test_cache_shape_change_of_a_cached_name(engine):
    r, n = engine(HVDLITE_CACHE_CAPACITY=1024)
    steady_steps(r, n, 3)  # the names are in the cache
    # A shape change under the same name, on every rank, stays right.
    for step in range(3):
        shape = (4 + step,)
        got = hvd.allreduce(np.full(shape, r, np.int64), op=hvd.Sum, name="steady.3")
        assert np.array_equal(got, np.full(shape, n * (n - 1) // 2, np.int64))
    # A shape change on one rank only is a mismatch error, and the cache recovers.
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(3 + (r == 1), np.float32), name="steady.4"),
           "steady.4")
    assert np.array_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, name="steady.4"),
                          np.full(2, n, np.float32))


def test_cache_eviction_over_capacity(engine):
    """50 names through 16 slots, in a different order on every rank."""
    r, n = engine(HVDLITE_CACHE_CAPACITY=16)
    before = hvd.engine_stats()
    for step in range(6):
        order = np.random.default_rng(step * 10 + r).permutation(50)  # ranks differ in order
        hs = {i: hvd.allreduce_async(np.full(SHAPES[i], step * i + r, np.int32), op=hvd.Sum, name=f"evict.{i}")
              for i in order}
        for i, h in hs.items():
            assert np.array_equal(hvd.synchronize(h), np.full(SHAPES[i], n * step * i + n * (n - 1) // 2, np.int32))
    after = hvd.engine_stats()
    assert delta(before, after, "cache_hits") > 0


def test_cache_disabled(engine):
    """Capacity 0: no hits, still right."""
    r, n = engine(HVDLITE_CACHE_CAPACITY=0)
    before = hvd.engine_stats()
    for step in range(3):
        got = hvd.allreduce(np.full(5, r, np.float64), op=hvd.Sum, name="nocache")
        assert np.array_equal(got, np.full(5, n * (n - 1) / 2))
    assert delta(before, hvd.engine_stats(), "cache_hits") == 0


# ---------------------------------------------------------------- shared settings

def test_ranks_share_rank_0s_wire_settings(engine, rank, tmp_path):
    """A rank started with other fusion, response-cache and chunk settings
    than rank 0 (they decide which collectives run) uses rank 0's, says so on
    stderr, and the results are right."""
    mine = {"HVDLITE_TIMEOUT_SECONDS": 30}
    if rank == 1:
        mine.update(HVDLITE_FUSION_THRESHOLD=1024, HVDLITE_CACHE_CAPACITY=3, HVDLITE_SHM_CHUNK_BYTES=8192)
    log = tmp_path / "stderr.txt"
    saved = os.dup(2)
    try:
        with open(log, "w") as f:
            os.dup2(f.fileno(), 2)  # the engine writes the warning from C
            r, n = engine(**mine)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    said = log.read_text()
    before = hvd.engine_stats()["fused_buffers"]
    for step in range(3):  # negotiated, then from the response cache
        outs = hvd.grouped_allreduce([np.full(1000 + i, r + 1.0, np.float32) for i in range(8)],
                                     op=hvd.Sum, name="shared.settings")
        for i, got in enumerate(outs):
            assert np.array_equal(got, np.full(1000 + i, n * (n + 1) / 2, np.float32)), (step, i)
    fused = hvd.engine_stats()["fused_buffers"] - before
    assert len(set(hvd.allgather(np.array([fused]), name="shared.fused").tolist())) == 1
    warned = "set differently than on rank 0" in said
    assert warned == (rank == 1), said
    if rank == 1:
        assert ("rank 0: HVDLITE_FUSION_THRESHOLD, HVDLITE_CACHE_CAPACITY, HVDLITE_SHM_CHUNK_BYTES; using "
                "rank 0's values" in said), said


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


# ---------------------------------------------------------------- timeline

def check_balanced(events):
    depth = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            depth[key] = depth.get(key, 0) + 1
        elif e.get("ph") == "E":
            depth[key] = depth.get(key, 0) - 1
            assert depth[key] >= 0, f"E without B on {key}"
    return depth


def write_timeline(r, pattern):
    """An engine writing ``pattern``, running fused, compressed and gathered collectives."""
    for step in range(3):
        hvd.grouped_allreduce([np.ones(100 + i, np.float32) for i in range(4)], name="tl.group")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.fp16, name="tl.fp16")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.topk(0.1), name="tl.topk")
        hvd.allgather(np.ones((r + 1, 2), np.float32), name="tl.gather")
    hvd.stop_timeline()


def test_timeline_phases_and_rows(engine, tmp_path):
    pattern = str(tmp_path / "timeline-%r.json")
    r, n = engine(HVDLITE_TIMELINE=pattern, HVDLITE_FUSION_THRESHOLD=1 << 20)
    write_timeline(r, pattern)
    events = timeline.load(pattern.replace("%r", str(r)))
    names = {e.get("name") for e in events}
    # One host: sums (fp32 and fp16's halves) go through shared memory unless
    # it is turned off; top-k's allgather always through MPI.
    for phase in ["NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER", "QUEUE", "ALLREDUCE",
                  "MEMCPY_IN_FUSION_BUFFER", WIRE, "MEMCPY_OUT_FUSION_BUFFER", "COMPRESS", "DECOMPRESS",
                  "MPI_ALLGATHER", "ALLGATHER"]:
        assert phase in names, f"timeline lacks {phase}: {sorted(n for n in names if n)}"
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"allreduce.tl.group.0", "allreduce.tl.fp16", "allreduce.tl.topk",
            "allgather.tl.gather"} <= rows, rows


def test_timeline_merge_of_every_rank(engine, shared_dir):
    """python -m hvdlite.timeline merge joins the ranks' files: one pid per rank."""
    pattern = os.path.join(shared_dir, "timeline-%r.json")
    r, n = engine(HVDLITE_TIMELINE=pattern, HVDLITE_FUSION_THRESHOLD=1 << 20)
    write_timeline(r, pattern)
    hvd.barrier()  # every rank's file is complete
    if r == 0:
        out = os.path.join(shared_dir, "merged.json")
        subprocess.run([sys.executable, "-m", "hvdlite.timeline", "merge", "-o", out,
                        *[pattern.replace("%r", str(k)) for k in range(n)]], check=True)
        with open(out) as f:
            merged = json.load(f)
        pids = {e["pid"] for e in merged["traceEvents"] if "pid" in e}
        assert pids == set(range(n)), pids


def test_timeline_started_at_run_time(engine, tmp_path):
    r, n = engine()
    path = str(tmp_path / "runtime-%r.json")
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.runtime")
    hvd.stop_timeline()
    assert "tl.runtime" in open(path.replace("%r", str(r))).read()


def test_timeline_dynamic(engine, tmp_path, monkeypatch):
    """HOROVOD_TIMELINE=DYNAMIC: no file at init, start_timeline() later."""
    monkeypatch.chdir(tmp_path)
    r, n = engine(HOROVOD_TIMELINE="DYNAMIC")
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic")
    assert not os.path.exists(tmp_path / "DYNAMIC"), "a file named DYNAMIC was written"
    path = str(tmp_path / "runtime-%r.json")
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic.on")
    hvd.stop_timeline()
    assert "tl.dynamic.on" in open(path.replace("%r", str(r))).read()


def test_timeline_unwritable_path(engine):
    engine()
    expect(hvd.InvalidArgumentError, lambda: hvd.start_timeline("/proc/no-such-dir/tl-%r.json"), "no-such-dir")


def row_spans(events):
    """{row label: [(depth, phase)]} in the order the phases began."""
    labels = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    depth, spans = {}, {}
    for e in events:
        if e.get("ph") == "B":
            d = depth.get(e["tid"], 0)
            spans.setdefault(labels[e["tid"]], []).append((d, e["name"]))
            depth[e["tid"]] = d + 1
        elif e.get("ph") == "E":
            depth[e["tid"]] -= 1
    return spans


def test_timeline_horovod_layout(engine, tmp_path):
    """The timeline reads like Horovod's: a row per tensor labelled
    "<op>.<name>", NEGOTIATE_<OP> then the operation's span with its
    activities nested, times counted from start_time_since_epoch_in_micros."""
    pattern = str(tmp_path / "horovod-layout-%r.json")
    started_us = time.time() * 1e6
    r, n = engine(HOROVOD_TIMELINE=pattern, HOROVOD_TIMELINE_MARK_CYCLES=1)
    path = pattern.replace("%r", str(r))
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum, name="hl.sum"), x * n)
    # Tools may read the file while the run goes on.
    deadline = time.time() + 2
    while "allreduce.hl.sum" not in open(path).read():
        assert time.time() < deadline, "the row did not reach the file within 2 s"
        time.sleep(0.01)
    hvd.allreduce(x, op=hvd.Sum)  # unnamed: the engine's own name
    assert hvd.allgather(x, name="hl.gather").shape == (n * n, 2)
    assert np.array_equal(hvd.broadcast(x + r, 0, name="hl.bcast"), x)
    received, _ = hvd.alltoall(x + r, name="hl.a2a")  # row r of every rank
    assert np.array_equal(received[:, 0], np.arange(n) + 2 * r), received
    assert np.array_equal(hvd.reducescatter(x, op=hvd.Sum, name="hl.rs"), x[r:r + 1] * n)
    mine = "allreduce" if r == 0 else "allgather"
    expect(hvd.TensorMismatchError, lambda: getattr(hvd, mine)(x, name="hl.mismatch"))
    pset = hvd.add_process_set([0])
    hvd.remove_process_set(pset)
    hvd.barrier()
    hvd.stop_timeline()
    stopped_us = time.time() * 1e6

    events = timeline.load(path)
    start = timeline.start_time_us(events)
    assert started_us - 1e6 <= start <= stopped_us, (started_us, start)
    ts = [e["ts"] for e in events if "ts" in e]
    assert min(ts) >= 0 and start + max(ts) <= stopped_us + 1e6, (min(ts), max(ts))
    assert "CYCLE_START" in {e.get("name") for e in events}
    spans = row_spans(events)
    expected = {"allreduce.hl.sum": ("ALLREDUCE", {"QUEUE", "MEMCPY_IN_FUSION_BUFFER", WIRE,
                                                   "MEMCPY_OUT_FUSION_BUFFER"}),
                "allgather.hl.gather": ("ALLGATHER", {"QUEUE", "MPI_ALLGATHER"}),
                "broadcast.hl.bcast": ("BROADCAST", {"QUEUE", "MPI_BCAST"}),
                "alltoall.hl.a2a": ("ALLTOALL", {"QUEUE", "MPI_ALLTOALL"}),
                "reducescatter.hl.rs": ("REDUCESCATTER", {"QUEUE", "MPI_REDUCESCATTER"})}
    for row, (op, activities) in expected.items():
        got = spans.get(row)
        assert got and got[:2] == [(0, "NEGOTIATE_" + op), (0, op)], (row, got)
        assert {name for d, name in got[2:]} == activities and all(d == 1 for d, _ in got[2:]), \
            (row, got)
    assert spans[f"{mine}.hl.mismatch"][:2] == [(0, f"NEGOTIATE_{mine.upper()}"), (0, "ERROR")]
    unnamed = [row for row in spans if row.startswith("allreduce.noname.")]
    assert len(unnamed) == 1 and spans[unnamed[0]][1] == (0, "ALLREDUCE"), sorted(spans)
    assert not [row for row in spans if row.startswith("allreduce.allreduce.")], sorted(spans)
    for op in ("ADD_PROCESS_SET", "REMOVE_PROCESS_SET", "BARRIER"):
        rows = [v for k, v in spans.items() if k.startswith(op.lower() + ".noname.")]
        assert len(rows) == 1 and rows[0][:2] == [(0, "NEGOTIATE_" + op), (0, op)], (op, sorted(spans))
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    ends = [e for e in events if e.get("ph") == "E" and e.get("name") == "ALLREDUCE"]
    assert ends and all({"dtype", "shape"} <= set(e.get("args", {})) for e in ends), ends


# ---------------------------------------------------------------- stall inspector

def test_stall_warning_names_the_missing_rank(engine, capfd):
    """Rank 0 submits a tensor 3.5 s before the others: it still completes, and
    the coordinator's stall inspector warns on stderr, naming the late ranks."""
    r, n = engine(HVDLITE_STALL_CHECK_TIME_SECONDS=1)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
        stats_before = hvd.engine_stats()
    time.sleep(3.5)
    if r != 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
    assert np.array_equal(hvd.synchronize(h), np.full(3, n, np.float32))
    if r == 0:
        assert hvd.engine_stats()["stall_warnings"] > stats_before["stall_warnings"]
        err = capfd.readouterr().err
        late = ", ".join(str(k) for k in range(1, n))
        for words in ["stall inspector", "stalled.tensor", f"not by ranks [{late}]"]:
            assert words in err, f"stderr lacks {words!r}:\n{err}"


def test_stall_shutdown_fails_every_rank(engine):
    """With a shutdown time, the stalled tensor fails on every rank."""
    r, n = engine(HVDLITE_STALL_CHECK_TIME_SECONDS=1, HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=2)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), name="never.everywhere")
        e = expect(hvd.StallError, lambda: hvd.synchronize(h), "never.everywhere")
        assert "[1" in str(e), str(e)
    else:
        time.sleep(0.5)  # so that rank 0's tensor is the oldest stalled one
        h = hvd.allreduce_async(np.ones(2, np.float32), name="only.here")
        expect(hvd.StallError, lambda: hvd.synchronize(h), "never.everywhere")


# ---------------------------------------------------------------- engine thread priority

def _engine_tid():
    """The engine thread's id. Threads it starts (MPI's) inherit its name and
    may come and go; the engine is the oldest of them."""
    named, names = [], {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[tid] = f.read().strip()
        except FileNotFoundError:
            continue
        if names[tid] == "hvdlite-engine":
            named.append(int(tid))
    assert named, f"no hvdlite-engine thread in this process: {names}"
    return min(named)


def engine_thread_policy():
    return os.sched_getscheduler(_engine_tid())


def _auto_policy(threads, ranks):
    """What HVDLITE_ENGINE_PRIORITY=auto should choose on this host (the whole
    job runs on it): idle once ranks x reported threads fill its usable cores."""
    full = threads > 0 and threads * ranks >= len(os.sched_getaffinity(0))
    return os.SCHED_IDLE if full else os.SCHED_OTHER


@pytest.mark.parametrize("name,threads,policy", [
    ("normal", 0, os.SCHED_OTHER), ("batch", 0, os.SCHED_BATCH), ("idle", 0, os.SCHED_IDLE),
    ("normal", 64, os.SCHED_OTHER),        # a policy the user set wins over the report
    ("auto", 0, os.SCHED_OTHER),           # nothing reported (NumPy collectives): normal
    ("auto", 64, os.SCHED_IDLE),           # more threads than cores: idle
    ("auto", 1, "rule"),                   # idle exactly where ranks fill the cores
    (None, 64, os.SCHED_IDLE),             # auto is the default
])
def test_engine_priority(engine, name, threads, policy):
    """HVDLITE_ENGINE_PRIORITY sets the engine thread's scheduling policy (the
    training threads keep theirs) and changes nothing in the results; auto, the
    default, lowers it to idle when the reported compute threads fill this
    host's cores."""
    rng = np.random.default_rng(7)
    data = [rng.standard_normal(size).astype(np.float32) * (k + 1)
            for k, size in enumerate([3, 70000, 300000])]          # fused, and above the threshold
    r, n = engine(**({} if name is None else {"HVDLITE_ENGINE_PRIORITY": name}))
    if threads:
        hvd.set_compute_threads(threads)
    hvd.allreduce(np.zeros(1, np.float32), name=f"prio.{name}.{threads}.first")  # a round after the report
    if policy == "rule":
        policy = _auto_policy(threads, n)
    assert engine_thread_policy() == policy, (name, threads, engine_thread_policy())
    assert hvd.engine_stats()["engine_idle_priority"] == int(policy == os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    handles = [hvd.allreduce_async(x * (r + 1), op=hvd.Sum, name=f"prio.{name}.{threads}.{k}")
               for k, x in enumerate(data)]
    for x, h in zip(data, handles):
        want = x * (n * (n + 1) // 2)   # sum over ranks of x * (r + 1)
        np.testing.assert_allclose(hvd.synchronize(h), want, rtol=1e-6, atol=1e-6)
    got = hvd.allgather(np.full((1, 2), r, np.int64), name=f"prio.{name}.{threads}.gather")
    assert np.array_equal(got, np.repeat(np.arange(n), 2).reshape(n, 2)), got


def _affinity_stats():
    stats = hvd.engine_stats()
    return {k: stats[k] for k in ("engine_idle_priority", "engine_follows_waiter",
                                  "engine_affinity_pins", "engine_affinity_releases",
                                  "engine_affinity_chose_pinned", "engine_affinity_chose_unpinned")}


def _checked_sum(r, n, name, count=200_000):
    """A float32 allreduce (Sum) whose result every rank checks."""
    x = np.arange(count, dtype=np.float32) % 1000
    got = hvd.allreduce(x * (r + 1), op=hvd.Sum, name=name)
    np.testing.assert_array_equal(got, x * (n * (n + 1) // 2))


@pytest.mark.parametrize("setting,priority,follows", [
    ("follow", "normal", True), ("none", "idle", False), ("auto", "idle", True),
    ("auto", "normal", False), (None, "idle", True),   # auto is the default
])
def test_engine_affinity(engine, setting, priority, follows):
    """HVDLITE_ENGINE_AFFINITY: with follow a thread that waits for the
    engine's work pins the engine thread to the core it waits on; none leaves
    the engine on the process's cores; auto, where the engine runs at idle
    priority, follows too but tries both (its first steps roam, see
    test_engine_affinity_trial). The sums are the same either way."""
    settings = {"HVDLITE_ENGINE_PRIORITY": priority}
    if setting is not None:
        settings["HVDLITE_ENGINE_AFFINITY"] = setting
    r, n = engine(**settings)
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    os.sched_setaffinity(0, {mine})   # this thread only (the engine keeps its own mask)
    try:
        _checked_sum(r, n, f"affinity.{setting}.{priority}")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        # A rank that is done shuts the engines down: everyone checks first.
        _checked_sum(r, n, f"affinity.{setting}.{priority}.checked")
        assert stats["engine_follows_waiter"] == int(follows), stats
        if not follows:
            assert engine_cores == cores
            assert stats["engine_affinity_pins"] == 0, stats
        elif setting != "follow":   # the trial's arm: roaming or pinned here
            assert engine_cores in (cores, {mine}), engine_cores
        else:
            assert stats["engine_affinity_pins"] >= 1, stats
            if n <= len(cores):   # more ranks than cores may queue engines behind each other
                assert stats["engine_affinity_releases"] == 0, stats
                assert engine_cores == {mine}
    finally:
        os.sched_setaffinity(0, cores)


@pytest.mark.parametrize("setting,trials", [("auto", True), ("follow", False)])
def test_engine_affinity_trial(engine, setting, trials):
    """With auto (at idle priority) the engine times the steps between a wait
    and the next submission unpinned and pinned, in turns, and keeps the arm
    whose median step is shorter: after 13 steps each rank has chosen once,
    both arms have run (the pin was taken), and the engine's mask is what it
    chose. follow pins and never tries. The sums are right in either arm."""
    r, n = engine(HVDLITE_ENGINE_PRIORITY="idle", HVDLITE_ENGINE_AFFINITY=setting)
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    os.sched_setaffinity(0, {mine})
    try:
        # A step: several tensors submitted, then waited for, as
        # DistributedOptimizer does; the first submission after the wait
        # starts the next step.
        for step in range(16):
            handles = [hvd.allreduce_async(np.full(50_000, r + 1.0, np.float32), op=hvd.Sum,
                                           name=f"trial.{setting}.{k}") for k in range(3)]
            for h in handles:
                np.testing.assert_array_equal(hvd.synchronize(h), np.full(50_000, n * (n + 1) / 2))
        # The submission that ends the last timed step.
        _checked_sum(r, n, f"trial.{setting}.last")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        _checked_sum(r, n, f"trial.{setting}.checked")
        chose = stats["engine_affinity_chose_pinned"] + stats["engine_affinity_chose_unpinned"]
        if not trials:
            assert chose == 0, stats
        elif stats["engine_follows_waiter"]:   # a busy core can stop the following first
            assert chose == 1, stats
            assert stats["engine_affinity_pins"] >= 1, stats
            if stats["engine_affinity_chose_unpinned"]:
                assert engine_cores == cores
            elif n <= len(cores) and stats["engine_affinity_releases"] == 0:
                assert engine_cores == {mine}
    finally:
        os.sched_setaffinity(0, cores)


def test_engine_affinity_released_when_core_is_busy(engine):
    """A pinned engine gives way: a late peer leaves the pin alone (the engine
    sleeps), but when another program keeps the pinned core busy, the waiting
    thread gives the engine its cores back, and after three such waits in a
    row stops pinning it. The sums stay right throughout."""
    r, n = engine(HVDLITE_ENGINE_PRIORITY="idle", HVDLITE_ENGINE_AFFINITY="follow")
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    exclusive = n <= len(cores)
    os.sched_setaffinity(0, {mine})
    hog = None
    try:
        _checked_sum(r, n, "affinity.pin")
        if r == 1:
            time.sleep(0.3)
        _checked_sum(r, n, "affinity.late_peer")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        hvd.barrier()
        if exclusive:
            assert engine_cores == {mine}
            assert stats["engine_affinity_releases"] == 0, stats
        if r == 0:
            hog = subprocess.Popen([sys.executable, "-c",
                                    f"import os\nos.sched_setaffinity(0, {{{mine}}})\nwhile True:\n    pass"])
            time.sleep(0.3)   # spinning on this rank's core
        # Not every wait finds the engine pinned (it may finish the work first),
        # so enough rounds for three releases.
        for i in range(12):
            _checked_sum(r, n, f"affinity.busy.{i}")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        _checked_sum(r, n, "affinity.busy.checked")
        if r == 0:
            assert stats["engine_affinity_releases"] >= 3, stats
            assert stats["engine_follows_waiter"] == 0, stats
            assert engine_cores == cores
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, cores)


@pytest.mark.parametrize("setting", ["1", "0", "auto"])
def test_shm_streaming_stores(engine, setting):
    """HVDLITE_SHM_STREAMING_STORES: 1 writes every byte of the shared-memory
    slots and of the results with streaming stores (per rank, the tensors'
    bytes into the slots and again into the outputs), 0 none, auto (the
    default) probes them on every 64th chunk; the sums are the same every way."""
    rng = np.random.default_rng(11)
    # Each above the direct threshold (1 MB), so each is one shared-memory call
    # of exactly its own bytes; the last spans 128 chunks of 128 KB.
    data = [rng.standard_normal(300_001).astype(np.float32),
            rng.integers(-1000, 1000, 150_003).astype(np.int64),
            rng.standard_normal(140_000).astype(np.float64),
            rng.standard_normal(4 << 20).astype(np.float32)]
    r, n = engine(HVDLITE_SHM_STREAMING_STORES=setting)
    before = hvd.engine_stats()
    handles = [hvd.allreduce_async(x * (r + 1), op=hvd.Sum, name=f"stores.{setting}.{k}")
               for k, x in enumerate(data)]
    for x, h in zip(data, handles):
        want = x * (n * (n + 1) // 2)
        if x.dtype == np.int64:
            assert np.array_equal(hvd.synchronize(h), want)
        else:
            np.testing.assert_allclose(hvd.synchronize(h), want, rtol=1e-6, atol=1e-5)
    after = hvd.engine_stats()
    streamed = after["shm_streamed_bytes"] - before["shm_streamed_bytes"]
    total = sum(x.nbytes for x in data)
    if SHM_OFF or setting == "0":
        assert streamed == 0, streamed
        assert after["shm_store_switches"] == 0
    elif setting == "1":
        assert streamed == 2 * total, (streamed, total)
        assert after["shm_store_switches"] == 0
    else:
        assert 0 < streamed <= 2 * total, (streamed, total)
