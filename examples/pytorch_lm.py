"""Data-parallel training of a small byte-level transformer language model on
the source of Python's standard library (the top-level ``*.py`` files of
``sysconfig.get_paths()["stdlib"]``, in sorted order: text that ships with
Python, so it runs offline). Its gradients (4 layers, d_model 384: 7.3 M
parameters, 29 MB of float32) are large enough for the link to matter, which
makes it the example for comparing ways to communicate less.

    hvdrun -np 4 python examples/pytorch_lm.py                        # synchronous, AdamW
    hvdrun -np 4 python examples/pytorch_lm.py --compression powersgd  # PowerSGD rank 2
    hvdrun -np 4 python examples/pytorch_lm.py --optimizer sgd --lr 0.1 \\
        --compression dgc --topk-ratio 0.01                             # DGC's preset (SGD momentum)
    hvdrun -np 4 python examples/pytorch_lm.py --local-sgd 10
    hvdrun -np 4 python examples/pytorch_lm.py --diloco 50             # DiLoCo, outer Nesterov
    hvdrun -np 4 python examples/pytorch_lm.py --diloco 50 --fragments 4   # Streaming DiLoCo
    hvdrun -np 4 python examples/pytorch_lm.py --diloco 50 --compression bf16 --json --curve
    hvdrun -np 4 python examples/pytorch_lm.py --diloco 50 --compression quantize   # 4-bit

Every mode runs ``--steps`` steps of ``--batch-size`` windows of ``--seq-len``
bytes per rank (each rank its own deterministic stream of windows), so runs
with equal ``--steps`` see equal samples. The validation loss (nats per
byte) is measured on a fixed set of windows of the held-out tail of the text;
under DiLoCo it is the loss of the anchor, the model all ranks share. With
``--json`` rank 0 prints one JSON line: validation loss, steps, seconds
(evaluations excluded), the bytes this rank put on the wire
(``hvdlite.engine_stats()``, evaluations excluded) in all and in its busiest
training step, and with ``--curve`` the (step, seconds, wire bytes,
validation loss) of every evaluation. ``--checksum`` makes every rank print a
checksum of its final parameters.

A long run can be split into jobs (a scheduler's time limit, a machine that
is taken back): with ``--checkpoint DIR`` every rank saves its training state
at each evaluation, and the same command run again resumes from the newest
step all ranks saved, to the same parameters and losses as a run that was
never stopped. ``--stop-at STEP`` ends a job after that step (saved there).

    hvdrun -np 4 python examples/pytorch_lm.py --diloco 100 --steps 12000 \\
        --eval-every 500 --checkpoint ckpt --stop-at 6000    # then again without --stop-at
"""
import argparse
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F

import hvdlite
import hvdlite.torch as hvd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per rank")
    p.add_argument("--batch-size", type=int, default=4, help="windows per rank and step")
    p.add_argument("--seq-len", type=int, default=64, help="bytes per window")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--data-mb", type=float, default=4.0,
                   help="megabytes of the standard library's source to read (sorted files)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                   help="the (inner) optimizer; DGC's momentum correction needs sgd")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="peak learning rate (linear warm-up, cosine decay to 10%%); not scaled "
                        "by the number of ranks; for thousands of steps of the default model 5e-4 "
                        "does better, synchronous and DiLoCo alike")
    p.add_argument("--lr-warmup", type=int, default=None, help="warm-up steps (default steps/20)")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--compression", choices=["none", "fp16", "bf16", "topk", "dgc", "powersgd",
                                              "quantize"],
                   default="none", help="synchronous: the gradients'; --diloco: the outer "
                   "gradients' (none, fp16, bf16, quantize: 4 bits per value, as Streaming DiLoCo)")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--max-norm", type=float, default=None, help="dgc: the global clipping norm")
    p.add_argument("--dgc-epoch", type=int, default=None,
                   help="dgc: steps that count as an epoch for its 4-epoch warm-up (default steps/20)")
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--start-iter", type=int, default=10,
                   help="powersgd: steps reduced dense before the low-rank ones")
    p.add_argument("--local-sgd", type=int, default=0, metavar="H",
                   help="local SGD: parameters averaged every H steps")
    p.add_argument("--diloco", type=int, default=0, metavar="H",
                   help="DiLoCo: an outer Nesterov step on the averaged outer gradient every H steps")
    p.add_argument("--fragments", type=int, default=1, help="DiLoCo: Streaming DiLoCo's fragments")
    p.add_argument("--overlap-steps", type=int, default=None)
    p.add_argument("--outer-lr", type=float, default=1.0,
                   help="DiLoCo's outer SGD lr (hvdlite's default; on the full model 0.7 does "
                        "better at --lr 1e-3, 1.0 at --lr 5e-4; docs/compression.md)")
    p.add_argument("--outer-momentum", type=float, default=0.5,
                   help="DiLoCo's outer Nesterov momentum (0: plain SGD)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (0: only at the end)")
    p.add_argument("--eval-windows", type=int, default=64, help="validation windows")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--curve", action="store_true", help="add the evaluations to the JSON")
    p.add_argument("--checksum", action="store_true",
                   help="every rank prints 'CHECKSUM rank R: <sha256 of its final parameters>'")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="rank 0 prints the result as one JSON line (or writes it to PATH)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="every rank saves its training state here at each evaluation; run "
                        "the same command again to resume from the newest step all ranks saved")
    p.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                   help="end this job after STEP steps, saved to --checkpoint (the learning "
                        "rate schedule stays that of --steps)")
    args = p.parse_args(argv)
    local = args.local_sgd or args.diloco
    if args.local_sgd and args.diloco:
        p.error("--local-sgd and --diloco are two ways to sync less often: pick one")
    if args.fragments != 1 and not args.diloco:
        p.error("--fragments applies to --diloco")
    if local and args.compression in ("topk", "dgc", "powersgd"):
        p.error("with --local-sgd/--diloco use --compression none, fp16, bf16 or quantize")
    if args.compression == "dgc" and args.optimizer != "sgd":
        p.error("--compression dgc moves SGD's momentum into the engine (momentum correction): "
                "use --optimizer sgd")
    if args.stop_at is not None and not args.checkpoint:
        p.error("--stop-at needs --checkpoint DIR: the state to resume from is saved there")
    if args.stop_at is not None and not 0 < args.stop_at < args.steps:
        p.error(f"--stop-at must be between 1 and --steps - 1 ({args.steps - 1}), not {args.stop_at}")
    if args.checkpoint and (args.fragments != 1 or args.overlap_steps):
        p.error("--checkpoint saves the state between syncs; Streaming DiLoCo (--fragments, "
                "--overlap-steps) always has one in flight: run it without --checkpoint")
    if args.checkpoint and args.compression in ("topk", "dgc", "powersgd", "quantize"):
        p.error(f"--compression {args.compression} keeps error feedback in the engine, which a "
                "checkpoint does not hold: use --compression none, fp16 or bf16 with --checkpoint")
    if args.lr_warmup is None:
        args.lr_warmup = max(1, args.steps // 20)
    return args


# ---- data ---------------------------------------------------------------------------

def load_text(megabytes, val_fraction):
    """(train, validation) uint8 tensors: the standard library's top-level .py
    files in sorted order, concatenated up to ``megabytes``; the last
    ``val_fraction`` of the bytes are held out."""
    stdlib = sysconfig.get_paths()["stdlib"]
    budget = int(megabytes * 1e6)
    chunks, size = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data[:budget - size])
        size += len(chunks[-1])
        if size >= budget:
            break
    text = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def batch(text, starts, seq_len):
    idx = starts.unsqueeze(1) + torch.arange(seq_len + 1)
    w = text[idx].long()
    return w[:, :-1], w[:, 1:]


# ---- model --------------------------------------------------------------------------

class ByteLM(torch.nn.Module):
    """A pre-norm causal transformer over bytes (vocabulary 256)."""

    def __init__(self, layers, d_model, heads, seq_len):
        super().__init__()
        self.embed = torch.nn.Embedding(256, d_model)
        self.pos = torch.nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                                 activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, 256)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.pos[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def make_model(args):
    return ByteLM(args.layers, args.d_model, args.heads, args.seq_len)


# ---- training -----------------------------------------------------------------------

def compression_of(args):
    if args.compression == "dgc":
        epoch = args.dgc_epoch or max(1, args.steps // 20)
        return hvd.Compression.dgc(args.topk_ratio, steps_per_epoch=epoch, max_norm=args.max_norm)
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio)
    if args.compression == "powersgd":
        return hvd.Compression.powersgd(rank=args.powersgd_rank, start_iter=args.start_iter)
    if args.compression == "quantize":
        return hvd.Compression.quantize(bits=4)
    return {"fp16": hvd.Compression.fp16, "bf16": hvd.Compression.bf16}.get(
        args.compression, hvd.Compression.none)


def lr_at(args, step):
    """Linear warm-up to --lr, then cosine decay to a tenth of it at --steps."""
    if step < args.lr_warmup:
        return args.lr * (step + 1) / args.lr_warmup
    t = (step - args.lr_warmup) / max(1, args.steps - args.lr_warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t))))


def make_optimizer(args, model):
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


def wrap_optimizer(args, model, optimizer):
    if args.local_sgd:
        return hvd.LocalSGD(optimizer, sync_every=args.local_sgd, model=model,
                            compression=compression_of(args))
    if args.diloco:
        outer_lr, outer_momentum = args.outer_lr, args.outer_momentum
        return hvd.DiLoCo(
            model, optimizer, sync_every=args.diloco, fragments=args.fragments,
            overlap_steps=args.overlap_steps, compression=compression_of(args),
            outer_optimizer=lambda params: torch.optim.SGD(
                params, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0))
    return optimizer


def train(args):
    """Trains with ``args`` (from parse_args); returns the result dict on every rank."""
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    train_text, val_text = load_text(args.data_mb, args.val_fraction)
    torch.manual_seed(args.seed)
    model = make_model(args)
    optimizer = make_optimizer(args, model)
    if not (args.local_sgd or args.diloco):
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression_of(args))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = wrap_optimizer(args, model, optimizer)
    # Each rank its own stream of windows; the same streams in every mode.
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    val_starts = torch.linspace(0, len(val_text) - args.seq_len - 2, args.eval_windows).long()
    evaluator = Evaluator(args, model, optimizer, val_text, val_starts[rank::size])

    curve, first_step, done_seconds, done_wire = [], 0, 0.0, 0
    peak_step_bytes, losses = 0, []
    checkpoint = Checkpoint(args, rank) if args.checkpoint else None
    saved = checkpoint.load() if checkpoint else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        gen.set_state(saved["generator"])
        first_step, curve, losses = saved["step"], saved["curve"], saved["losses"]
        done_seconds, done_wire, peak_step_bytes = saved["seconds"], saved["wire"], saved["peak_step_bytes"]
    start, wire_start = time.time() - done_seconds, _wire_bytes() - done_wire

    def save(step):
        checkpoint.save(step, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "generator": gen.get_state(), "curve": curve, "losses": losses,
            "seconds": time.time() - start - evaluator.seconds,
            "wire": _wire_bytes() - wire_start - evaluator.wire, "peak_step_bytes": peak_step_bytes})

    for step in range(first_step, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(args, step)
        x, y = batch(train_text, torch.randint(0, len(train_text) - args.seq_len - 1,
                                               (args.batch_size,), generator=gen), args.seq_len)
        before = _wire_bytes()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        optimizer.step()
        peak_step_bytes = max(peak_step_bytes, _wire_bytes() - before)
        losses.append(loss.item())
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            if hasattr(optimizer, "wait_reductions"):
                # A Streaming DiLoCo sync in flight finishes on training's time and bytes,
                # not the evaluation's (its outer step stays on schedule).
                optimizer.wait_reductions()
            curve.append(evaluator.point(step + 1, time.time() - start - evaluator.seconds,
                                         _wire_bytes() - wire_start - evaluator.wire))
            if checkpoint and step + 1 != args.stop_at:
                save(step + 1)
        if step + 1 == args.stop_at:
            save(step + 1)
            if rank == 0:
                print(f"stopped after step {step + 1} of {args.steps}, saved to {args.checkpoint}: "
                      "the same command without --stop-at goes on from there", flush=True)
            return None
    if (args.local_sgd or args.diloco) and not in_sync_after(args):
        optimizer.synchronize()  # one model on every rank (not counted in the peak of a step)
    elapsed = time.time() - start - evaluator.seconds
    wire = _wire_bytes() - wire_start - evaluator.wire
    curve.append(evaluator.point(args.steps, elapsed, wire, final=True))
    val_loss = curve[-1][3]
    tail = losses[-max(1, len(losses) // 10):]
    result = {"ranks": size, "steps": args.steps, "batch_size": args.batch_size,
              "seq_len": args.seq_len, "params": sum(p.numel() for p in model.parameters()),
              "optimizer": args.optimizer, "lr": args.lr, "compression": args.compression,
              "local_sgd": args.local_sgd, "diloco": args.diloco, "fragments": args.fragments,
              "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum, "seed": args.seed,
              "first_train_loss": round(losses[0], 4),
              "train_loss_last_tenth": round(sum(tail) / len(tail), 4),
              "val_loss": round(val_loss, 4), "seconds": round(elapsed, 2),
              "wire_bytes": wire, "wire_bytes_per_step": round(wire / args.steps),
              "peak_wire_bytes_per_step": peak_step_bytes}
    if args.curve:
        result["curve"] = [[s, round(t, 2), b, round(v, 4)] for s, t, b, v in curve]
    if args.checksum:
        sys.stdout.write(f"CHECKSUM rank {rank}: {checksum(model)}\n")  # one write: ranks share a pipe
        sys.stdout.flush()
    report(args, result, rank)
    return result


def in_sync_after(args):
    """Whether the last step's sync left one model on every rank (then
    synchronize() is not needed: it would send LocalSGD's model again)."""
    h = args.local_sgd or args.diloco
    whole = args.local_sgd or (args.fragments == 1 and not args.overlap_steps)
    return bool(h) and whole and args.steps % h == 0


class Checkpoint:
    """Each rank's training state in ``DIR/rank<R>-step<S>.pt``. A rank drops
    its older file only once every rank has saved the newer step, so a job
    killed while saving still leaves a step that all ranks have."""

    # Arguments that change what is measured or printed, not the training.
    FREE = ("json", "curve", "checksum", "checkpoint", "stop_at", "eval_every")

    def __init__(self, args, rank):
        self.args, self.rank, self.dir = args, rank, args.checkpoint
        os.makedirs(self.dir, exist_ok=True)

    def _training_args(self):
        return {k: v for k, v in sorted(vars(self.args).items()) if k not in self.FREE}

    def _steps(self):
        prefix = f"rank{self.rank}-step"
        return sorted(int(n[len(prefix):-3]) for n in os.listdir(self.dir)
                      if n.startswith(prefix) and n.endswith(".pt"))

    def _path(self, step):
        return os.path.join(self.dir, f"rank{self.rank}-step{step}.pt")

    def save(self, step, state):
        state = dict(state, step=step, args=self._training_args())
        tmp = self._path(step) + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, self._path(step))
        hvd.barrier()   # every rank has step saved: the older ones can go
        for old in self._steps():
            if old != step:
                os.remove(self._path(old))

    def load(self):
        """The state of the newest step every rank saved, or None."""
        mine = self._steps()
        common = set(mine).intersection(*hvd.allgather_object(mine, name="checkpoint.steps"))
        if not common:
            return None
        state = torch.load(self._path(max(common)))
        ours = self._training_args()
        differ = sorted(k for k in set(ours) | set(state["args"]) if ours.get(k) != state["args"].get(k))
        if differ:
            saved = ", ".join(f"--{k.replace('_', '-')} {state['args'].get(k)!r}" for k in differ)
            raise SystemExit(f"{self.dir} holds a run started with other arguments ({saved}): "
                             "resume it with those, or give another --checkpoint")
        if self.rank == 0:
            print(f"resuming from step {state['step']} of {self.args.steps} ({self.dir})", flush=True)
        return state


class Evaluator:
    """Validation loss of the shared model; its own time and reductions'
    bytes kept apart (``seconds``, ``wire``) so that the run's are the
    training's."""

    def __init__(self, args, model, optimizer, val_text, starts):
        self.args, self.model, self.optimizer = args, model, optimizer
        self.val_text, self.starts, self.wire, self.seconds = val_text, starts, 0, 0.0

    def point(self, step, seconds, wire, final=False):
        before, began = _wire_bytes(), time.time()
        anchor = getattr(self.optimizer, "anchor", None)
        saved = None
        if anchor is not None and not final:   # DiLoCo: the anchor is the shared model
            saved = [p.detach().clone() for p in self.optimizer.params]
            with torch.no_grad():
                for p, a in zip(self.optimizer.params, anchor):
                    p.copy_(a)
        loss = self.loss()
        if saved is not None:
            with torch.no_grad():
                for p, s in zip(self.optimizer.params, saved):
                    p.copy_(s)
        self.wire += _wire_bytes() - before
        self.seconds += time.time() - began
        if hvd.rank() == 0:
            # With --json the results own stdout; the progress goes to stderr.
            print(f"step {step:5d}  {seconds:7.1f} s  wire {wire / 1e6:9.1f} MB  "
                  f"validation loss {loss:.4f}", file=sys.stderr if self.args.json else sys.stdout,
                  flush=True)
        return step, seconds, wire, loss

    def loss(self):
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for chunk in self.starts.split(16):
                x, y = batch(self.val_text, chunk, self.args.seq_len)
                total[0] += F.cross_entropy(self.model(x).reshape(-1, 256), y.reshape(-1),
                                            reduction="sum").item()
                total[1] += y.numel()
        self.model.train()
        # Under local SGD the ranks' models differ between syncs: the mean of their losses.
        total = hvd.allreduce(total, op=hvd.Sum, name="metric.val_loss")
        return float(total[0] / total[1])


def checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def report(args, result, rank):
    if rank != 0:
        return
    if args.json == "-":
        sys.stdout.write(json.dumps(result) + "\n")  # one write: the other ranks share the pipe
        sys.stdout.flush()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    else:
        print(f"validation loss {result['val_loss']:.4f} after {result['steps']} steps "
              f"({result['ranks']} ranks, {result['seconds']:.1f} s, "
              f"{result['wire_bytes_per_step'] / 1e6:.2f} MB per step on the wire)", flush=True)


def _wire_bytes():
    """Bytes this rank has put on the wire for reductions so far."""
    return sum(v for k, v in hvdlite.engine_stats().items() if k.startswith("wire_bytes_"))


def main():
    train(parse_args())


if __name__ == "__main__":
    main()
