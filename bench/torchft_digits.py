"""The digits job of examples/pytorch_elastic_digits.py under torchft (issue 39's side by
side): the same model, data, seed, batch and learning-rate rule, trained by N replica
groups of one process each under torchft's Lighthouse and Manager on ProcessGroupGloo.

Needs torchft (``pip install torchft``, 0.2.0 here) in the Python that runs it, and
hvdlite: examples/pytorch_digits.py, whose load_data and make_model serve here, imports
it (nothing here initialises it). Roles:

    # a lighthouse (prints {"ev": "lighthouse", "address": ...} and runs until stdin closes)
    python bench/torchft_digits.py lighthouse --min-replicas 2 --heartbeat-timeout-ms 500
    # one replica group (one process); start N of them with --replica 0..N-1
    python bench/torchft_digits.py train --lighthouse http://127.0.0.1:PORT --replica 0 --events
    # one rank of plain torch DDP on gloo (no torchft): the steady-state baseline
    python bench/torchft_digits.py plain --rank 0 --world-size 3 --master 127.0.0.1:PORT --events

bench/torchft_recovery.py starts these, kills a replica and measures.

What matches the hvdlite example: sklearn digits (75/25 split, standardised), the MLP
64-128-64-10, SGD with momentum 0.9, 32 samples per rank and step, learning rate
0.02 x (ranks taking part), seed 42 (every replica builds the same initial model), 12
epochs, and the split of each epoch as hvd.elastic.ElasticSampler does it: the epoch is
shuffled with seed + epoch, and what is left of it is split among the ranks taking
part, every size-th sample from the rank on; when the number of ranks changes the rest
of the epoch is split again (nothing processed is repeated; a step that did not commit
is done again). torchft decides per step who takes part (the quorum), so the split
follows the quorum of each step.

With --events each process prints one JSON line per event, as the hvdlite example:
start (pid, host), ready (the Manager is up), quorum (a new quorum: its id, size,
whether this replica takes part or heals), step (a committed step: step, size, t),
step_failed (a step torchft did not commit: a collective failed), done (accuracy,
params_sha256). ``t`` is time.time(); a step's ``ms`` are the milliseconds of its phases:
the quorum (with the data split; plain DDP: zero_grad and the split), forward + backward
with the gradient allreduce, and should_commit + the optimizer step (plain: the step).
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.nn.functional as F

# The data and the model are examples/pytorch_digits.py's (load_data, make_model).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from pytorch_digits import load_data, make_model  # noqa: E402


def params_sha256(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def accuracy(model, test):
    x, y = test
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


class EpochSplit:
    """hvd.elastic.ElasticSampler's split of an epoch, for a number of ranks that may
    change from one step to the next. State: the epoch and which samples of it are
    processed (a bool mask, so torchft's checkpoint transport can send it)."""

    def __init__(self, n_samples, seed):
        self.n_samples, self.seed = n_samples, seed
        self.epoch = 0
        self.processed = torch.zeros(n_samples, dtype=torch.bool)
        self._split = None          # (ranks, split order, samples per rank); recorded

    def state_dict(self):
        return {"epoch": self.epoch, "processed": self.processed.clone()}

    def load_state_dict(self, state):
        self.epoch = int(state["epoch"])
        self.processed = state["processed"].clone()
        self._split = None

    def restart(self):
        """Split the rest of the epoch again at the next batch(), as an hvdlite reset does
        after any change of membership. (After a change the split of the rest equals the
        one before, except which samples repeat to pad the epoch's last step; so a replica
        that loaded this state and one that kept its own split agree exactly only when
        both split again. The trainer calls this at every new quorum.)"""
        self._split = None

    def _reset(self, ranks):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n_samples, generator=generator)
        remaining = order[~self.processed[order]].tolist()
        per_rank = -(-len(remaining) // ranks)
        total = per_rank * ranks
        if remaining:
            remaining += (remaining * (total // len(remaining) + 1))[:total - len(remaining)]
        self._split = (ranks, remaining, per_rank)
        self._recorded = 0

    def batch(self, ranks, rank, batch_size):
        """The indices of ``rank``'s batch in this step when ``ranks`` take part."""
        if self._split is None or self._split[0] != ranks:
            self._reset(ranks)
        _, order, per_rank = self._split
        mine = order[rank:per_rank * ranks:ranks]
        return mine[self._recorded:min(self._recorded + batch_size, per_rank)]

    def record(self, ranks, batch_size):
        """The step committed: every rank's batch is processed. A finished epoch starts
        the next one. (After load_state_dict, as when torchft heals a replica at this
        step, the rest of the epoch is split here: the same split as the sender's.)"""
        if self._split is None or self._split[0] != ranks:
            self._reset(ranks)
        _, order, per_rank = self._split
        start, stop = self._recorded, min(self._recorded + batch_size, per_rank)
        self._recorded = stop
        self.processed[torch.tensor(order[start * ranks:stop * ranks], dtype=torch.long)] = True
        if stop >= per_rank:
            self.epoch += 1
            self.processed.zero_()
            self._split = None


# ---- roles --------------------------------------------------------------------------------

def make_event(args, **base):
    def event(kind, **fields):
        if args.events:
            sys.stdout.write(json.dumps(dict(ev=kind, t=time.time(), **base, **fields)) + "\n")  # one write
            sys.stdout.flush()
    return event


def wait_for_go(args):
    """With --wait-go: block until the driver writes a line on stdin (so every replica's
    Manager heartbeats before anyone asks for the first quorum)."""
    if args.wait_go:
        sys.stdin.readline()


def run_lighthouse(args):
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="[::]:%d" % args.port, min_replicas=args.min_replicas,
                                  join_timeout_ms=args.join_timeout_ms,
                                  quorum_tick_ms=args.quorum_tick_ms,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    port = int(lighthouse.address().rsplit(":", 1)[1])
    print(json.dumps(dict(ev="lighthouse", t=time.time(), pid=os.getpid(),
                          address="http://%s:%d" % (args.addr, port))), flush=True)
    sys.stdin.read()        # until the driver closes stdin (or dies)
    lighthouse.shutdown()


def fixed_comm_hook(manager, bucket):
    """torchft.DistributedDataParallel's comm hook, except when the allreduce fails. In
    torchft 0.2.0 a failed allreduce (a peer died inside it) makes _ManagedWork.wait()
    report the error to the Manager and return False without setting up the future chain,
    and the stock hook then fails ``assert fut._fut``: the AssertionError ends the backward
    pass and the process. Here the hook hands back the buffer as it is instead; the error is
    already reported, so the Manager does not commit the step and it is done again."""
    work = manager.allreduce(bucket.buffer())
    if work.wait():
        fut = work.get_future()
        fut = getattr(fut, "_fut", fut)
        if fut is not None:
            return fut
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def start_role(args, **who):
    """What both training roles do first, in this order (the same seed, data
    and initial model): the start event, then the data and the model."""
    event = make_event(args, **who)
    event("start", pid=os.getpid(), host=socket.gethostname())
    torch.manual_seed(args.seed)
    (x_train, y_train), test = (ds.tensors for ds in load_data(args.seed))
    return event, (x_train, y_train), test, make_model()


def train_torchft(args):
    torch.set_num_threads(1)
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    event, (x_train, y_train), test, model = start_role(args, replica=args.replica)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    split = EpochSplit(len(x_train), args.seed)
    lr = {"now": args.lr}

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict(),
                "split": split.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        split.load_state_dict(state["split"])
        for group in optimizer.param_groups:        # this step's rate, not the sender's
            group["lr"] = lr["now"]

    # The replica group's own store (one process per group: this one is its master).
    store = TCPStore(args.addr, 0, is_master=True, wait_for_workers=False)
    transport = None
    pg = ProcessGroupGloo(timeout=timedelta(seconds=args.pg_timeout))
    if args.transport == "pg":
        from torchft.checkpointing.pg_transport import PGTransport
        transport = PGTransport(pg, timeout=timedelta(seconds=args.timeout), device="cpu")
    manager = Manager(
        pg=pg, load_state_dict=load_state_dict, state_dict=state_dict,
        min_replica_size=args.min_replicas, use_async_quorum=True,
        timeout=timedelta(seconds=args.timeout), quorum_timeout=timedelta(seconds=args.timeout),
        connect_timeout=timedelta(seconds=args.timeout),
        rank=0, world_size=1, store_addr=args.addr, store_port=store.port,
        lighthouse_addr=args.lighthouse, replica_id="r%d" % args.replica, hostname=args.addr,
        heartbeat_interval=timedelta(milliseconds=args.heartbeat_interval_ms),
        checkpoint_transport=transport,
        # Every replica builds the same model from the seed: no sync at step 0.
        init_sync=False)
    if args.ddp_hook == "fixed":
        class FixedHookDDP(DistributedDataParallel):
            _comm_hook = staticmethod(fixed_comm_hook)
        ddp = FixedHookDDP(manager, model)
    else:
        ddp = DistributedDataParallel(manager, model)
    ft_optimizer = Optimizer(manager, optimizer)
    event("ready", pid=os.getpid())
    wait_for_go(args)

    quorum_id = None
    while split.epoch < args.epochs:
        t0 = time.perf_counter()
        ft_optimizer.zero_grad()                  # starts this step's quorum
        size = manager.num_participants()         # waits for it: the split needs it
        rank = manager.participating_rank()
        if manager._quorum_id != quorum_id:
            quorum_id = manager._quorum_id
            split.restart()
            event("quorum", quorum_id=quorum_id, size=size, participating=rank is not None,
                  heal=bool(manager._healing), step=manager.current_step())
        if args.hang_at_step is not None and manager.current_step() == args.hang_at_step:
            # A test knob: stop before this step's allreduce, as a rank that hangs, so the
            # others wait in the collective for it (the driver then kills this process).
            event("hang", step=manager.current_step() + 1)
            time.sleep(3600)
        # A healing replica computes on any batch: its gradient is zeroed before the
        # allreduce, and it gets the others' average.
        idx = split.batch(size, rank if rank is not None else 0, args.batch_size)
        idx = torch.tensor(idx, dtype=torch.long)
        t1 = time.perf_counter()
        F.cross_entropy(ddp(x_train[idx]), y_train[idx]).backward()     # with the allreduce
        t2 = time.perf_counter()
        lr["now"] = args.lr * size
        for group in optimizer.param_groups:
            group["lr"] = lr["now"]
        before = manager.current_step()
        healing = bool(manager._healing)
        ft_optimizer.step()                       # should_commit; a heal loads the state here
        t3 = time.perf_counter()
        if manager.current_step() > before:
            split.record(size, args.batch_size)
            # ms: [quorum (and the data split), forward + backward with the allreduce,
            # should_commit + optimizer step]
            event("step", step=manager.current_step(), size=size, epoch=split.epoch,
                  participating=rank is not None and not healing, healed=healing,
                  ms=[round(1e3 * (b - a), 3) for a, b in ((t0, t1), (t1, t2), (t2, t3))])
        else:
            err = manager.errored()
            event("step_failed", step=before + 1, size=size,
                  error=str(err.original_exception)[:160] if err else None)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    event("done", pid=os.getpid(), steps=manager.current_step(),
          accuracy=round(100 * accuracy(model, test), 2), params_sha256=params_sha256(model))
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)     # torchft's server threads would keep the process up


def train_plain(args):
    """The same loop on torch's own DDP over a gloo group of fixed size: no torchft."""
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    event, (x_train, y_train), test, model = start_role(args, rank=args.rank)
    size, rank = args.world_size, args.rank
    host, port = args.master.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), size, is_master=rank == 0,
                          timeout=timedelta(seconds=args.timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=args.timeout))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    split = EpochSplit(len(x_train), args.seed)
    event("ready", pid=os.getpid())
    wait_for_go(args)
    step = 0
    while split.epoch < args.epochs:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        idx = torch.tensor(split.batch(size, rank, args.batch_size), dtype=torch.long)
        t1 = time.perf_counter()
        F.cross_entropy(ddp(x_train[idx]), y_train[idx]).backward()     # with the allreduce
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        split.record(size, args.batch_size)
        step += 1
        event("step", step=step, size=size, epoch=split.epoch,
              ms=[round(1e3 * (b - a), 3) for a, b in ((t0, t1), (t1, t2), (t2, t3))])
        if args.step_sleep:
            time.sleep(args.step_sleep)
    event("done", pid=os.getpid(), steps=step, accuracy=round(100 * accuracy(model, test), 2),
          params_sha256=params_sha256(model))
    dist.destroy_process_group()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    lh = sub.add_parser("lighthouse", help="run a torchft Lighthouse")
    lh.add_argument("--port", type=int, default=0)
    lh.add_argument("--min-replicas", type=int, default=2)
    lh.add_argument("--join-timeout-ms", type=int, default=60000,
                    help="how long a quorum waits for replicas that heartbeat but did not "
                         "ask to join (torchft_lighthouse's default: 60000)")
    lh.add_argument("--quorum-tick-ms", type=int, default=100)
    lh.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                    help="a replica without a heartbeat for this long is dead (default 5000)")
    for name, helptext in (("train", "one torchft replica group (one process)"),
                           ("plain", "one rank of torch DDP on gloo, without torchft")):
        t = sub.add_parser(name, help=helptext)
        t.add_argument("--epochs", type=int, default=12)
        t.add_argument("--batch-size", type=int, default=32, help="per rank")
        t.add_argument("--lr", type=float, default=0.02,
                       help="per rank; scaled by the number of ranks taking part")
        t.add_argument("--momentum", type=float, default=0.9)
        t.add_argument("--seed", type=int, default=42)
        t.add_argument("--step-sleep", type=float, default=0.0,
                       help="seconds each step sleeps (to stretch a run)")
        t.add_argument("--timeout", type=float, default=60.0,
                       help="seconds: torchft's Manager timeouts / the gloo group's")
        t.add_argument("--events", action="store_true", help="print JSON event lines")
        t.add_argument("--wait-go", action="store_true",
                       help="wait for a line on stdin before the first step")
        if name == "train":
            t.add_argument("--lighthouse", default=os.environ.get("TORCHFT_LIGHTHOUSE"))
            t.add_argument("--replica", type=int, required=True, help="replica group id")
            t.add_argument("--min-replicas", type=int, default=1,
                           help="the Manager commits a step only with this many replicas")
            t.add_argument("--pg-timeout", type=float, default=10.0,
                           help="seconds: the gloo group's timeout")
            t.add_argument("--heartbeat-interval-ms", type=int, default=100)
            t.add_argument("--hang-at-step", type=int, default=None,
                           help="after committing this step, stop before the next step's "
                                "allreduce (the others block in it): for kill tests")
            t.add_argument("--ddp-hook", choices=["torchft", "fixed"], default="torchft",
                           help="torchft: torchft.DistributedDataParallel as shipped; fixed: "
                                "its comm hook made to survive a failed allreduce "
                                "(see fixed_comm_hook)")
            t.add_argument("--transport", choices=["http", "pg"], default="http",
                           help="how a healing replica gets the state: torchft's HTTP "
                                "transport (default) or over the process group")
        else:
            t.add_argument("--rank", type=int, required=True)
            t.add_argument("--world-size", type=int, required=True)
            t.add_argument("--master", required=True, help="HOST:PORT of rank 0's store")
    for q in sub.choices.values():
        q.add_argument("--addr", default="127.0.0.1",
                       help="this host's address, as the others reach it")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    {"lighthouse": run_lighthouse, "train": train_torchft, "plain": train_plain}[args.role](args)


if __name__ == "__main__":
    main()
