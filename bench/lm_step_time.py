"""Seconds of one training step of examples/pytorch_lm.py's model, with no
communication, at several widths: the compute side of the diloco case's
chart (which way to communicate, by link speed and model size).

    python bench/lm_step_time.py --d-models 128,192,384,768 --json out.json

One process, one thread (as each rank of the case), AdamW, the example's
batch; per width the median of ``--steps`` timed steps after two untimed.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import pytorch_lm  # noqa: E402


def step_seconds(args, steps):
    torch.manual_seed(args.seed)
    model = pytorch_lm.make_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=gen)
    y = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=gen)
    times = []
    for i in range(steps + 2):
        began = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - began)
    return sum(p.numel() for p in model.parameters()), statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-models", default="128,192,256,384,512,768")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--model", default="", help="other arguments of the example (one string)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for d in (int(v) for v in args.d_models.split(",")):
        extra = args.model.split() + ["--d-model", str(d), "--heads", str(max(1, d // 64))]
        lm_args = pytorch_lm.parse_args(extra)
        params, seconds = step_seconds(lm_args, args.steps)
        rows.append({"d_model": d, "layers": lm_args.layers, "params": params,
                     "batch_size": lm_args.batch_size, "seq_len": lm_args.seq_len,
                     "seconds_per_step": round(seconds, 5)})
        print("d_model %4d  %10d params  %8.1f ms per step" % (d, params, 1e3 * seconds), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "models": rows}, f, indent=1)


if __name__ == "__main__":
    main()
