"""A model of allreduce and training-step time between hosts, calibrated on the
emulated-host measurements of ``python -m hvdlite.bench --cases hosts``, that
predicts scaling efficiency on larger clusters (docs/scaling.md explains it).

    python bench/scaling_model.py                                   # newest *hosts*.json
    python bench/scaling_model.py --json bench/results/2026-11-25-hosts.json \\
        --gbit 25 --compute-ms 200,100 --alpha-us 20,5 --hosts 16,32,64,128

The allreduce of S bytes among H hosts (any number of ranks per host: inside a
host the data is reduced before the ring, so each link carries it once) takes

    T_ar = 2(H-1)/H * S / (eta * B)  +  N * 2(H-1) * alpha

B the link's nominal rate, eta the part of it MPI over TCP delivers (the wire
floor measured in the same job), N the collectives the engine runs per step
(the bucket planner's count for the fusion threshold F), alpha the cost of one
ring step beyond its bytes (latency, waking the engine). A training step of
compute time C, of which the backward pass (2/3 of C) overlaps the allreduce:

    T_step = C + max(T_last, T_ar - 2/3 C) + cycle,     efficiency = C / T_step

T_last is the allreduce of the last bucket, which can only start when backward
ends. Calibration: eta from each layout's wire floor, alpha from the layouts
with one rank per host (hvdlite's time above the floor over its ring steps);
the other layouts check the model.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50_shapes import resnet50_shapes  # noqa: E402

MB = 1 << 20
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
OVERLAP = 2.0 / 3.0   # the backward pass's share of a step
CYCLE_S = 1e-3        # the engine's cycle time: the first bucket waits up to one


def tensor_bytes():
    out = []
    for shape in resnet50_shapes():
        n = 1
        for d in shape:
            n *= d
        out.append(4 * n)
    return out


def collectives(sizes, fusion, direct=1 * MB):
    """Buckets the engine's planner makes of `sizes` (bytes, in order) at fusion
    threshold `fusion`: tensors of at least min(direct, fusion) go alone, the
    others fill buckets up to `fusion`."""
    direct = min(direct, fusion)
    count, open_bytes = 0, None
    for b in sizes:
        if b >= direct:
            count += 1
            continue
        if open_bytes is None or open_bytes + b > fusion:
            count += 1
            open_bytes = 0
        open_bytes += b
    return count


def allreduce_s(total, hosts, rate, eta, n, alpha):
    if hosts < 2:
        return 0.0
    return 2 * (hosts - 1) / hosts * total / (eta * rate) + n * 2 * (hosts - 1) * alpha


def step_s(compute, total, hosts, rate, eta, n, alpha, last_bucket):
    t = allreduce_s(total, hosts, rate, eta, n, alpha)
    last = allreduce_s(last_bucket, hosts, rate, eta, 1, alpha)
    return compute + max(last, t - OVERLAP * compute) + CYCLE_S


def newest_hosts_json():
    files = sorted(glob.glob(os.path.join(RESULTS, "*hosts*.json")), key=os.path.getmtime)
    if not files:
        raise SystemExit("no bench/results/*hosts*.json: run python -m hvdlite.bench --cases hosts first")
    return files[-1]


def rate_bytes(text):
    """'1gbit' -> bytes/s."""
    t = text.lower().replace("bit", "")
    scale = {"g": 1e9, "m": 1e6, "k": 1e3}.get(t[-1], 1)
    return float(t.rstrip("gmk")) * scale / 8


def calibrate(path):
    data = json.load(open(path))
    case = data["cases"]["hosts"] if "cases" in data else data
    rate = rate_bytes(case["rate"])
    rows, alphas = [], []
    for lay, res in case["layouts"].items():
        hosts, per_host = (int(x) for x in lay.split("x"))
        r = res["resnet50"]
        total = res["meta"]["resnet50_mbytes"] * 1e6
        floor = r["wire floor"]["median_ms"] / 1e3
        eta = 2 * (hosts - 1) / hosts * total / floor / rate
        n = r["hvdlite none"]["per_call"]["collectives"]
        measured = r["hvdlite none"]["median_ms"] / 1e3
        if per_host == 1:
            alphas.append((measured - floor) / (n * 2 * (hosts - 1)))
        rows.append(dict(layout=lay, hosts=hosts, total=total, eta=eta, n=n, floor=floor, measured=measured))
    if not alphas:
        raise SystemExit("%s has no layout with one rank per host to calibrate alpha" % path)
    alpha = max(0.0, sum(alphas) / len(alphas))
    for row in rows:
        row["predicted"] = row["floor"] + row["n"] * 2 * (row["hosts"] - 1) * alpha
    return case["rate"], rows, alpha


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="results of the hosts case (default: the newest)")
    ap.add_argument("--gbit", type=float, default=25.0, help="link rate of the predicted cluster")
    ap.add_argument("--eta", type=float, default=None, help="its delivered share (default: calibrated)")
    ap.add_argument("--alpha-us", default="20,5", help="ring step costs to predict with (us)")
    ap.add_argument("--compute-ms", default="200,100", help="compute per step (ms)")
    ap.add_argument("--hosts", default="16,32,64,128")
    ap.add_argument("--fusion-mb", default="4,8,16,32,64", help="fusion thresholds to choose from")
    args = ap.parse_args(argv)
    path = args.json or newest_hosts_json()
    link, rows, alpha = calibrate(path)
    print("## Calibration on %s (%s links)\n" % (os.path.relpath(path), link))
    print("| layout | wire floor ms | eta | collectives | hvdlite ms | model ms | model / measured |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %.0f | %.2f | %.0f | %.0f | %.0f | %.2f |" % (
            r["layout"], r["floor"] * 1e3, r["eta"], r["n"], r["measured"] * 1e3, r["predicted"] * 1e3,
            r["predicted"] / r["measured"]))
    eta = args.eta or max(r["eta"] for r in rows)
    print("\nalpha (one ring step beyond its bytes) = %.0f us on the emulated hosts; eta used below = %.2f\n"
          % (alpha * 1e6, eta))
    sizes = tensor_bytes()
    total = float(sum(sizes))
    # Measured collectives per call against the planner's buckets for the whole set.
    split = sum(r["n"] for r in rows) / len(rows) / collectives(sizes, 4 * MB)
    print("collectives per step: %.1fx the planner's buckets for the whole set (cycles cut buckets)\n" % split)
    rate = args.gbit * 1e9 / 8
    hosts = [int(h) for h in args.hosts.split(",")]
    fusions = [float(f) * MB for f in args.fusion_mb.split(",")]
    print("## Predicted: ResNet-50 (%.0f MB fp32 gradients), %g Gbit/s links\n" % (total / 1e6, args.gbit))
    print("Scaling efficiency (compute / step) at the default fusion threshold (4 MB) and at the "
          "best of %s MB:\n" % args.fusion_mb)
    print("| compute ms | alpha us | " + " | ".join("%d hosts" % h for h in hosts) + " |")
    print("|---:|---:|" + "---:|" * len(hosts))
    for c in (float(x) / 1e3 for x in args.compute_ms.split(",")):
        for a in (float(x) * 1e-6 for x in args.alpha_us.split(",")):
            cells = []
            for h in hosts:
                def eff(f):
                    n = split * collectives(sizes, f)
                    return c / step_s(c, total, h, rate, eta, n, a, min(f, total))
                best = max(fusions, key=eff)
                cells.append("%.0f%% (%.0f%% at %g MB)" % (100 * eff(4 * MB), 100 * eff(best), best / MB))
            print("| %.0f | %.0f | %s |" % (c * 1e3, a * 1e6, " | ".join(cells)))
    n4, a0 = split * collectives(sizes, 4 * MB), float(args.alpha_us.split(",")[0]) * 1e-6
    print("\nAllreduce alone (4 MB buckets, %.0f collectives; alpha %.0f us): %s" % (
        n4, a0 * 1e6, ", ".join("%d hosts %.0f ms" % (h, 1e3 * allreduce_s(total, h, rate, eta, n4, a0))
                                for h in hosts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
