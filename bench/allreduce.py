"""Allreduce of the ResNet-50 gradient set and of many small tensors, hvdlite
against raw mpi4py schedules and torch gloo, interleaved in one run.

    mpiexec -n 2 python bench/allreduce.py --iters 15 --json bench/results/allreduce.json

Every contender runs once per iteration in a rotating order; times are the
slowest rank's, reported as medians with min/max and as ratios to the best
raw MPI schedule measured in the same run.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hvdlite as hvd  # noqa: E402
from resnet50_shapes import resnet50_shapes  # noqa: E402

comm = MPI.COMM_WORLD


def raw_unfused(tensors, outs):
    for t, o in zip(tensors, outs):
        comm.Allreduce(t, o, op=MPI.SUM)


def make_raw_buckets(tensors, outs, bucket_bytes):
    buckets, current, size = [], [], 0
    for i, t in enumerate(tensors):
        if current and size + t.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += t.nbytes
    buckets.append(current)
    flats = [np.empty(sum(tensors[i].size for i in b), np.float32) for b in buckets]

    def run():
        for b, flat in zip(buckets, flats):
            off = 0
            for i in b:
                n = tensors[i].size
                flat[off:off + n] = tensors[i].reshape(-1)
                off += n
            comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            off = 0
            for i in b:
                n = tensors[i].size
                outs[i].reshape(-1)[:] = flat[off:off + n]
                off += n
    return run


def make_hvdlite(tensors, outs, compression, tag):
    names = [f"{tag}.{i}" for i in range(len(tensors))]

    def run():
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=nm, compression=compression, out=o)
                   for t, nm, o in zip(tensors, names, outs)]
        for h in handles:
            hvd.synchronize(h)
    return run


def make_gloo(tensors):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if not dist.is_initialized():
        port = comm.bcast(_free_port() if comm.rank == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=comm.rank, world_size=comm.size)
    ts = [torch.from_numpy(t.copy()) for t in tensors]

    def run():
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
    return run


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def measure(contenders, iters):
    times = {name: [] for name in contenders}
    names = list(contenders)
    for it in range(iters + 1):
        order = names[it % len(names):] + names[:it % len(names)]
        for name in order:
            comm.Barrier()
            t0 = time.perf_counter()
            contenders[name]()
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if it > 0:  # the first round warms caches and the engine's response cache
                times[name].append(elapsed * 1e3)
    return {n: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
            for n, v in times.items()}


def report(title, results, baseline_names):
    best = min(baseline_names, key=lambda n: results[n]["median_ms"])
    base = results[best]["median_ms"]
    lines = [f"## {title}", f"(ratios against the best raw MPI schedule: {best})", "",
             "| contender | median ms | min | max | ratio |", "|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = r["median_ms"] / base
        lines.append(f"| {name} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | {r['max_ms']:.2f} | {ratio:.2f}x |")
        r["ratio_to_best_raw"] = ratio
    return "\n".join(lines), best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-gloo", action="store_true")
    args = ap.parse_args()
    hvd.init()
    rng = np.random.default_rng(comm.rank)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in resnet50_shapes()]
    outs = [np.empty_like(t) for t in tensors]
    r50 = {
        "mpi4py unfused": lambda: raw_unfused(tensors, outs),
        "mpi4py one buffer": make_raw_buckets(tensors, outs, 1 << 40),
        "mpi4py 25 MB buckets": make_raw_buckets(tensors, outs, 25 << 20),
        "hvdlite none": make_hvdlite(tensors, outs, hvd.Compression.none, "none"),
        "hvdlite fp16": make_hvdlite(tensors, outs, hvd.Compression.fp16, "fp16"),
        "hvdlite topk 1%": make_hvdlite(tensors, outs, hvd.Compression.topk(0.01), "topk"),
    }
    if not args.skip_gloo:
        try:
            r50["torch gloo async"] = make_gloo(tensors)
        except ImportError:
            pass
    try:
        import horovod  # noqa: F401
    except ImportError:
        horovod_note = "Horovod: not installed (not measured)"
    else:
        horovod_note = "Horovod: installed; run bench/horovod_allreduce.py separately"
    results = {"resnet50": measure(r50, args.iters)}

    small = [rng.standard_normal(1024).astype(np.float32) for _ in range(100)]
    small_outs = [np.empty_like(t) for t in small]
    results["small"] = measure({
        "mpi4py loop": lambda: raw_unfused(small, small_outs),
        "hvdlite": make_hvdlite(small, small_outs, hvd.Compression.none, "small"),
    }, args.iters * 4)
    if comm.rank == 0:
        raw = ["mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets"]
        text1, _ = report(f"ResNet-50 gradient set, {comm.size} ranks (161 tensors, 102 MB, Sum)",
                          results["resnet50"], raw)
        text2, _ = report(f"100 x 4 KB tensors per step, {comm.size} ranks", results["small"], ["mpi4py loop"])
        print(text1 + "\n\n" + text2 + "\n\n" + horovod_note, flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            results["meta"] = {"ranks": comm.size, "iters": args.iters, "mpi": MPI.Get_library_version().split("\n")[0],
                               "horovod": horovod_note, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "env": {k: v for k, v in os.environ.items() if k.startswith("HVDLITE_")}}
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
