"""Fusion, the response cache, the wire settings ranks take from rank 0 and
shared memory's streaming stores, on real ranks.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 and 4 ranks through shared memory and
at 2 ranks through MPI. Each case starts its own engine with its HVDLITE_*
settings (the ``engine`` fixture of engine_fixture.py).
"""
import os

import numpy as np
import pytest

import hvdlite as hvd
from engine_fixture import SHM_OFF, delta, engine  # noqa: F401  (engine: a fixture)
from harness.checks import expect


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


# ---------------------------------------------------------------- shared-memory stores

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
