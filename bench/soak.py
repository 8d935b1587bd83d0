"""Soak test: many steps of mixed collectives, every result checked, memory
and file descriptors watched.

    mpiexec -n 2 python bench/soak.py                 # 10,000 steps
    mpiexec -n 2 python bench/soak.py --steps 500 --warmup 100 --json /tmp/soak.json

Every step submits ~45 tensors in a rank-dependent order: float32 sums that
fuse (some above the fusion threshold, so they go to MPI directly), float16
and int64 reductions, fp16- and top-k-compressed reductions (top-k with and
without error feedback), allgather, broadcast, alltoall, reducescatter, and
one tensor with a new name per step, which with a small response cache keeps
evicting slots. A timeline is started and stopped every 200 steps. Inputs are
multiples of 1/4 so every reference is exact.

RSS (the highest value in the last 20 % of warm-up, then at the end), the bytes
malloc has handed out (glibc's mallinfo2, which fragmentation does not move)
and open descriptors are compared between the end of warm-up and the end;
``--json PATH`` writes each rank's figures to PATH.<rank>.
"""
import argparse
import ctypes
import json
import math
import os
import sys
import tempfile
import time

import numpy as np


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def heap_kb():
    """Bytes malloc has handed out and not got back (all arenas + mmapped
    blocks), in kB: unlike RSS, it does not move with fragmentation. -1 when
    the C library has no mallinfo2 (glibc < 2.33, musl)."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return -1
    f.restype = _MallInfo2
    m = f()
    return (m.uordblks + m.hblkhd) // 1024


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def quarters(rng, size):
    return (rng.integers(-40, 41, size=size) / 4.0).astype(np.float32)


def distinct(rng, size):
    """Distinct magnitudes, so each rank's top-k set is unique."""
    signs = rng.choice([-1.0, 1.0], size=size)
    return ((rng.permutation(size) + 1) / 4.0 * signs).astype(np.float32)


# The engine sends tensors of fewer entries whole (csrc/compressors/topk.h).
TOPK_SEND_WHOLE_BELOW = 1024


def topk_dense(x, ratio):
    k = x.size if x.size < TOPK_SEND_WHOLE_BELOW else math.ceil(ratio * x.size)
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x))[:k]
    out[idx] = x[idx]
    return out


class Workload:
    SIZES = [3, 50, 700, 4000, 20000]  # 20000 float32 > the 64 KiB threshold

    def __init__(self, hvd, n):
        self.hvd = hvd
        self.n = n
        self.g = [[quarters(np.random.default_rng([k, 0, i]), self.SIZES[i % 5]) for i in range(24)]
                  for k in range(n)]
        self.g_sum = [np.sum([self.g[k][i] for k in range(n)], axis=0) for i in range(24)]
        self.h = [[quarters(np.random.default_rng([k, 1, i]), 300).astype(np.float16) for i in range(2)]
                  for k in range(n)]
        self.i64 = [[np.random.default_rng([k, 2, i]).integers(-1000, 1000, 500) for i in range(2)]
                    for k in range(n)]
        self.c16 = [[quarters(np.random.default_rng([k, 3, i]), 1000) for i in range(4)] for k in range(n)]
        # 700 entries go whole, 1300 through the top-k selection.
        self.tk = [[distinct(np.random.default_rng([k, 4, i]), 700 + 600 * i) for i in range(2)]
                   for k in range(n)]
        self.tk_dense = [np.sum([topk_dense(self.tk[k][i], 0.1) for k in range(n)], axis=0) for i in range(2)]
        self.tkef = [distinct(np.random.default_rng([k, 5]), 2000) for k in range(n)]
        self.rows = [quarters(np.random.default_rng([k, 6]), (2 * n, 3)) for k in range(n)]

    def submit(self, r, step):
        """Returns [(handle, check(result) -> bool, label)] in a rank-dependent order."""
        hvd, n = self.hvd, self.n
        m = float(1 + step % 3)  # scaling keeps the values exact and top-k sets unchanged
        jobs = []
        for i in range(24):
            jobs.append((lambda i=i: hvd.allreduce_async(self.g[r][i] * m, op=hvd.Sum, name=f"g.{i}"),
                         lambda got, i=i: np.array_equal(got, self.g_sum[i] * m), f"g.{i}"))
        for i in range(2):
            want = (np.sum([self.h[k][i].astype(np.float32) for k in range(n)], axis=0) / n).astype(np.float16)
            jobs.append((lambda i=i: hvd.allreduce_async(self.h[r][i], op=hvd.Average, name=f"h.{i}"),
                         lambda got, want=want: np.array_equal(got, want), f"h.{i}"))
            want = np.min([self.i64[k][i] + step for k in range(n)], axis=0)
            jobs.append((lambda i=i: hvd.allreduce_async(self.i64[r][i] + step, op=hvd.Min, name=f"i.{i}"),
                         lambda got, want=want: np.array_equal(got, want), f"i.{i}"))
        for i in range(4):
            want = np.sum([self.c16[k][i] * m for k in range(n)], axis=0) / n
            jobs.append((lambda i=i: hvd.allreduce_async(self.c16[r][i] * m, op=hvd.Average, name=f"c16.{i}",
                                                         compression=hvd.Compression.fp16),
                         lambda got, want=want: np.array_equal(got, want), f"c16.{i}"))
        topk = hvd.Compression.topk(0.1, error_feedback=False)
        for i in range(2):
            jobs.append((lambda i=i: hvd.allreduce_async(self.tk[r][i] * m, op=hvd.Sum, name=f"tk.{i}",
                                                         compression=topk),
                         lambda got, i=i: np.array_equal(got, self.tk_dense[i] * m), f"tk.{i}"))
        k_ef = math.ceil(0.05 * 2000)
        jobs.append((lambda: hvd.allreduce_async(self.tkef[r], op=hvd.Average, name="tkef",
                                                 compression=hvd.Compression.topk(0.05)),
                     lambda got: np.isfinite(got).all() and np.count_nonzero(got) <= n * k_ef, "tkef"))
        # The other collectives, on cached names.
        want = np.concatenate([self.rows[k][: (k + step) % 3 + 1] for k in range(n)])
        jobs.append((lambda: hvd.allgather_async(self.rows[r][: (r + step) % 3 + 1], name="ag"),
                     lambda got, want=want: np.array_equal(got, want), "ag"))
        root = step % n
        jobs.append((lambda: hvd.broadcast_async(self.rows[r], root_rank=root, name="bc"),
                     lambda got, root=root: np.array_equal(got, self.rows[root]), "bc"))
        want = np.concatenate([self.rows[k][2 * r:2 * r + 2] for k in range(n)])
        jobs.append((lambda: hvd.alltoall_async(self.rows[r], name="a2a"),
                     lambda got, want=want: np.array_equal(got[0], want), "a2a"))
        total = np.sum(self.rows, axis=0)
        jobs.append((lambda: hvd.reducescatter_async(self.rows[r], op=hvd.Sum, name="rs"),
                     lambda got, want=total[2 * r:2 * r + 2]: np.array_equal(got, want), "rs"))
        # A new name every step: negotiated on the slow path, evicts a cache slot.
        want = np.full(4, n * (n - 1) / 2 + n * step, np.float32)
        jobs.append((lambda: hvd.allreduce_async(np.full(4, r + step, np.float32), op=hvd.Sum,
                                                 name=f"u.{step}"),
                     lambda got, want=want: np.array_equal(got, want), "u"))
        order = np.random.default_rng([r, step]).permutation(len(jobs))
        return [(jobs[j][0](), jobs[j][1], jobs[j][2]) for j in order]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tag", nargs="?", help=argparse.SUPPRESS)  # lets tests find leftovers
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=500, help="steps before the first RSS/fd sample")
    p.add_argument("--json", help="write each rank's figures to JSON.<rank>")
    p.add_argument("--cache-capacity", type=int, default=64)
    p.add_argument("--fusion-threshold", type=int, default=64 * 1024)
    p.add_argument("--report-every", type=int, default=1000)
    args = p.parse_args()
    os.environ["HVDLITE_CACHE_CAPACITY"] = str(args.cache_capacity)
    os.environ["HVDLITE_FUSION_THRESHOLD"] = str(args.fusion_threshold)

    import hvdlite as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    work = Workload(hvd, n)
    tmpdir = tempfile.mkdtemp(prefix="hvdlite-soak-")
    timeline = os.path.join(tmpdir, "timeline-%r.json")
    errors = checked = 0
    rss_warm = fds_warm = None
    samples = []
    t0 = time.time()
    for step in range(args.steps):
        if step % 200 == 120:
            hvd.start_timeline(timeline)
        elif step % 200 == 170:
            hvd.stop_timeline()
        ok = True
        for handle, check, label in work.submit(r, step):
            got = hvd.synchronize(handle)
            if not check(got):
                ok = False
                if errors < 10:
                    print(f"rank {r} step {step}: wrong result for {label}", file=sys.stderr, flush=True)
        errors += not ok
        checked += 1
        if step >= 0.8 * args.warmup and step < args.warmup:
            # RSS moves up and down by a page-cache-sized band as malloc trims
            # and regrows; the plateau is the highest value late in warm-up.
            rss_warm = max(rss_warm or 0, rss_kb())
        if step + 1 == args.warmup:
            heap_warm, fds_warm, t_warm = heap_kb(), open_fds(), time.time()
            buffers_warm = hvd.engine_stats()["buffer_bytes"] // 1024
        if (step + 1) % args.report_every == 0:
            samples.append((step + 1, rss_kb(), heap_kb(), open_fds()))
            if r == 0:
                print(f"step {step + 1}: RSS {samples[-1][1]} kB, heap {samples[-1][2]} kB, "
                      f"fds {samples[-1][3]}, {time.time() - t0:.0f} s", flush=True)
    hvd.stop_timeline()
    rss_end, heap_end, fds_end, t_end = rss_kb(), heap_kb(), open_fds(), time.time()
    stats = hvd.engine_stats()
    figures = {
        "rank": r, "size": n, "steps": args.steps, "warmup": args.warmup, "checked": checked,
        "errors": errors, "rss_warm_kb": rss_warm, "rss_end_kb": rss_end,
        "heap_warm_kb": heap_warm, "heap_end_kb": heap_end,
        # The engine's staging buffers grow to the largest bucket seen, which
        # depends on timing (how many tensors are ready in one round).
        "buffers_warm_kb": buffers_warm, "buffers_end_kb": stats["buffer_bytes"] // 1024,
        "fds_warm": fds_warm,
        "fds_end": fds_end, "seconds": t_end - t0,
        "ms_per_step_after_warmup": 1000 * (t_end - t_warm) / max(1, args.steps - args.warmup),
        "samples": samples, "stats": stats,
    }
    if args.json:
        with open(f"{args.json}.{r}", "w") as f:
            json.dump(figures, f)
    from mpi4py import MPI
    rows = MPI.COMM_WORLD.allgather(figures)
    if r == 0:
        print(f"soak: {args.steps} steps on {n} ranks, {t_end - t0:.0f} s "
              f"({figures['ms_per_step_after_warmup']:.1f} ms/step after warm-up)")
        for f in rows:
            growth = 100.0 * (f["rss_end_kb"] - f["rss_warm_kb"]) / f["rss_warm_kb"]
            print(f"  rank {f['rank']}: results checked {f['checked']} steps, wrong {f['errors']}; "
                  f"RSS after warm-up {f['rss_warm_kb']} kB, at end {f['rss_end_kb']} kB ({growth:+.2f} %); "
                  f"malloc'd {f['heap_warm_kb']} -> {f['heap_end_kb']} kB (engine buffers "
                  f"{f['buffers_warm_kb']} -> {f['buffers_end_kb']} kB); "
                  f"open fds {f['fds_warm']} -> {f['fds_end']}")
        print(f"  engine: {stats['tensors']} tensors, {stats['collectives']} MPI collectives, "
              f"{stats['tensors_fused']} fused, cache hits {stats['cache_hits']} / misses "
              f"{stats['cache_misses']}, wire bytes none/fp16/topk {stats['wire_bytes_none']}/"
              f"{stats['wire_bytes_fp16']}/{stats['wire_bytes_topk']}")
    for name in os.listdir(tmpdir):
        os.unlink(os.path.join(tmpdir, name))
    os.rmdir(tmpdir)
    hvd.shutdown()
    ok = errors == 0
    print(f"RANK {r} {'OK' if ok else 'FAILED'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
