"""TORCH_DISTRIBUTED_DEBUG=DETAIL on the "hvdlite" backend: each collective of
a group is first compared across its ranks (hvdlite/torch/c10d.py,
``_Names.check``), so ranks whose collectives differ raise
TensorMismatchError at once, on every rank, instead of stalling.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it at 2 and 4 ranks with
TORCH_DISTRIBUTED_DEBUG=DETAIL. DDP with each of its features trains on the
checked default group exactly as on a second hvdlite group made with the
debug level off (no check: the same engine, so the same parameters bit for
bit); every collective passes the check with its NumPy result; then ranks
that disagree on a shape, a root, the operation (the engine's, or only
torch's: reduce against all_reduce), the number of tensors in a coalesced
call, or a collective that one rank skipped before DDP's backward, each
raise on every rank, and the group goes on
working. (DDP on gloo is not the reference here: with torch 2.13 it
crashes under DETAIL, in DDP's logger, before it trains.)
"""
import numpy as np

from harness.c10d_ranks import Branchy, backward, batch, data, group, make_model  # noqa: F401  (fixtures)
from harness.checks import check, check_close, check_equal, expect, require

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite.torch  # noqa: E402,F401  (registers the backend)
from hvdlite.exceptions import TensorMismatchError  # noqa: E402

torch.set_num_threads(1)
_UNCHECKED = []
WORDS = ("TORCH_DISTRIBUTED_DEBUG=DETAIL", "Every rank of a group must make the same collectives")


def unchecked(group):
    """A second hvdlite group of every rank, made with the debug level off."""
    check("debug level", dist.get_debug_level() == dist.DebugLevel.DETAIL, dist.get_debug_level())
    if not _UNCHECKED:
        dist.set_debug_level(dist.DebugLevel.OFF)
        try:
            _UNCHECKED.append(dist.new_group(backend="hvdlite"))
        finally:
            dist.set_debug_level(dist.DebugLevel.DETAIL)
    return _UNCHECKED[0]


def checked_so_far(g):
    return g._names._checked


def DDP(model, group, **kwargs):
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, process_group=group, **kwargs)


def check_same(a, b, what):
    for (name, pa), (_, pb) in zip(a.module.named_parameters(), b.module.named_parameters()):
        check(f"{what}: {name} equal on the checked and the unchecked group",
              torch.equal(pa.detach(), pb.detach()),
              f"(max difference {(pa.detach() - pb.detach()).abs().max().item():g})")


def ddp_pair(group, rank, feature):
    model = (lambda: Branchy(rank)) if feature == "find_unused_parameters" else (lambda: make_model(rank))
    kwargs = {feature: True} if feature in ("find_unused_parameters", "static_graph") else {}
    return DDP(model(), dist.group.WORLD, **kwargs), DDP(model(), unchecked(group), **kwargs)


def train(m, rank, feature):
    from torch.distributed.algorithms.join import Join
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    accumulate = 3 if feature == "no_sync" else 1
    steps = rank + 2 if feature == "join" else 3
    with Join([m], enable=feature == "join"):
        for step in range(steps):
            backward(m, step, rank, accumulate)
            opt.step()
            opt.zero_grad()


def test_ddp_features_train_alike_checked_and_unchecked(group, rank, size):
    for feature in ("plain", "no_sync", "find_unused_parameters", "static_graph", "join"):
        before = checked_so_far(dist.group.WORLD)
        a, b = ddp_pair(group, rank, feature)
        train(a, rank, feature)
        train(b, rank, feature)
        check_same(a, b, feature)
        checked = checked_so_far(dist.group.WORLD) - before
        check(f"{feature}: the default group checked DDP's collectives", checked >= 3, f"({checked})")
        check(f"{feature}: the unchecked group checked none", checked_so_far(unchecked(group)) == 0)


def test_every_collective_passes_the_check(group, rank, size):
    xs = [data(r, (size, 3), torch.float32, salt=5).numpy() for r in range(size)]
    t = torch.from_numpy(xs[rank].copy())
    dist.all_reduce(t)
    check_close(t.numpy(), np.sum(xs, axis=0), "all_reduce", rtol=1e-6, atol=1e-6)
    ts = [torch.from_numpy(xs[rank].copy()), torch.from_numpy(xs[rank][0].copy())]
    dist.all_reduce_coalesced(ts)
    check_close(ts[1].numpy(), np.sum(xs, axis=0)[0], "all_reduce_coalesced", rtol=1e-6, atol=1e-6)
    t = torch.from_numpy(xs[rank].copy())
    dist.reduce(t, dst=size - 1)
    check_close(t.numpy(), np.sum(xs, axis=0) if rank == size - 1 else xs[rank], "reduce",
                rtol=1e-6, atol=1e-6)
    t = torch.from_numpy(xs[rank].copy())
    dist.broadcast(t, src=size - 1)
    check_equal(t.numpy(), xs[size - 1], "broadcast")
    outs = [torch.empty(size, 3) for _ in range(size)]
    dist.all_gather(outs, torch.from_numpy(xs[rank]))
    check_equal(np.stack([o.numpy() for o in outs]), np.stack(xs), "all_gather")
    out = torch.empty(size * size, 3)
    dist.all_gather_into_tensor(out, torch.from_numpy(xs[rank]))
    check_equal(out.numpy(), np.concatenate(xs), "all_gather_into_tensor")
    out = torch.empty(1, 3)
    dist.reduce_scatter_tensor(out, torch.from_numpy(xs[rank].copy()))
    check_close(out.numpy(), np.sum(xs, axis=0)[rank:rank + 1], "reduce_scatter_tensor",
                rtol=1e-6, atol=1e-6)
    out = torch.empty(size, 3)
    dist.all_to_all_single(out, torch.from_numpy(xs[rank].copy()))
    check_equal(out.numpy(), np.stack([x[rank] for x in xs]), "all_to_all_single")
    gathered = [torch.empty(size, 3) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.from_numpy(xs[rank]), gathered, dst=0)
    if rank == 0:
        check_equal(np.stack([g.numpy() for g in gathered]), np.stack(xs), "gather")
    out = torch.empty(3)
    dist.scatter(out, [torch.from_numpy(xs[0][r].copy()) for r in range(size)] if rank == 0 else None, src=0)
    check_equal(out.numpy(), xs[0][rank], "scatter")
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    check("all_gather_object", objects == [{"rank": r} for r in range(size)], objects)
    dist.barrier()


def still_works(what):
    t = torch.ones(5)
    dist.all_reduce(t)
    check_equal(t.numpy(), np.full(5, dist.get_world_size(), np.float32), f"all_reduce after {what}")


def test_other_shapes_raise_on_every_rank(group, rank, size):
    e = expect(TensorMismatchError, lambda: dist.all_reduce(torch.ones(7 + rank)), *WORDS,
               *(f"ranks [{r}] all_reduce (allreduce.sum.float32.{7 + r})" for r in range(size)))
    check("collective named by number", " as its collective " in str(e), str(e))
    still_works("shapes that differ")


def test_other_roots_raise_on_every_rank(group, rank, size):
    root = 0 if rank == 0 else 1
    expect(TensorMismatchError, lambda: dist.broadcast(torch.ones(3), src=root), *WORDS,
           "ranks [0] broadcast (broadcast.0.float32.3)", "broadcast (broadcast.1.float32.3)")
    still_works("roots that differ")


def test_barrier_against_all_reduce_raises_on_every_rank(group, rank, size):
    call = dist.barrier if rank == 0 else (lambda: dist.all_reduce(torch.ones(3)))
    expect(TensorMismatchError, call, *WORDS, "ranks [0] barrier;",
           "ranks %s all_reduce (allreduce.sum.float32.3)" % list(range(1, size)))
    still_works("a barrier against an all_reduce")


def test_reduce_against_all_reduce_raises_on_every_rank(group, rank, size):
    """One allreduce to the engine, two calls to torch: compared as torch does."""
    t = torch.ones(3)
    call = (lambda: dist.reduce(t, dst=0)) if rank == 0 else (lambda: dist.all_reduce(t))
    expect(TensorMismatchError, call, *WORDS, "ranks [0] reduce(dst=0) (allreduce.sum.float32.3)",
           "ranks %s all_reduce (allreduce.sum.float32.3)" % list(range(1, size)))
    still_works("a reduce against an all_reduce")


def test_coalesced_tensor_counts_raise_on_every_rank(group, rank, size):
    """A coalesced call is checked as one: rank 0 passes one tensor more."""
    tensors = [torch.ones(3) for _ in range(2 + (rank == 0))]
    every = "; ".join(["allreduce.sum.float32.3"] * 2)
    expect(TensorMismatchError, lambda: dist.all_reduce_coalesced(tensors), *WORDS,
           f"ranks [0] all_reduce_coalesced ({every}; allreduce.sum.float32.3)",
           "ranks %s all_reduce_coalesced (%s)" % (list(range(1, size)), every))
    still_works("coalesced calls of different lengths")


def test_collective_skipped_before_ddp_backward_raises_on_every_rank(group, rank, size):
    """Rank 0 makes an all_reduce the others skip: they are in DDP's backward,
    whose bucket allreduce meets it; both raise (the others from backward)."""
    m = DDP(make_model(0), dist.group.WORLD)
    x, y = batch(0, rank)
    loss = torch.nn.CrossEntropyLoss()(m(x), y)

    def step():
        if rank == 0:
            dist.all_reduce(torch.ones(7))
        else:
            loss.backward()
    expect(Exception, step, *WORDS, "ranks [0] all_reduce (allreduce.sum.float32.7)",
           "ranks %s all_reduce (allreduce.sum.float32." % list(range(1, size)))
    still_works("a skipped collective")
