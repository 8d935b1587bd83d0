"""Training-step time: hvdlite DistributedOptimizer vs no communication vs
torch DDP (gloo) vs Horovod (when installed), interleaved in one run.

Model: 6 x Linear(2048, 2048) (25.2 M parameters, 100 MB of float32
gradients), batch 64 per rank, 1 compute thread per rank, plain SGD.

    mpiexec -n 2 python bench/train_step.py                # prints a table
    mpiexec -n 2 python bench/train_step.py --plot docs/img/train_step.png --json out.json

Each round runs every mode for --steps steps, in a rotating order, so slow
phases of a shared machine hit all modes alike. The step time of a mode is
the median over all its timed steps of the slowest rank's step time. "no
communication" is the same ranks doing the same work with a plain optimizer
(what a perfect overlap would achieve); ratios are relative to it.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch

import hvdlite.torch as hvd

LAYERS, WIDTH, BATCH = 6, 2048, 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=5, help="timed steps per mode per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="nocomm,hvdlite,ddp,horovod")
    p.add_argument("--compression", choices=["none", "fp16"], default="none",
                   help="hvdlite's compression (fp16 adds an 'hvdlite fp16' mode when not none)")
    p.add_argument("--plot", help="write a PNG bar chart here (rank 0)")
    p.add_argument("--json", help="write the numbers here (rank 0)")
    return p.parse_args()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


class Mode:
    def __init__(self, label, model, optimizer, forward=None):
        self.label, self.model, self.optimizer = label, model, optimizer
        self.forward = forward or model
        self.times = []

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.forward(x), y)
        loss.backward()
        self.optimizer.step()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_modes(names, rank, size, compression):
    modes, absent = [], {}
    for name in names:
        if name == "nocomm":
            m = make_model()
            modes.append(Mode("no communication", m, torch.optim.SGD(m.parameters(), lr=1e-4)))
        elif name == "hvdlite":
            m = make_model()
            opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4),
                                           named_parameters=m.named_parameters())
            modes.append(Mode("hvdlite", m, opt))
            if compression == "fp16":
                m = make_model()
                opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4),
                                               named_parameters=[("fp16." + n, p) for n, p
                                                                 in m.named_parameters()],
                                               compression=hvd.Compression.fp16)
                modes.append(Mode("hvdlite fp16", m, opt))
        elif name == "ddp":
            import torch.distributed as dist
            port = hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=rank, world_size=size)
            m = make_model()
            ddp = torch.nn.parallel.DistributedDataParallel(m)
            modes.append(Mode("torch DDP (gloo)", m, torch.optim.SGD(ddp.parameters(), lr=1e-4),
                              forward=ddp))
        elif name == "horovod":
            try:
                import horovod.torch as horovod  # noqa: F401
            except ImportError as e:
                absent["Horovod"] = f"not installed ({e.__class__.__name__})"
                continue
            horovod.init()
            m = make_model()
            opt = horovod.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4),
                                               named_parameters=m.named_parameters())
            modes.append(Mode("Horovod", m, opt))
        else:
            raise SystemExit(f"unknown mode {name}")
    return modes, absent


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    modes, absent = build_modes(args.modes.split(","), rank, size, args.compression)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)

    for mode in modes:
        for _ in range(args.warmup):
            mode.step(x, y)
    for rnd in range(args.rounds):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        for mode in order:
            hvd.barrier()
            local = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                mode.step(x, y)
                local.append(time.perf_counter() - t0)
            slowest = hvd.allreduce(torch.tensor(local, dtype=torch.float64), op=hvd.Max,
                                    name=f"bench.{mode.label}")
            mode.times.extend(slowest.tolist())

    if rank != 0:
        return
    base = next((m for m in modes if m.label == "no communication"), None)
    base_ms = statistics.median(base.times) * 1e3 if base else None
    results = {"ranks": size, "layers": LAYERS, "width": WIDTH, "batch_per_rank": BATCH,
               "threads_per_rank": torch.get_num_threads(), "rounds": args.rounds,
               "steps_per_round": args.steps, "modes": {}, "absent": absent,
               "mpi": hvd._hvdlite.mpi_library_version().splitlines()[0][:60]}
    print(f"train step, {LAYERS} x Linear({WIDTH}, {WIDTH}), batch {BATCH}/rank, {size} ranks, "
          f"1 thread/rank, {args.rounds} rounds x {args.steps} steps (interleaved)")
    print(f"{'mode':24s} {'median ms':>10s} {'p25':>8s} {'p75':>8s} {'x no-comm':>10s}")
    for m in modes:
        ms = sorted(t * 1e3 for t in m.times)
        med = statistics.median(ms)
        q = statistics.quantiles(ms, n=4) if len(ms) >= 4 else [ms[0], med, ms[-1]]
        ratio = med / base_ms if base_ms else float("nan")
        results["modes"][m.label] = {"median_ms": round(med, 2), "p25_ms": round(q[0], 2),
                                     "p75_ms": round(q[2], 2), "ratio_to_nocomm": round(ratio, 3)}
        print(f"{m.label:24s} {med:10.1f} {q[0]:8.1f} {q[2]:8.1f} {ratio:10.2f}")
    for label, why in absent.items():
        print(f"{label:24s} {'absent':>10s}   {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot(results, args.plot)
    sys.stdout.flush()


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(results["modes"]) + list(results["absent"])
    med = [results["modes"][k]["median_ms"] if k in results["modes"] else 0 for k in labels]
    lo = [med[i] - results["modes"][k]["p25_ms"] if k in results["modes"] else 0
          for i, k in enumerate(labels)]
    hi = [results["modes"][k]["p75_ms"] - med[i] if k in results["modes"] else 0
          for i, k in enumerate(labels)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colors = ["#888888" if k == "no communication" else "#2a7ab9" if k.startswith("hvdlite")
              else "#c0504d" for k in labels]
    bars = ax.bar(labels, med, yerr=[lo, hi], capsize=4, color=colors)
    for bar, k in zip(bars, labels):
        text = (f"{results['modes'][k]['median_ms']:.0f} ms\n"
                f"{results['modes'][k]['ratio_to_nocomm']:.2f}x") if k in results["modes"] \
            else "absent"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_ylabel("step time, ms (median, p25-p75)")
    ax.set_title(f"{results['layers']} x Linear({results['width']}), batch "
                 f"{results['batch_per_rank']}/rank, {results['ranks']} ranks, 1 thread/rank",
                 fontsize=9)
    ax.set_ylim(0, max(med) * 1.3 if max(med) else 1)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
