"""torch.distributed's "hvdlite" backend on hvdlite's device path
(hvdlite/torch/c10d.py over hvdlite/torch/device.py).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it under mpiexec, so
``init_process_group(backend="hvdlite")`` gets no other argument. The
tensors live on ``HVDLITE_TEST_C10D_DEVICE``:

- ``cpu`` (the default), with ``HVDLITE_DEVICE_TRANSPORT=gloo``: every CPU
  tensor goes through the device executor on gloo, the path of CUDA tensors
  with gloo in NCCL's place (what runs without a GPU);
- ``cuda`` (GPU hosts): CUDA tensors, through NCCL where every rank of the
  host has a GPU of its own, else staged through host memory.

Each collective is checked against a NumPy reference (every rank rebuilds
every rank's input, seeded by rank) and against hvdlite.torch.device.counts:
it ran on the executor (or was staged, where NCCL cannot run), not on the
engine's own path. DDP on hvdlite is checked against DDP on a gloo group of
the same job, step by step.
"""
import os
import threading

import numpy as np
import pytest

from harness.checks import check, check_close, check_equal, require
from harness.collective_reference import reduce_ref

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402  (registers the backend)
from hvdlite.torch import device as hvd_device  # noqa: E402
from harness.c10d_ranks import data, gloo, group, inputs, make_model  # noqa: E402,F401  (fixtures)

torch.set_num_threads(1)

DEVICE_VAR = "HVDLITE_TEST_C10D_DEVICE"
DTYPES = {"float32": torch.float32, "int32": torch.int32}
OPS = {"SUM": (dist.ReduceOp.SUM, hvd.Sum), "AVG": (dist.ReduceOp.AVG, hvd.Average),
       "MIN": (dist.ReduceOp.MIN, hvd.Min), "MAX": (dist.ReduceOp.MAX, hvd.Max),
       "PRODUCT": (dist.ReduceOp.PRODUCT, hvd.Product)}


def device_type():
    return os.environ.get(DEVICE_VAR, "cpu")


def dev():
    """This rank's device: the CPU, or its GPU (local rank modulo the GPUs)."""
    if device_type() == "cuda":
        index = hvdlite.local_rank() % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def expected_executor():
    """The executor's backend this job must have: gloo for CPU tensors
    (HVDLITE_DEVICE_TRANSPORT=gloo), NCCL for CUDA tensors where it can run
    (else none: they are staged)."""
    if device_type() == "cuda":
        return "nccl" if hvd_device.nccl_usable() else None
    return "gloo"


class device_path:
    """Checks that the collectives in the ``with`` block ran on the device
    executor (or, for CUDA tensors where NCCL cannot run, were staged)."""

    def __enter__(self):
        self.before = dict(hvd_device.counts)
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            return False
        key = "device_jobs" if hvd_device.backend_name() is not None else "staged"
        grew = hvd_device.counts[key] - self.before[key]
        check(f"the collectives went through the device path ({key})", grew > 0,
              f"(counts before {self.before}, after {hvd_device.counts})")
        return False


def on_dev(t):
    """A copy of ``t`` on this rank's device (never ``t`` itself)."""
    return t.to(dev(), copy=True)


def same(got, want, what):
    """``got`` (a tensor on the test's device) against a NumPy reference:
    exact for integers."""
    check("on the test's device", got.device.type == device_type(), f"({got.device})")
    got = got.cpu().numpy()
    if np.dtype(got.dtype).kind == "f":
        check_close(got, want, what, rtol=1e-5, atol=1e-5)
    else:
        check_equal(got, want, what)


# ---------------------------------------------------------------- the group

def test_group_starts_hvdlite_and_its_executor():
    """Runs first, before hvdlite is initialised: init_process_group starts
    hvdlite, and with it the device executor, from inside torch's creation of
    the default group; the executor's groups are its own."""
    check("hvdlite not started yet", not hvdlite.is_initialized())
    dist.init_process_group(backend="hvdlite")
    check("hvdlite started", hvdlite.is_initialized())
    check("default group on hvdlite", dist.get_backend() == "hvdlite", dist.get_backend())
    check("MPI's world", dist.get_world_size() == hvdlite.size()
          and dist.get_rank() == hvdlite.rank())
    check("executor", hvd_device.backend_name() == expected_executor(),
          f"({hvd_device.backend_name()!r}, want {expected_executor()!r})")
    check("the backend takes CUDA tensors",
          "cuda" in dist.Backend.backend_capability["hvdlite"])


# ---------------------------------------------------------------- allreduce

@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_reduce(group, rank, size, dtype, op):
    c10d_op, hvd_op = OPS[op]
    xs = inputs(size, (3, 5), DTYPES[dtype], salt=len(op))
    t = on_dev(xs[rank])
    with device_path():
        dist.all_reduce(t, op=c10d_op)
    same(t, reduce_ref([x.numpy() for x in xs], hvd_op, dtype, size), f"all_reduce {op}")


def test_all_reduce_work_and_future(group, rank, size):
    """Async works complete through the engine's completion callbacks for
    device jobs too: wait(), a future chained with then(), a future that
    nobody waits on, many in flight."""
    xs = inputs(size, (5,), torch.float32, salt=20)
    want = reduce_ref([x.numpy() for x in xs], hvd.Sum, "float32", size)
    with device_path():
        t = on_dev(xs[rank])
        work = dist.all_reduce(t, async_op=True)
        check("wait", work.wait() is True)
        check("completed", work.is_completed() and work.is_success())
        same(t, want, "after wait")
        t = on_dev(xs[rank])
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        same(doubled.wait(), want * 2, "then() on the future")
        check("future value is the tensor", fut.value()[0] is t)
        done = threading.Event()
        t = on_dev(xs[rank])
        fut = dist.all_reduce(t, async_op=True).get_future()
        fut.add_done_callback(lambda f: done.set())
        check("completed without wait()", done.wait(60))
        same(fut.wait()[0], want, "completed by the engine")
        ts = [on_dev(xs[rank] + i) for i in range(8)]
        works = [dist.all_reduce(x, async_op=True) for x in ts]
        for w in reversed(works):
            w.wait()
    for i, x in enumerate(ts):
        same(x, reduce_ref([(a + i).numpy() for a in xs], hvd.Sum, "float32", size),
             f"in flight {i}")


# ---------------------------------------------------------------- broadcast

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_broadcast(group, rank, size, dtype):
    xs = inputs(size, (2, 3), DTYPES[dtype], salt=40)
    for root in range(size):
        t = on_dev(xs[rank])
        with device_path():
            dist.broadcast(t, src=root)
        same(t, xs[root].numpy(), f"broadcast from {root}")


# ---------------------------------------------------------------- allgather

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_gather_into_tensor(group, rank, size, dtype):
    xs = inputs(size, (2, 3), DTYPES[dtype], salt=60)
    want = np.concatenate([x.numpy() for x in xs])
    out = torch.empty(2 * size, 3, dtype=DTYPES[dtype], device=dev())
    with device_path():
        dist.all_gather_into_tensor(out, on_dev(xs[rank]))
    same(out, want, "concatenated")
    outs = [torch.empty(2, 3, dtype=DTYPES[dtype], device=dev()) for _ in range(size)]
    with device_path():
        dist.all_gather(outs, on_dev(xs[rank]))
    for r in range(size):
        same(outs[r], xs[r].numpy(), f"all_gather from rank {r}")


# ---------------------------------------------------------------- reducescatter

@pytest.mark.parametrize("op", list(OPS))
def test_reduce_scatter_tensor(group, rank, size, op):
    c10d_op, hvd_op = OPS[op]
    xs = inputs(size, (size * 2, 3), torch.float32, salt=80 + len(op))
    out = torch.empty(2, 3, device=dev())
    with device_path():
        dist.reduce_scatter_tensor(out, on_dev(xs[rank]), op=c10d_op)
    full = reduce_ref([x.numpy() for x in xs], hvd_op, "float32", size)
    same(out, full[rank * 2:(rank + 1) * 2], f"reduce_scatter_tensor {op}")


# ---------------------------------------------------------------- alltoall

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_to_all_single(group, rank, size, dtype):
    xs = inputs(size, (size * 2, 3), DTYPES[dtype], salt=110)
    out = torch.empty(size * 2, 3, dtype=DTYPES[dtype], device=dev())
    with device_path():
        dist.all_to_all_single(out, on_dev(xs[rank]))
    same(out, np.concatenate([x.numpy()[rank * 2:(rank + 1) * 2] for x in xs]), "equal splits")

    def splits(r):     # rank r sends j + r + 1 rows to rank j
        return [j + r + 1 for j in range(size)]
    xs = [data(r, (sum(splits(r)), 2), DTYPES[dtype], salt=120) for r in range(size)]
    received = [splits(r)[rank] for r in range(size)]
    out = torch.empty(sum(received), 2, dtype=DTYPES[dtype], device=dev())
    with device_path():
        dist.all_to_all_single(out, on_dev(xs[rank]), output_split_sizes=received,
                               input_split_sizes=splits(rank))
    pieces = []
    for r in range(size):
        start = sum(splits(r)[:rank])
        pieces.append(xs[r].numpy()[start:start + splits(r)[rank]])
    same(out, np.concatenate(pieces), "uneven splits")


# ---------------------------------------------------------------- control

def test_barrier(group, rank, size):
    dist.barrier()
    work = dist.barrier(async_op=True)
    check("barrier work", work.wait() is True and work.is_completed())
    # a collective after the barriers still runs on the device path
    t = torch.ones(3, device=dev())
    with device_path():
        dist.all_reduce(t)
    same(t, np.full(3, size, dtype=np.float32), "all_reduce after barriers")


# ---------------------------------------------------------------- DDP

def batch(step, rank, rows=6):
    g = torch.Generator().manual_seed(100 * step + rank)
    return on_dev(torch.randn(rows, 8, generator=g)), on_dev(torch.randint(0, 4, (rows,), generator=g))


def test_ddp_matches_gloo(group, gloo, rank, size):
    """The same model twice, one DDP on the hvdlite default group (its
    buckets on the device path), one on gloo; rank r starts from other
    weights, which DDP's broadcast at construction must fix."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    d = dev()
    ids = [d.index] if d.type == "cuda" else None
    a = DDP(make_model(rank).to(d), device_ids=ids)
    b = DDP(make_model(rank).to(d), device_ids=ids, process_group=gloo)

    def check_params(what):
        for (name, pa), (_, pb) in zip(a.module.named_parameters(), b.module.named_parameters()):
            diff = (pa.detach() - pb.detach()).abs().max().item()
            check(f"{what}: {name} within 1e-6 of gloo", diff <= 1e-6, f"(max difference {diff:g})")

    check_params("after construction")
    loss_fn = torch.nn.CrossEntropyLoss()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (a, b)]
    for step in range(5):
        for m, opt in zip((a, b), opts):
            x, y = batch(step, rank)
            with device_path() if m is a else _nothing():
                loss_fn(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        check_params(f"step {step}")


def test_fsdp2_matches_gloo(group, gloo, rank, size):
    """fully_shard on the hvdlite default group with the model on this rank's
    device (its all-gathers and reduce-scatters on the device path) against
    the same model sharded over gloo on the CPU."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    d = dev()

    def sharded(mesh, device):
        model = make_model(0).to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    a = sharded(DeviceMesh.from_group(group, d.type), d)
    b = sharded(DeviceMesh.from_group(gloo, "cpu"), "cpu")
    if size > 1:
        check("shards", all(p.to_local().numel() < p.numel() for p in a.parameters() if p.numel() >= size))
    # CUDA's kernels sum in another order than the CPU's
    tol = 1e-6 if d.type == "cpu" else 1e-5
    loss_fn = torch.nn.CrossEntropyLoss()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (a, b)]
    for step in range(4):
        x, y = batch(step, rank)
        for m, opt in zip((a, b), opts):
            # one rank: FSDP2 has nothing to gather or scatter
            with device_path() if m is a and size > 1 else _nothing():
                if m is a:
                    loss_fn(m(x), y).backward()
                else:
                    loss_fn(m(x.cpu()), y.cpu()).backward()
            opt.step()
            opt.zero_grad()
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            diff = (pa.full_tensor().cpu() - pb.full_tensor()).abs().max().item()
            check(f"step {step}: {name} within {tol:g} of gloo", diff <= tol, f"({diff:g})")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False
