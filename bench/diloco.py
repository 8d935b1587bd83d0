"""Communicating less often against compressing: the byte-level language model
(examples/pytorch_lm.py) trained once per method in one job, every method to
the same number of steps (equal samples), each against the synchronous run
measured in the same job.

    hvdrun -np 4 python bench/diloco.py --runs sync,diloco50,streaming50 --steps 300 --json out.json
    hvdrun -np 4 python bench/diloco.py --runs sync,diloco50x3 --steps 300   # DiLoCo to 900 steps
    hvdrun -np 4 python bench/diloco.py --runs sync,diloco50q --steps 300    # 4-bit outer gradients
    hvdrun -np 4 python bench/diloco.py --runs sync,diloco100 --steps 12000 --checkpoint ckpt
        # a long job: run the same command again after a stop to resume each run

A run's name may end in ``xK``: that run takes K times ``--steps`` (its own
learning-rate schedule over them), for the time to synchronous's final loss
of a method that needs more samples to reach it.

For each run: the final validation loss and its ratio to synchronous, the
time (evaluations excluded) to first reach synchronous's final validation
loss (or, where it is never reached, the best loss reached), the bytes one
rank put on the wire in all and in its busiest step, and the loss curve.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import hvdlite  # noqa: E402
import pytorch_lm  # noqa: E402


def runs_table(topk_ratio, dgc_lr):
    """label -> the example's arguments for each known run name."""
    out = {"sync": ("synchronous", []),
           "dgc": ("top-k %g%% + DGC preset (SGD)" % (100 * topk_ratio),
                   ["--compression", "dgc", "--topk-ratio", str(topk_ratio), "--optimizer", "sgd",
                    "--lr", str(dgc_lr), "--max-norm", "5"]),
           "powersgd": ("PowerSGD r2", ["--compression", "powersgd", "--powersgd-rank", "2"])}
    for h in (5, 10, 20, 25, 50, 100, 200):
        out["diloco%d" % h] = ("DiLoCo H=%d" % h, ["--diloco", str(h)])
        out["streaming%d" % h] = ("Streaming DiLoCo H=%d F=4" % h, ["--diloco", str(h), "--fragments", "4"])
        for name in ("diloco%d" % h, "streaming%d" % h):   # a "q": 4-bit outer gradients
            label, argv = out[name]
            out[name + "q"] = (label + ", 4-bit", argv + ["--compression", "quantize"])
    return out


def parse_run(name, table, steps):
    """(label, example arguments, steps) of a run name such as ``diloco50x3``."""
    base, _, factor = name.rpartition("x") if re.fullmatch(r".+x\d+", name) else (name, "", "")
    if base not in table:
        return None
    label, argv = table[base]
    if factor:
        label, steps = "%s, %sx the steps" % (label, factor), steps * int(factor)
    return label, argv, steps


def example_argv(run, model, eval_every, checkpoint=None):
    """The example's arguments for one parsed run: --model's first and the
    run's own after them, so that a model string with --lr leaves the DGC
    run's SGD lr (and any run's own setting) its own."""
    _, run_argv, steps = run
    argv = model.split() + run_argv + ["--steps", str(steps), "--eval-every", str(eval_every),
                                       "--curve", "--json", "-"]
    return argv + (["--checkpoint", checkpoint] if checkpoint else [])


def time_to(curve, target):
    """(seconds, step) of the first evaluation at or below ``target``, or None."""
    for step, seconds, _, loss in curve:
        if loss <= target:
            return seconds, step
    return None


def summarise(results, labels):
    base = results.get("sync")
    target = base["val_loss"] if base else None
    out = {}
    for name, r in results.items():
        row = {k: r[k] for k in ("val_loss", "seconds", "steps", "wire_bytes", "wire_bytes_per_step",
                                 "peak_wire_bytes_per_step", "train_loss_last_tenth", "first_train_loss")}
        row["label"] = labels[name]
        row["curve"] = r.get("curve", [])
        row["best_val_loss"] = min(p[3] for p in row["curve"]) if row["curve"] else r["val_loss"]
        if base:
            row["val_loss_ratio"] = round(r["val_loss"] / base["val_loss"], 4)
            row["bytes_ratio"] = round(r["wire_bytes"] / base["wire_bytes"], 4) if base["wire_bytes"] else None
            row["seconds_ratio"] = round(r["seconds"] / base["seconds"], 3) if base["seconds"] else None
            reached = time_to(row["curve"], target)
            row["seconds_to_sync_loss"] = reached[0] if reached else None
            row["steps_to_sync_loss"] = reached[1] if reached else None
        out[name] = row
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="sync,dgc,powersgd,diloco50,streaming50",
                   help="comma list: sync, dgc, powersgd, dilocoH, streamingH (H in 5..200; a "
                   "trailing q: 4-bit outer gradients, e.g. diloco50q), each optionally followed "
                   "by xK (K times --steps)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--dgc-lr", type=float, default=0.05, help="SGD's learning rate for the DGC run")
    p.add_argument("--model", default="", help="extra arguments of the example for every run, e.g. "
                   "'--d-model 128 --layers 2' (one string; a run's own arguments, such as the "
                   "DGC run's --optimizer and --lr, take precedence)")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="each run saves its state in DIR/<run> at every evaluation; the same "
                        "command run again resumes each run from there")
    args = p.parse_args()
    table = runs_table(args.topk_ratio, args.dgc_lr)
    names = args.runs.split(",")
    runs = {n: parse_run(n, table, args.steps) for n in names}
    unknown = [n for n, r in runs.items() if r is None]
    if unknown:
        raise SystemExit("unknown run(s) %s (one of %s, each optionally followed by xK for K times "
                         "the steps)" % (", ".join(unknown), ", ".join(table)))
    pytorch_lm.hvd.init()
    results = {}
    for name in names:
        hvdlite.reset_compression_state()  # fresh residuals and warm-ups for each run
        checkpoint = os.path.join(args.checkpoint, name) if args.checkpoint else None
        argv = example_argv(runs[name], args.model, args.eval_every, checkpoint)
        results[name] = pytorch_lm.train(pytorch_lm.parse_args(argv))
    if pytorch_lm.hvd.rank() != 0:
        return
    first = next(iter(results.values()))
    out = {"ranks": pytorch_lm.hvd.size(), "steps": args.steps, "batch_size": first["batch_size"],
           "seq_len": first["seq_len"], "params": first["params"], "eval_every": args.eval_every,
           "model_args": args.model, "outer_lr": first["outer_lr"], "outer_momentum": first["outer_momentum"],
           "runs": summarise(results, {n: runs[n][0] for n in names})}
    print("LM %d params, %d ranks, %d steps (xK runs: K times) of %d x %d bytes per rank"
          % (out["params"], out["ranks"], args.steps, out["batch_size"], out["seq_len"]))
    print("%-30s %8s %7s %9s %10s %10s %8s" % ("run", "val loss", "x sync", "seconds", "MB total",
                                                "peak MB", "x bytes"))
    for name, r in out["runs"].items():
        print("%-30s %8.4f %7.4f %9.1f %10.1f %10.2f %8.4f" % (
            r["label"], r["val_loss"], r.get("val_loss_ratio") or 0, r["seconds"], r["wire_bytes"] / 1e6,
            r["peak_wire_bytes_per_step"] / 1e6, r.get("bytes_ratio") or 0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
