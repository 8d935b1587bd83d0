"""Data-parallel training of a small MLP on scikit-learn's handwritten digits
(8x8 images, 10 classes; real data that ships inside scikit-learn, so it runs
offline). A Horovod-style script: change the import and it is the same.

    mpiexec -n 2 python examples/pytorch_digits.py
    hvdrun -np 4 python examples/pytorch_digits.py --compression fp16
    hvdrun -np 4 python examples/pytorch_digits.py --compression topk --topk-ratio 0.001 \
        --momentum-correction --warmup-steps 40      # Deep Gradient Compression
    hvdrun -np 4 python examples/pytorch_digits.py --compression powersgd --powersgd-rank 2
    mpiexec -n 2 python examples/pytorch_digits.py --check     # verify every step
    hvdrun -np 4 python examples/pytorch_digits.py --local-sgd 4           # average every 4 steps
    hvdrun -np 4 python examples/pytorch_digits.py --diloco 20                        # DiLoCo
    hvdrun -np 4 python examples/pytorch_digits.py --diloco 20 --fragments 3 --compression fp16
    hvdrun -np 4 python examples/pytorch_digits.py --diloco 20 --compression quantize   # 4-bit outer gradients

With --check, after every step each rank verifies that (1) the parameters are
bitwise identical on all ranks and (2) without compression, they match a
single-process model trained on the combined batch of all ranks (to
--check-tol), and prints the largest difference seen.
"""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

import hvdlite
import hvdlite.torch as hvd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--compression", choices=["none", "fp16", "bf16", "topk", "dgc", "powersgd", "quantize"],
                   default="none", help="dgc: Compression.dgc(--topk-ratio), DGC's preset "
                   "(momentum correction, a 4-epoch warm-up, clipping at --max-norm); quantize: "
                   "Compression.quantize(--bits, --block-size, --rounding)")
    p.add_argument("--op", choices=["average", "adasum"], default="average",
                   help="how ranks combine: average the gradients, or Adasum of the optimizer "
                        "updates (power-of-2 ranks; the learning rate is not scaled)")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--no-error-feedback", action="store_true")
    p.add_argument("--momentum-correction", action="store_true",
                   help="top-k: the engine applies SGD's momentum before selection (DGC)")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="top-k: steps over which the density falls from dense to --topk-ratio")
    p.add_argument("--clip-norm", type=float, default=None,
                   help="top-k: largest L2 norm of a tensor's gradient on one rank")
    p.add_argument("--max-norm", type=float, default=None,
                   help="dgc: the global clipping norm (each rank clips at max-norm / sqrt(ranks))")
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--start-iter", type=int, default=10,
                   help="powersgd: steps reduced dense before the low-rank ones")
    p.add_argument("--bits", type=int, choices=[4, 8], default=4, help="quantize: bits per value")
    p.add_argument("--block-size", type=int, default=64, help="quantize: values per scale")
    p.add_argument("--rounding", choices=["nearest", "stochastic"], default=None,
                   help="quantize: default nearest with error feedback, stochastic without")
    p.add_argument("--local-sgd", type=int, default=0, metavar="H",
                   help="local SGD: each rank steps alone, parameters averaged every H steps")
    p.add_argument("--diloco", type=int, default=0, metavar="H",
                   help="DiLoCo: each rank steps alone; every H steps an outer Nesterov step "
                        "on the averaged outer gradient")
    p.add_argument("--fragments", type=int, default=1,
                   help="DiLoCo: fragments syncing on staggered steps (Streaming DiLoCo)")
    p.add_argument("--overlap-steps", type=int, default=None,
                   help="DiLoCo: inner steps a fragment's reduction overlaps (default 1 with "
                        "--fragments > 1, else 0)")
    p.add_argument("--outer-lr", type=float, default=1.0)
    p.add_argument("--outer-momentum", type=float, default=0.5,
                   help="DiLoCo's outer Nesterov momentum (0: plain SGD)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--check", action="store_true",
                   help="verify identical parameters and the single-process reference every step")
    p.add_argument("--check-tol", type=float, default=1e-5)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)
    if args.check and args.op != "average":
        p.error("--check compares with single-process SGD on the combined batch, which is what "
                "--op average computes; it does not apply to --op adasum")
    local = args.local_sgd or args.diloco
    if args.local_sgd and args.diloco:
        p.error("--local-sgd and --diloco are two ways to sync less often: pick one")
    if local and (args.check or args.op != "average"):
        p.error("--local-sgd/--diloco let the ranks differ between syncs: --check and "
                "--op adasum do not apply")
    if args.fragments != 1 and not args.diloco:
        p.error("--fragments applies to --diloco")
    if local and args.compression in ("topk", "powersgd"):
        p.error("with --local-sgd/--diloco use --compression none, fp16, bf16 or quantize")
    return args


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


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10))


def compression_of(args, steps_per_epoch=None):
    if args.compression == "dgc":
        return hvd.Compression.dgc(args.topk_ratio, steps_per_epoch=steps_per_epoch,
                                   max_norm=args.max_norm)
    if args.compression == "fp16":
        return hvd.Compression.fp16
    if args.compression == "bf16":
        return hvd.Compression.bf16
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio, error_feedback=not args.no_error_feedback,
                                    momentum_correction=args.momentum_correction or None,
                                    warmup_steps=args.warmup_steps, clip_norm=args.clip_norm)
    if args.compression == "powersgd":
        return hvd.Compression.powersgd(rank=args.powersgd_rank, start_iter=args.start_iter)
    if args.compression == "quantize":
        return hvd.Compression.quantize(bits=args.bits, block_size=args.block_size, rounding=args.rounding,
                                        error_feedback=not args.no_error_feedback)
    return hvd.Compression.none


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(args):
    """Trains with ``args`` (from parse_args); returns the result dict on every rank."""
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # A different init on every rank: broadcast_parameters makes them equal.
    torch.manual_seed(args.seed + rank)

    train_set, test_set = load_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    # Each rank evaluates a disjoint part of the test set (no padding).
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), size)), batch_size=256)

    model = make_model()
    # Averaging gradients over `size` ranks is one step on a `size` times larger
    # batch: scale the learning rate. Adasum adapts the combined step itself;
    # with local SGD and DiLoCo each rank steps on its own batch.
    local = args.local_sgd or args.diloco
    lr = args.lr * size if args.op == "average" and not local else args.lr
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    if not local:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression_of(args, len(train_loader)),
                                             op=hvd.Adasum if args.op == "adasum" else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if args.local_sgd:
        optimizer = hvd.LocalSGD(optimizer, sync_every=args.local_sgd, model=model,
                                 compression=compression_of(args, len(train_loader)))
    elif args.diloco:
        outer_lr, outer_momentum = args.outer_lr, args.outer_momentum
        optimizer = hvd.DiLoCo(
            model, optimizer, sync_every=args.diloco, fragments=args.fragments,
            overlap_steps=args.overlap_steps, compression=compression_of(args, len(train_loader)),
            outer_optimizer=lambda params: torch.optim.SGD(
                params, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0))

    reference = ref_opt = None
    max_diff = 0.0
    if args.check:
        reference = make_model()
        reference.load_state_dict(model.state_dict())
        ref_opt = torch.optim.SGD(reference.parameters(), lr=args.lr * size,
                                  momentum=args.momentum)

    steps, start, wire_start = 0, time.time(), _wire_bytes()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        epoch_wire, epoch_steps = _wire_bytes(), steps
        model.train()
        loss_sum, batches = 0.0, 0
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            batches += 1
            steps += 1
            if args.check:
                max_diff = max(max_diff, check_step(model, reference, ref_opt, x, y, steps,
                                                    args.check_tol, size,
                                                    exact=args.compression == "none"))
        if local and epoch == args.epochs - 1:
            optimizer.synchronize()  # one model on every rank to evaluate
        last_epoch_wire = _wire_bytes() - epoch_wire
        train_loss = hvd.allreduce(torch.tensor(loss_sum / max(batches, 1)),
                                   name="metric.train_loss").item()
        accuracy = evaluate(model, test_loader)
        if rank == 0 and not args.json:
            print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}  "
                  f"test accuracy {100 * accuracy:.2f}%", flush=True)

    elapsed = time.time() - start
    wire = _wire_bytes() - wire_start
    result = {"ranks": size, "epochs": args.epochs, "compression": repr(compression_of(args, len(train_loader))),
              "op": args.op, "seed": args.seed, "local_sgd": args.local_sgd,
              "diloco": args.diloco, "fragments": args.fragments,
              "test_accuracy": round(100 * accuracy, 2),
              "steps": steps, "seconds": round(elapsed, 2),
              "wire_bytes_per_step": round(wire / max(steps, 1)),
              "wire_bytes_per_step_last_epoch": round(last_epoch_wire / max(steps - epoch_steps, 1))}
    if args.check and args.compression == "none":
        result["max_diff_vs_single_process"] = max_diff
    if args.check:
        result["bitwise_identical_every_step"] = True
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"final test accuracy {100 * accuracy:.2f}% ({size} ranks, "
                  f"compression {args.compression}, {elapsed:.1f}s)", flush=True)
            if args.check and args.compression == "none":
                print(f"checked {steps} steps: parameters bitwise identical on all ranks; "
                      f"largest difference from single-process training {max_diff:.2e}",
                      flush=True)
            elif args.check:
                print(f"checked {steps} steps: parameters bitwise identical on all ranks "
                      "(compressed steps differ from single-process training by design)", flush=True)
    return result


def _wire_bytes():
    """Bytes this rank has put on the wire for reductions so far (compressed
    forms where compression applies)."""
    return sum(v for k, v in hvdlite.engine_stats().items() if k.startswith("wire_bytes_"))


def main():
    train(parse_args())


def check_step(model, reference, ref_opt, x, y, step, tol, size, exact=True):
    # (1) bitwise identical on every rank
    mine = flat_params(model)
    everyone = hvd.allgather(mine.unsqueeze(0), name="check.params")
    for r in range(size):
        if not torch.equal(everyone[r], mine):
            raise SystemExit(f"step {step}: parameters of rank {r} differ from rank "
                             f"{hvd.rank()}'s (max {float((everyone[r] - mine).abs().max()):.3e})")
    if not exact:  # compression changes the step: (1) is what holds
        return 0.0
    # (2) the same step on one process with the combined batch
    xs = hvd.allgather(x, name="check.x")
    ys = hvd.allgather(y, name="check.y")
    ref_opt.zero_grad()
    F.cross_entropy(reference(xs), ys).backward()
    ref_opt.step()
    diff = float((flat_params(reference) - mine).abs().max())
    if diff > tol:
        raise SystemExit(f"step {step}: parameters differ from single-process training on the "
                         f"combined batch by {diff:.3e} > {tol}")
    return diff


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    # Metric averaging: sum counts over ranks, then divide.
    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum,
                           name="metric.accuracy")
    return float(counts[0] / counts[1])


if __name__ == "__main__":
    main()
