"""Several Python threads per rank submit collectives at once; every result is
checked against a NumPy reference built from every rank's (reproducible) input.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_reliability.py
runs it at 2 ranks. The threads run once, for the first case that needs them.

Names are unique per thread (thread t on every rank submits the same names in
the same order, but threads interleave differently on each rank). Some names
repeat across steps, so the response cache and fusion see concurrent work too.
"""
import os
import threading

import numpy as np
import pytest

import hvdlite as hvd

# The sanitizer run asks for fewer steps (it is several times slower).
THREADS, STEPS = 4, int(os.environ.get("HVDLITE_TEST_THREAD_STEPS", "300"))


def values(rank, tid, step, j, shape, dtype):
    # Multiples of 1/4 in [-4, 4]: sums and fp16 round trips are exact.
    rng = np.random.default_rng([rank, tid, step, j])
    return (rng.integers(-16, 17, size=shape) / 4.0).astype(dtype)


def batch(r, n, tid, step):
    """Submits three collectives; returns [(handle, expected result, label)]."""
    out = []
    # Cached name (reused every 5 steps; its shape changes every 60 steps),
    # fused with the other threads' tensors.
    size = 1 + ((step % 5) * 37 + (step // 60) * 13 + tid * 101) % 3000
    name = f"t{tid}.ar.{step % 5}"
    xs = [values(k, tid, step, 0, size, np.float32) for k in range(n)]
    out.append((hvd.allreduce_async(xs[r], op=hvd.Sum, name=name), np.sum(xs, axis=0), name))
    kind = step % 5
    name = f"t{tid}.s{step}.k{kind}"
    if kind == 0:
        xs = [values(k, tid, step, 1, (7, 3), np.float32) for k in range(n)]
        want = (np.sum(xs, axis=0) / n).astype(np.float32)
        h = hvd.allreduce_async(xs[r], op=hvd.Average, name=name, compression=hvd.Compression.fp16)
    elif kind == 1:
        xs = [values(k, tid, step, 1, ((k + step) % 3, 2), np.float64) for k in range(n)]
        want = np.concatenate(xs)
        h = hvd.allgather_async(xs[r], name=name)
    elif kind == 2:
        root = (step + tid) % n
        xs = [values(k, tid, step, 1, 11, np.float64).astype(np.int32) for k in range(n)]
        want = xs[root]
        h = hvd.broadcast_async(xs[r], root_rank=root, name=name)
    elif kind == 3:
        xs = [values(k, tid, step, 1, (2 * n, 2), np.float32) for k in range(n)]
        want = [np.concatenate([xs[k][2 * r:2 * r + 2] for k in range(n)])]
        h = hvd.alltoall_async(xs[r], name=name)
    else:
        xs = [values(k, tid, step, 1, (n + 1, 4), np.float64).astype(np.int64) for k in range(n)]
        total = np.sum(xs, axis=0)
        rows = [(n + 1) // n + (i < (n + 1) % n) for i in range(n)]
        start = sum(rows[:r])
        want = total[start:start + rows[r]]
        h = hvd.reducescatter_async(xs[r], op=hvd.Sum, name=name)
    out.append((h, want, name))
    name = f"t{tid}.s{step}.max"
    xs = [values(k, tid, step, 2, 5, np.float64).astype(np.int64) for k in range(n)]
    out.append((hvd.allreduce_async(xs[r], op=hvd.Max, name=name), np.max(xs, axis=0), name))
    return out


def worker(r, n, tid, steps, counts, errors):
    try:
        for step in range(steps):
            pending = batch(r, n, tid, step)
            for h, want, label in reversed(pending):  # wait in another order than submitted
                got = hvd.synchronize(h)
                if isinstance(want, list):  # alltoall: (data, splits)
                    got = got[0]
                    want = want[0]
                assert got.dtype == want.dtype and got.shape == want.shape, (label, got.shape, want.shape)
                assert np.array_equal(got, want), f"{label}: got {got} want {want}"
                counts[tid] += 1
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        errors.append(f"thread {tid}: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def threaded_cache():
    return {}


@pytest.fixture
def threaded(rank, size, threaded_cache):
    """(results checked per thread, errors, engine_stats() after) of THREADS
    threads running STEPS steps of three collectives each."""
    if not threaded_cache:
        counts = [0] * THREADS
        errors = []
        threads = [threading.Thread(target=worker, args=(rank, size, t, STEPS, counts, errors))
                   for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        threaded_cache["run"] = counts, errors, hvd.engine_stats()
    return threaded_cache["run"]


def test_every_result_matches_numpy(rank, threaded):
    counts, errors, stats = threaded
    assert not errors, errors
    assert sum(counts) == THREADS * STEPS * 3, counts
    print(f"RANK {rank} checked {sum(counts)} results from {THREADS} threads "
          f"(cache hits {stats['cache_hits']}, fused {stats['tensors_fused']})")


def test_concurrent_work_hits_the_cache_and_fuses(threaded):
    _, _, stats = threaded
    assert stats["cache_hits"] > 0 and stats["tensors_fused"] > 0, stats
