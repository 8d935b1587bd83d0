"""Where the time of one ResNet-50-set allreduce goes, per compression: the
engine's timeline phases (negotiation, queue, copies into and out of the fusion
buffer, compression, the MPI call, decompression), as wall time per call.

    mpiexec -n 2 python bench/breakdown.py --calls 3 --json out.json

For each compression the engine is restarted with a timeline recording, one call
warms it, ``--calls`` calls are recorded, and rank 0's trace is reduced to the
union of each phase's intervals over all tensor rows (fused tensors share a
phase's interval, and a phase of one bucket may overlap another bucket's), so a
number is "wall time during which some tensor was in that phase", per call.
Recording costs a little itself; use the interleaved cases for the totals.
"""
import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allreduce as ar  # noqa: E402
import hvdlite as hvd  # noqa: E402

comm = MPI.COMM_WORLD


def union_ms(intervals):
    total, end = 0.0, None
    for b, e in sorted(intervals):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def phases(path):
    """{phase: union wall ms} and the span (first begin to last end) of a trace file."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    open_ = {}
    spans = {}
    t_min, t_max = None, None
    for ev in events:
        ph = ev.get("ph")
        if ph not in ("B", "E"):
            continue
        key = (ev.get("tid"), ev.get("name"))
        ts = float(ev["ts"])
        if ph == "B":
            open_.setdefault(key, []).append(ts)
        elif open_.get(key):
            b = open_[key].pop()
            spans.setdefault(ev["name"], []).append((b, ts))
            t_min = b if t_min is None else min(t_min, b)
            t_max = ts if t_max is None else max(t_max, ts)
    out = {name: union_ms(iv) for name, iv in spans.items()}
    return out, ((t_max - t_min) / 1e3 if t_min is not None else 0.0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--compressions", default="none,fp16,topk")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(comm.rank)
    tensors = ar.resnet50_tensors(args.scale, rng)
    outs = [np.empty_like(t) for t in tensors]
    comps = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16, "topk": hvd.Compression.topk(0.01)}
    tmp = comm.bcast(tempfile.mkdtemp(prefix="hvdlite-breakdown-") if comm.rank == 0 else None, root=0)
    results = {}
    for name in args.compressions.split(","):
        ar.ENGINES.use(None)
        ar.ENGINES.use("hvdlite")
        fn = ar.make_hvdlite(tensors, outs, comps[name], "bd" + name)
        fn()
        path = os.path.join(tmp, "%s-%%r.json" % name)
        hvd.start_timeline(path)
        times = []
        for _ in range(args.calls):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) * 1e3)
        hvd.stop_timeline()
        comm.Barrier()
        if comm.rank == 0:
            ph, span = phases(path.replace("%r", "0"))
            results[name] = {"call_ms": sorted(times)[len(times) // 2],
                             "phases_ms_per_call": {k: v / args.calls for k, v in sorted(ph.items())},
                             "span_ms_per_call": span / args.calls}
    ar.ENGINES.close()
    if comm.rank == 0:
        for name, r in results.items():
            print(name, "%.1f ms/call:" % r["call_ms"],
                  ", ".join("%s %.1f" % kv for kv in r["phases_ms_per_call"].items()), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"breakdown": results, "ranks": comm.size, "calls": args.calls,
                           "scale": args.scale}, f, indent=1)


if __name__ == "__main__":
    main()
