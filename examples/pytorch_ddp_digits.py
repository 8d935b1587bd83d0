"""A plain torch DistributedDataParallel script on scikit-learn's digits, run
on hvdlite's engine through its torch.distributed backend. Compared with a
DDP script for torchrun, one string differs: ``backend="hvdlite"`` (installing
hvdlite registers the backend with torch; this script imports hvdlite for the
engine's statistics it prints; docs/ddp.md)::

    hvdrun -np 2 python examples/pytorch_ddp_digits.py
    mpiexec -n 2 python examples/pytorch_ddp_digits.py --backend gloo   # the same on gloo
    hvdrun -np 2 python examples/pytorch_ddp_digits.py --fp16-hook      # torch's fp16 comm hook
    hvdrun -np 2 python examples/pytorch_ddp_digits.py --hvdlite-hook powersgd  # compressed in the engine

Launched by MPI, ``init_process_group`` needs no other argument: rank, size
and the store come from MPI (also for ``--backend gloo``).
"""
import argparse
import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

import hvdlite


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="hvdlite")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    p.add_argument("--fp16-hook", action="store_true",
                   help="compress gradients to float16 with torch's DDP communication hook")
    p.add_argument("--hvdlite-hook", choices=["fp16", "bf16", "topk", "powersgd"],
                   help="compress gradients in hvdlite's engine (hvdlite.torch.ddp_hooks; "
                        "hvdlite backend only)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return p.parse_args(argv)


def load_data(seed):
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-3
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
            TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test)))


def main(args):
    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)   # DDP broadcasts rank 0's weights at construction

    train_set, test_set = load_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), size)), batch_size=256)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10)))
    if args.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if args.hvdlite_hook:
        from hvdlite.torch import ddp_hooks
        named = model.module.named_parameters()
        hook = {"fp16": lambda: ddp_hooks.fp16_hook,
                "bf16": lambda: ddp_hooks.bf16_hook,
                "topk": lambda: ddp_hooks.topk_hook(0.01, named_parameters=named),
                "powersgd": lambda: ddp_hooks.powersgd_hook(2, named_parameters=named)}
        model.register_comm_hook(None, hook[args.hvdlite_hook]())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        counts = torch.zeros(2, dtype=torch.int64)
        with torch.no_grad():
            for x, y in test_loader:
                counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(counts)
        accuracy = counts[0].item() / counts[1].item()
        if rank == 0 and not args.json:
            print(f"epoch {epoch + 1:3d}  test accuracy {100 * accuracy:.2f}%", flush=True)

    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    result = {"backend": dist.get_backend(), "ranks": size, "test_accuracy": round(100 * accuracy, 2),
              "parameter_sum": checksum}
    if args.backend == "hvdlite":
        # The engine's response cache: every bucket of every step after the
        # first two is a hit (docs/ddp.md, "Engine names").
        stats = hvdlite.engine_stats()
        result.update(cache_hits=stats["cache_hits"], cache_misses=stats["cache_misses"])
    if rank == 0:
        print(json.dumps(result) if args.json else
              f"final test accuracy {100 * accuracy:.2f}% ({size} ranks on {args.backend})", flush=True)
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main(parse_args())
