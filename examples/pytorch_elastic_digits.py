"""Elastic data-parallel training on scikit-learn's digits: the job keeps
training when a host is lost and grows when hosts are added.

    # a plain job (no elastic driver): the same script, one run
    hvdrun -np 2 python examples/pytorch_elastic_digits.py

    # elastic: 2 to 3 hosts; hvdrun restarts the job on the hosts it has
    hvdrun --min-np 2 --max-np 3 -H node1,node2,node3 python examples/pytorch_elastic_digits.py
    hvdrun --min-np 2 --host-discovery-script ./discover_hosts.sh \\
        python examples/pytorch_elastic_digits.py

The training function runs under ``hvd.elastic.run``: everything it needs to
continue (model, optimizer, sampler, epoch, step) is in a ``TorchState``,
committed every --commit-every batches. After a host is lost or added, the
job starts again from the newest commit; the batches since that commit are
done again, the rest of the epoch is split among the ranks there are now,
and the learning rate follows the number of ranks (a reset callback).

With --events every rank prints one JSON line per event (start, step,
commit, done), for tests and measurements.
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

import hvdlite.torch as hvd

from pytorch_digits import evaluate, load_data, make_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--commit-every", type=int, default=4, help="batches between commits")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds each step sleeps (to stretch a test run)")
    p.add_argument("--events", action="store_true", help="print JSON event lines")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(args.seed)
    train_set, test_set = load_data(args.seed)

    def event(kind, all_ranks=False, **fields):
        if args.events and (all_ranks or hvd.rank() == 0):
            line = json.dumps(dict(ev=kind, rank=hvd.rank(), size=hvd.size(), t=time.time(), **fields))
            sys.stdout.write(line + "\n")  # one write: ranks share a pipe
            sys.stdout.flush()

    event("start", all_ranks=True, pid=os.getpid(), host=socket.gethostname(),
          generation=int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0")))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)

    def on_reset():
        # The same samples per step on each rank: the combined batch follows
        # the number of ranks, and so does the learning rate.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
    state.register_reset_callbacks([on_reset])

    def params_sha256():
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()

    @hvd.elastic.run
    def train(state):
        # Here every rank holds the same state: rank 0's at the first start,
        # the newest commit after a restart.
        event("begin", all_ranks=True, pid=os.getpid(), step=state.step, epoch=state.epoch,
              params_sha256=params_sha256())
        while state.epoch < args.epochs:
            loader = DataLoader(train_set, batch_size=args.batch_size, sampler=state.sampler)
            for batch_idx, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.step += 1
                event("step", step=state.step, epoch=state.epoch)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if state.step % args.commit_every == 0:
                    state.commit()
                    event("commit", step=state.step)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
            event("commit", step=state.step)

    train(state)
    # Each rank evaluates a disjoint part of the test set.
    accuracy = evaluate(model, DataLoader(Subset(test_set, range(hvd.rank(), len(test_set), hvd.size())),
                                          batch_size=256))
    event("done", all_ranks=True, pid=os.getpid(), steps=state.step, accuracy=round(100 * accuracy, 2),
          params_sha256=params_sha256())
    if not args.events and hvd.rank() == 0:
        print(f"test accuracy {100 * accuracy:.2f}% after {state.step} steps on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
