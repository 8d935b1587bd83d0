"""Where a training step's time goes, per rank: forward, backward, the wait for
the allreduces (synchronize) and the optimizer step, in thread CPU and wall
time, with hvdlite's DistributedOptimizer or without communication.

Same model as bench/train_step.py (6 x Linear(2048, 2048), batch 64 per rank,
1 compute thread per rank, plain SGD). Run one setting per job, alternating:

    mpiexec -n 2 python bench/step_phases.py nocomm
    mpiexec -n 2 python bench/step_phases.py hvdlite

Every rank prints the medians of its timed steps. A barrier starts each step,
so the ranks begin together and a slower rank's backward shows as the faster
rank's longer synchronize.
"""
import argparse
import statistics
import time

import torch
from mpi4py import MPI

import hvdlite.torch as hvd

PHASES = ("forward", "backward", "synchronize", "optimizer")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["nocomm", "hvdlite"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if args.mode == "hvdlite":
        hvd.init()
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(comm.rank)
    x, y = torch.randn(64, 2048, generator=g), torch.randn(64, 2048, generator=g)

    def synchronize():
        if args.mode == "hvdlite":
            opt.synchronize()

    def step():
        if args.mode == "hvdlite":
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()

    def forward():
        opt.zero_grad()
        return torch.nn.functional.mse_loss(model(x), y)

    cpu = {k: [] for k in PHASES}
    wall = {k: [] for k in PHASES}
    for i in range(args.warmup + args.steps):
        comm.Barrier()
        marks = [(time.thread_time(), time.perf_counter())]
        loss = forward()
        marks.append((time.thread_time(), time.perf_counter()))
        loss.backward()
        marks.append((time.thread_time(), time.perf_counter()))
        synchronize()
        marks.append((time.thread_time(), time.perf_counter()))
        step()
        marks.append((time.thread_time(), time.perf_counter()))
        if i < args.warmup:
            continue
        for k, name in enumerate(PHASES):
            cpu[name].append(1e3 * (marks[k + 1][0] - marks[k][0]))
            wall[name].append(1e3 * (marks[k + 1][1] - marks[k][1]))
    line = " ".join(f"{n} {statistics.median(cpu[n]):.1f}/{statistics.median(wall[n]):.1f}" for n in PHASES)
    # Rank 0 prints every rank's line: lines written by two processes at once
    # can interleave in the launcher's output.
    lines = comm.gather(f"{args.mode} rank {comm.rank}, ms cpu/wall: {line}", root=0)
    if comm.rank == 0:
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
