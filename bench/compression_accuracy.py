"""Accuracy against bytes on the wire, for every compressor: the digits example
(examples/pytorch_digits.py, same seed and epochs) trained once per
compressor in one job, each run checking after every step that the parameters
are bitwise identical on all ranks.

    hvdrun -np 4 python bench/compression_accuracy.py --json out.json

Bytes are what one rank put on the wire for the gradients' reductions
(hvdlite.engine_stats()'s wire_bytes_*), per step: averaged over the whole run
(warm-ups included) and over the last epoch (the steady state).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import hvdlite  # noqa: E402
import pytorch_digits  # noqa: E402

# label -> the example's arguments; DGC = momentum correction, warm-up, clipping.
RUNS = {
    "none": ["--compression", "none"],
    "fp16": ["--compression", "fp16"],
    "bf16": ["--compression", "bf16"],
    "top-k 1%": ["--compression", "topk", "--topk-ratio", "0.01"],
    "top-k 1% + DGC": ["--compression", "topk", "--topk-ratio", "0.01", "--momentum-correction",
                       "--warmup-steps", "66", "--clip-norm", "5"],
    "top-k 0.1%": ["--compression", "topk", "--topk-ratio", "0.001"],
    "top-k 0.1% + warm-up": ["--compression", "topk", "--topk-ratio", "0.001", "--warmup-steps", "66"],
    "top-k 0.1% + DGC": ["--compression", "topk", "--topk-ratio", "0.001", "--momentum-correction",
                         "--warmup-steps", "66", "--clip-norm", "5"],
    "Compression.dgc(0.001) preset": ["--compression", "dgc", "--topk-ratio", "0.001",
                                      "--max-norm", "10"],
    "PowerSGD r1": ["--compression", "powersgd", "--powersgd-rank", "1"],
    "PowerSGD r2": ["--compression", "powersgd", "--powersgd-rank", "2"],
    "PowerSGD r4": ["--compression", "powersgd", "--powersgd-rank", "4"],
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--seeds", default="42", help="comma list: one run per compressor and seed")
    p.add_argument("--runs", default=",".join(RUNS), help="comma list of: " + ", ".join(RUNS))
    p.add_argument("--json", help="write the results here (rank 0)")
    args = p.parse_args()
    pytorch_digits.hvd.init()
    results = {}
    for label in args.runs.split(","):
        for seed in args.seeds.split(","):
            hvdlite.reset_compression_state()  # fresh residuals and warm-ups for each run
            r = pytorch_digits.train(pytorch_digits.parse_args(
                RUNS[label] + ["--epochs", str(args.epochs), "--seed", seed, "--json", "--check"]))
            results.setdefault(label, []).append(r)
    if pytorch_digits.hvd.rank() != 0:
        return
    out = {"ranks": pytorch_digits.hvd.size(), "epochs": args.epochs,
           "seeds": [int(x) for x in args.seeds.split(",")], "runs": {}}
    base = results.get("none")
    print(f"digits, {out['ranks']} ranks, {args.epochs} epochs, seeds {args.seeds}")
    print(f"{'compressor':24s} {'accuracy %':>10s} {'vs none':>8s} {'B/step':>9s} {'last epoch':>11s} {'x fewer':>8s}")
    for label, rs in results.items():
        acc = sum(r["test_accuracy"] for r in rs) / len(rs)
        per_step = sum(r["wire_bytes_per_step"] for r in rs) / len(rs)
        last = sum(r["wire_bytes_per_step_last_epoch"] for r in rs) / len(rs)
        row = {"args": RUNS[label], "test_accuracy": round(acc, 2),
               "per_seed": [r["test_accuracy"] for r in rs],
               "wire_bytes_per_step": round(per_step), "wire_bytes_per_step_last_epoch": round(last),
               "bitwise_identical_every_step": all(r.get("bitwise_identical_every_step") for r in rs)}
        if base:
            ref = sum(r["test_accuracy"] for r in base) / len(base)
            ref_last = sum(r["wire_bytes_per_step_last_epoch"] for r in base) / len(base)
            row["vs_none_points"] = round(acc - ref, 2)
            row["fewer_bytes_last_epoch"] = round(ref_last / last, 1) if last else None
        out["runs"][label] = row
        print(f"{label:24s} {acc:10.2f} {row.get('vs_none_points', 0):+8.2f} {per_step:9.0f} {last:11.0f} "
              f"{row.get('fewer_bytes_last_epoch') or 0:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
