"""An elastic DDP script on the "hvdlite" backend, for the elastic tests of
tests/test_torch_distributed.py:

    torch_ddp_elastic.py TAG STEPS [--commit-every N] [--fail MODE --fail-at STEP --victim R]

TAG is ignored (it lets a test find the job's processes). The script trains
a small model with DistributedDataParallel on ``init_process_group(backend=
"hvdlite")``, the training function under ``hvd.elastic.run``, its state (the
DDP model, a momentum SGD optimizer, the step) in a ``TorchState``,
committed every N steps; each step's batch is a function of the step and the
rank only, so a run that restarts from a commit ends with the parameters of
one that did not. With --fail, rank R of the job's first generation fails at
step STEP: ``sigkill`` (SIGKILL itself), ``sigstop`` (SIGSTOP itself: a hung
rank, noticed through HVDLITE_TIMEOUT_SECONDS).

Every rank prints JSON event lines: start (generation, pid), begin (step,
parameters' sha256), step, commit, done (steps, parameters' sha256).
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hvdlite.torch as hvd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tag")
    p.add_argument("steps", type=int)
    p.add_argument("--commit-every", type=int, default=3)
    p.add_argument("--fail", choices=["sigkill", "sigstop"])
    p.add_argument("--fail-at", type=int, default=0)
    p.add_argument("--victim", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    generation = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))

    dist.init_process_group(backend="hvdlite")
    rank, size = dist.get_rank(), dist.get_world_size()

    def event(kind, **fields):
        line = json.dumps(dict(ev=kind, rank=rank, size=size, generation=generation, t=time.time(), **fields))
        sys.stdout.write(line + "\n")  # one write: ranks share a pipe
        sys.stdout.flush()

    event("start", pid=os.getpid(), backend=dist.get_backend(), hvdlite=hvd.__file__)
    torch.manual_seed(1 + rank)         # DDP's broadcast from rank 0 makes them equal
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def params():
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def sha256():
        return hashlib.sha256(params().numpy().tobytes()).hexdigest()

    @hvd.elastic.run
    def train(state):
        event("begin", step=state.step, params_sha256=sha256())
        while state.step < args.steps:
            if (args.fail and generation <= 1 and rank == args.victim
                    and state.step == args.fail_at):
                event("fail", step=state.step)
                os.kill(os.getpid(), signal.SIGKILL if args.fail == "sigkill" else signal.SIGSTOP)
                time.sleep(600)
            g = torch.Generator().manual_seed(1000 * state.step + rank)
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.step += 1
            event("step", step=state.step)
            if state.step % args.commit_every == 0:
                state.commit()
                event("commit", step=state.step)

    train(state)
    event("done", steps=state.step, params_sha256=sha256())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
