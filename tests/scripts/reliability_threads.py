"""Several Python threads per rank submit collectives at once; every result is
checked against a NumPy reference built from every rank's (reproducible) input.

usage: reliability_threads.py THREADS STEPS

Names are unique per thread (thread t on every rank submits the same names in
the same order, but threads interleave differently on each rank). Some names
repeat across steps, so the response cache and fusion see concurrent work too.
"""
import sys
import threading

import numpy as np

import hvdlite as hvd


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


def main():
    threads_n, steps = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    counts = [0] * threads_n
    errors = []
    threads = [threading.Thread(target=worker, args=(r, n, t, steps, counts, errors))
               for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert sum(counts) == threads_n * steps * 3, counts
    stats = hvd.engine_stats()
    assert stats["cache_hits"] > 0 and stats["tensors_fused"] > 0, stats
    print(f"RANK {r} checked {sum(counts)} results from {threads_n} threads "
          f"(cache hits {stats['cache_hits']}, fused {stats['tensors_fused']})", flush=True)
    print(f"RANK {r} OK", flush=True)


if __name__ == "__main__":
    main()
