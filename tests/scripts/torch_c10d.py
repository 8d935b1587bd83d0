"""torch.distributed on the "hvdlite" backend (hvdlite/torch/c10d.py).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it at 2 ranks under mpiexec (on the
engine, and with HVDLITE_DEVICE_TRANSPORT=gloo through the device executor), so
``init_process_group(backend="hvdlite")`` gets no other argument: rank, size
and store come from MPI. Every rank rebuilds every rank's input (seeded by
rank) and checks each collective's result against a NumPy reference, per
dtype and reduce op. DDP and FSDP2 are in torch_ddp.py.
"""
import os
import threading

import numpy as np
import pytest

from harness.checks import check, check_close, check_equal, expect, require
from harness.collective_reference import reduce_ref

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402  (registers the backend)
from harness.c10d_ranks import data, group, inputs  # noqa: E402,F401  (group: a fixture)

torch.set_num_threads(1)

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32}
OPS = {"SUM": (dist.ReduceOp.SUM, hvd.Sum), "AVG": (dist.ReduceOp.AVG, hvd.Average),
       "MIN": (dist.ReduceOp.MIN, hvd.Min), "MAX": (dist.ReduceOp.MAX, hvd.Max),
       "PRODUCT": (dist.ReduceOp.PRODUCT, hvd.Product)}


def same(got, want, what):
    """``got`` (a tensor) against a NumPy reference: exact for integers."""
    got = got.numpy()
    if np.dtype(got.dtype).kind == "f":
        check_close(got, want, what, rtol=1e-6, atol=1e-6)
    else:
        check_equal(got, want, what)


# ---------------------------------------------------------------- group

def test_group_other_than_mpi_world_is_refused(rank, size):
    """Runs first, before the default group exists: a group of another size
    than MPI's world fails with the launch advice, and nothing is left half made."""
    check("no default group yet", not dist.is_initialized())
    expect(ValueError, lambda: dist.init_process_group(
        backend="hvdlite", store=dist.HashStore(), rank=0, world_size=1),
        f"MPI started {size} ranks", "hvdrun -np N", "mpiexec -n N")
    check("still no default group", not dist.is_initialized())


def test_group_is_mpi_world(group, rank, size):
    check("size", dist.get_world_size() == size == hvdlite.size())
    check("rank", dist.get_rank() == rank == hvdlite.rank())
    check("backend", dist.get_backend() == "hvdlite", dist.get_backend())
    check("env from MPI", os.environ.get("RANK") == str(rank)
          and os.environ.get("WORLD_SIZE") == str(size))
    check("store shared", isinstance(dist.distributed_c10d._get_default_store(), dist.Store))


# ---------------------------------------------------------------- allreduce

@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_reduce(group, rank, size, dtype, op):
    c10d_op, hvd_op = OPS[op]
    xs = inputs(size, (3, 5), DTYPES[dtype], salt=len(op))
    t = xs[rank].clone()
    dist.all_reduce(t, op=c10d_op)
    same(t, reduce_ref([x.numpy() for x in xs], hvd_op, dtype, size), f"all_reduce {op}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_all_reduce_premul_sum(group, rank, size, dtype):
    xs = inputs(size, (7,), DTYPES[dtype], salt=3)
    t = xs[rank].clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    same(t, reduce_ref([x.numpy() for x in xs], hvd.Sum, dtype, size, pre=0.5), "premul_sum")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_reduce_non_contiguous(group, rank, size, dtype):
    xs = inputs(size, (4, 6), DTYPES[dtype], salt=4)
    t = xs[rank].clone().t()
    check("not contiguous", not t.is_contiguous())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    want = reduce_ref([x.numpy() for x in xs], hvd.Max, dtype, size).T
    same(t, want, "all_reduce of a transposed tensor")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_reduce_coalesced(group, rank, size, dtype):
    shapes = [(3,), (2, 4), ()]
    xs = [inputs(size, s, DTYPES[dtype], salt=10 + i) for i, s in enumerate(shapes)]
    ts = [x[rank].clone() for x in xs]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
    for i, (t, x) in enumerate(zip(ts, xs)):
        same(t, reduce_ref([a.numpy() for a in x], hvd.Sum, dtype, size), f"tensor {i}")
    # the same through the coalescing manager
    ts = [x[rank].clone() for x in xs]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for i, (t, x) in enumerate(zip(ts, xs)):
        same(t, reduce_ref([a.numpy() for a in x], hvd.Sum, dtype, size), f"managed tensor {i}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_reduce_async_work_and_future(group, rank, size, dtype):
    xs = inputs(size, (5,), DTYPES[dtype], salt=20)
    want = reduce_ref([x.numpy() for x in xs], hvd.Sum, dtype, size)
    t = xs[rank].clone()
    work = dist.all_reduce(t, async_op=True)
    check("wait", work.wait() is True)
    check("completed", work.is_completed() and work.is_success())
    same(t, want, "after wait")
    # A future chained with then() completes on the engine's completion, as DDP's hooks do.
    t = xs[rank].clone()
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    same(doubled.wait(), want * 2, "then() on the future")
    check("future value is the tensor", fut.value()[0] is t)
    # Nobody waits: the engine's completion alone completes the future.
    done = threading.Event()
    seen = []
    t = xs[rank].clone()
    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.add_done_callback(lambda f: (seen.append(threading.current_thread().name), done.set()))
    check("completed without wait()", done.wait(60))
    check("callback thread", seen[0] in ("hvdlite-c10d-completion", "MainThread"), seen)
    same(t, want, "completed by the engine")
    # Many in flight at once, waited in reverse order.
    ts = [xs[rank].clone() + i for i in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(ts):
        same(x, reduce_ref([(a + i).numpy() for a in xs], hvd.Sum, dtype, size), f"in flight {i}")


def test_all_reduce_engine_names_reused(group, rank, size):
    """The backend names its collectives by call order (c10d.py, "engine
    names"): a name comes back while the collective that had it may still be
    in flight (A, B, A of async calls; a run of one shape longer than the
    names of a run), and each result is still right."""
    a = inputs(size, (5,), torch.float32, salt=160)
    b = inputs(size, (2, 3), torch.float32, salt=161)
    ts = [a[rank].clone(), b[rank].clone(), a[rank].clone() * 2]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    want_a = reduce_ref([x.numpy() for x in a], hvd.Sum, "float32", size)
    same(ts[0], want_a, "A")
    same(ts[1], reduce_ref([x.numpy() for x in b], hvd.Sum, "float32", size), "B")
    same(ts[2], want_a * 2, "A again")
    from hvdlite.torch.c10d import _RUN_LIMIT
    ts = [a[rank].clone() + i for i in range(_RUN_LIMIT + 6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        same(t, reduce_ref([(x + i).numpy() for x in a], hvd.Sum, "float32", size), f"run {i}")
    # Repeated calls reuse their names: the engine's response cache answers them.
    hits = hvdlite.engine_stats()["cache_hits"]
    for i in range(5):
        t = a[rank].clone()
        dist.all_reduce(t)
        same(t, want_a, f"repeat {i}")
    hits = hvdlite.engine_stats()["cache_hits"] - hits
    check("repeated all_reduce answered from the cache", hits >= 4, f"({hits} hits)")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reduce(group, rank, size, dtype):
    xs = inputs(size, (6,), DTYPES[dtype], salt=30)
    for root in range(size):
        t = xs[rank].clone()
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            same(t, reduce_ref([x.numpy() for x in xs], hvd.Sum, dtype, size), f"root {root}")
        else:
            check_equal(t.numpy(), xs[rank].numpy(), f"non-root {rank} keeps its tensor")


# ---------------------------------------------------------------- broadcast

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_broadcast(group, rank, size, dtype):
    xs = inputs(size, (2, 3), DTYPES[dtype], salt=40)
    for root in range(size):
        t = xs[rank].clone()
        dist.broadcast(t, src=root)
        check_equal(t.numpy(), xs[root].numpy(), f"broadcast from {root}")
        work = dist.broadcast(xs[rank].clone(), src=root, async_op=True)
        check_equal(work.get_future().wait()[0].numpy(), xs[root].numpy(), "future value")


# ---------------------------------------------------------------- allgather

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_gather(group, rank, size, dtype):
    xs = inputs(size, (2, 3), DTYPES[dtype], salt=50)
    outs = [torch.empty(2, 3, dtype=DTYPES[dtype]) for _ in range(size)]
    dist.all_gather(outs, xs[rank])
    for r in range(size):
        check_equal(outs[r].numpy(), xs[r].numpy(), f"from rank {r}")
    # all_gather_coalesced: several inputs, one output list each
    ys = inputs(size, (4,), DTYPES[dtype], salt=51)
    lists = [[torch.empty(2, 3, dtype=DTYPES[dtype]) for _ in range(size)],
             [torch.empty(4, dtype=DTYPES[dtype]) for _ in range(size)]]
    dist.all_gather_coalesced(lists, [xs[rank], ys[rank]])
    for r in range(size):
        check_equal(lists[0][r].numpy(), xs[r].numpy(), f"coalesced 0 from {r}")
        check_equal(lists[1][r].numpy(), ys[r].numpy(), f"coalesced 1 from {r}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_gather_into_tensor(group, rank, size, dtype):
    xs = inputs(size, (2, 3), DTYPES[dtype], salt=60)
    want = np.concatenate([x.numpy() for x in xs])
    out = torch.empty(2 * size, 3, dtype=DTYPES[dtype])
    dist.all_gather_into_tensor(out, xs[rank])
    check_equal(out.numpy(), want, "concatenated")
    stacked = torch.empty(size, 2, 3, dtype=DTYPES[dtype])   # torch also takes a stacked output
    dist.all_gather_into_tensor(stacked, xs[rank])
    check_equal(stacked.numpy(), want.reshape(size, 2, 3), "stacked")
    # coalesced (FSDP's way): through the coalescing manager
    ys = inputs(size, (5,), DTYPES[dtype], salt=61)
    outs = [torch.empty(2 * size, 3, dtype=DTYPES[dtype]), torch.empty(5 * size, dtype=DTYPES[dtype])]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], xs[rank])
        dist.all_gather_into_tensor(outs[1], ys[rank])
    cm.wait()
    check_equal(outs[0].numpy(), want, "coalesced 0")
    check_equal(outs[1].numpy(), np.concatenate([y.numpy() for y in ys]), "coalesced 1")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_gather_into_tensor_in_place(group, rank, size, dtype):
    """FSDP2's way: the input is this rank's slice of the output, which the
    engine gathers into directly (c10d.py passes it the output)."""
    xs = inputs(size, (4, 3), DTYPES[dtype], salt=62)
    out = torch.zeros(4 * size, 3, dtype=DTYPES[dtype])
    mine = out[rank * 4:(rank + 1) * 4]
    mine.copy_(xs[rank])
    work = dist.all_gather_into_tensor(out, mine, async_op=True)
    work.wait()
    check_equal(out.numpy(), np.concatenate([x.numpy() for x in xs]), "in place")


def test_results_written_into_the_callers_tensors(group, rank, size):
    """The adapter's allgather, reducescatter and alltoall with an output
    (what c10d.py passes for all_gather_into_tensor, reduce_scatter_tensor and
    all_to_all_single): the engine writes the result into it and hands back
    that tensor; an output of another size, dtype or layout gets a result of
    the engine's own, which c10d.py copies or refuses as before. Through the
    device executor (HVDLITE_DEVICE_TRANSPORT=gloo) the results are its own."""
    from hvdlite.torch import mpi_ops
    ps = hvd.global_process_set
    engine = os.environ.get("HVDLITE_DEVICE_TRANSPORT") != "gloo"
    x = torch.full((3,), float(rank + 1))
    ranks = np.arange(1, size + 1, dtype=np.float32)
    out = torch.empty(3 * size)
    got = hvd.synchronize(mpi_ops._allgather_async(x, "into.allgather", ps, out))
    check("allgather: the output itself", (got is out) == engine)
    check_equal(got.numpy(), np.repeat(ranks, 3), "allgather into the output")
    for label, other in (("longer", torch.empty(3 * size + 1)), ("float64", torch.empty(3 * size, dtype=torch.float64)),
                         ("strided", torch.empty(6 * size)[::2])):
        got = hvd.synchronize(mpi_ops._allgather_async(x, "into.allgather." + label, ps, other))
        check(f"allgather, {label} output: a result of the engine's", got is not other)
        check_equal(got.numpy(), np.repeat(ranks, 3), f"allgather, {label} output")
    rows = torch.arange(2 * size, dtype=torch.float32) * (rank + 1)
    out = torch.empty(2)
    got = hvd.synchronize(mpi_ops._reducescatter_async(rows, "into.reducescatter", hvd.Sum, ps, 1.0, 1.0,
                                                       hvd.Compression.none, output=out))
    check("reducescatter: the output itself", (got is out) == engine)
    check_equal(got.numpy(), np.arange(2 * size, dtype=np.float32)[2 * rank:2 * rank + 2] * ranks.sum(),
                "reducescatter into the output")
    sent = torch.arange(size, dtype=torch.float32) + 10 * rank
    out = torch.empty(size)
    got, received = hvd.synchronize(mpi_ops._alltoall_async(sent, None, "into.alltoall", ps, out))
    check("alltoall: the output itself", (got is out) == engine)
    check_equal(got.numpy(), np.arange(size, dtype=np.float32) * 10 + rank, "alltoall into the output")
    check_equal(received.numpy(), np.ones(size, dtype=np.int32), "alltoall's received splits")
    # The C API's checks of output_bytes
    from hvdlite import _binding, collectives
    req = collectives.allgather_request(_binding.DTYPE_CODES["float32"], (3,), "into.bad", ps)
    for output_bytes, words in ((-4, "negative"), (12, "without an output")):
        expect(ValueError, lambda: _binding.enqueue(input_ptr=x.data_ptr(), output_bytes=output_bytes, **req),
               words)
    req = collectives.broadcast_request(_binding.DTYPE_CODES["float32"], (3,), "into.bad", 0, ps, "test")
    expect(ValueError, lambda: _binding.enqueue(input_ptr=x.data_ptr(), output_ptr=x.data_ptr(), output_bytes=12,
                                                **req), "for allgather, reducescatter and alltoall")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gather(group, rank, size, dtype):
    xs = inputs(size, (3,), DTYPES[dtype], salt=70)
    for root in range(size):
        outs = [torch.zeros(3, dtype=DTYPES[dtype]) for _ in range(size)] if rank == root else None
        dist.gather(xs[rank], outs, dst=root)
        if rank == root:
            for r in range(size):
                check_equal(outs[r].numpy(), xs[r].numpy(), f"root {root} from {r}")


# ---------------------------------------------------------------- reducescatter

@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reduce_scatter_tensor(group, rank, size, dtype, op):
    c10d_op, hvd_op = OPS[op]
    xs = inputs(size, (size * 2, 3), DTYPES[dtype], salt=80 + len(op))
    out = torch.empty(2, 3, dtype=DTYPES[dtype])
    dist.reduce_scatter_tensor(out, xs[rank], op=c10d_op)
    full = reduce_ref([x.numpy() for x in xs], hvd_op, dtype, size)
    same(out, full[rank * 2:(rank + 1) * 2], f"reduce_scatter_tensor {op}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reduce_scatter_coalesced_and_list(group, rank, size, dtype):
    xs = inputs(size, (size * 4,), DTYPES[dtype], salt=90)
    ys = inputs(size, (size, 2, 2), DTYPES[dtype], salt=91)
    outs = [torch.empty(4, dtype=DTYPES[dtype]), torch.empty(2, 2, dtype=DTYPES[dtype])]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(outs[0], xs[rank])
        dist.reduce_scatter_tensor(outs[1], ys[rank])
    cm.wait()
    same(outs[0], reduce_ref([x.numpy() for x in xs], hvd.Sum, dtype, size)[rank * 4:(rank + 1) * 4],
         "coalesced 0")
    same(outs[1], reduce_ref([y.numpy() for y in ys], hvd.Sum, dtype, size)[rank], "coalesced 1")
    # reduce_scatter: a list of one input per rank
    out = torch.empty(3, dtype=DTYPES[dtype])
    parts = [data(rank, (3,), DTYPES[dtype], salt=100 + j) for j in range(size)]
    dist.reduce_scatter(out, parts, op=dist.ReduceOp.MAX)
    want = reduce_ref([data(r, (3,), DTYPES[dtype], salt=100 + rank).numpy() for r in range(size)],
                      hvd.Max, dtype, size)
    same(out, want, "reduce_scatter list")


# ---------------------------------------------------------------- alltoall

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_to_all_single(group, rank, size, dtype):
    xs = inputs(size, (size * 2, 3), DTYPES[dtype], salt=110)
    out = torch.empty(size * 2, 3, dtype=DTYPES[dtype])
    dist.all_to_all_single(out, xs[rank])
    want = np.concatenate([x.numpy()[rank * 2:(rank + 1) * 2] for x in xs])
    check_equal(out.numpy(), want, "equal splits")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_to_all_single_splits(group, rank, size, dtype):
    # rank r sends j + r + 1 rows to rank j
    def splits(r):
        return [j + r + 1 for j in range(size)]
    xs = [data(r, (sum(splits(r)), 2), DTYPES[dtype], salt=120) for r in range(size)]
    received = [splits(r)[rank] for r in range(size)]
    out = torch.empty(sum(received), 2, dtype=DTYPES[dtype])
    dist.all_to_all_single(out, xs[rank], output_split_sizes=received,
                           input_split_sizes=splits(rank))
    pieces = []
    for r in range(size):
        start = sum(splits(r)[:rank])
        pieces.append(xs[r].numpy()[start:start + splits(r)[rank]])
    check_equal(out.numpy(), np.concatenate(pieces), "uneven splits")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_to_all_list_and_scatter(group, rank, size, dtype):
    sent = [[data(r, (j + 1, 2), DTYPES[dtype], salt=130) for j in range(size)] for r in range(size)]
    outs = [torch.empty(rank + 1, 2, dtype=DTYPES[dtype]) for _ in range(size)]
    dist.all_to_all(outs, sent[rank])
    for r in range(size):
        check_equal(outs[r].numpy(), sent[r][rank].numpy(), f"all_to_all from {r}")
    for root in range(size):
        pieces = [data(root, (3,), DTYPES[dtype], salt=140 + j) for j in range(size)]
        out = torch.empty(3, dtype=DTYPES[dtype])
        dist.scatter(out, pieces if rank == root else None, src=root)
        check_equal(out.numpy(), pieces[rank].numpy(), f"scatter from {root}")


# ---------------------------------------------------------------- control and errors

def test_barrier(group, rank, size):
    dist.barrier()
    work = dist.barrier(async_op=True)
    check("barrier work", work.wait() is True and work.is_completed())


def test_errors(group, rank, size):
    t = torch.ones(2, dtype=torch.int32)
    for op in ("BAND", "BOR", "BXOR"):
        expect(ValueError, lambda: dist.all_reduce(t, op=getattr(dist.ReduceOp, op)), "SUM, AVG",
               op, "no bitwise reductions", "gloo")
    out = torch.empty(3)
    expect(ValueError, lambda: dist.reduce_scatter_tensor(out, torch.ones(5)), "input must hold")
    longer = torch.empty(2 * size + 1)
    expect(ValueError, lambda: dist.all_gather_into_tensor(longer, torch.ones(2)), "output holds",
           f"{2 * size + 1} elements", f"sent {2 * size}")
    # A root outside the group fails on every rank at once (not only on the ranks
    # that would wait for it).
    t = torch.ones(2)
    for call, arg in ((lambda: dist.broadcast(t, src=size), "src"),
                      (lambda: dist.reduce(t, dst=size + 3), "dst"),
                      (lambda: dist.reduce(t, dst=-1), "dst"),
                      (lambda: dist.gather(t, None, dst=size), "dst"),
                      (lambda: dist.scatter(t, None, src=size), "src")):
        expect(ValueError, call, f"{arg} (the root rank) is", f"not one of this group's {size} ranks")
    # a collective after the errors still works
    t = torch.ones(3)
    dist.all_reduce(t)
    check_equal(t.numpy(), np.full(3, size, dtype=np.float32), "all_reduce after errors")


def test_subgroup_without_process_set(group, rank, size):
    """The members add the group's process set among themselves (more in
    torch_subgroups.py)."""
    members = [0]
    sub = dist.new_group(members)
    if rank in members:
        check("group size", sub.size() == 1 and sub.rank() == 0)
        xs = inputs(size, (4,), torch.float32, salt=155)
        t = xs[rank].clone()
        dist.all_reduce(t, group=sub)
        same(t, xs[rank].numpy(), "a group of one rank")
    else:
        check("non-member", sub == dist.GroupMember.NON_GROUP_MEMBER)
    dist.barrier()


def test_subgroup_on_process_set(group, rank, size):
    members = list(range(1, size))
    ps = hvdlite.add_process_set(members)
    try:
        sub = dist.new_group(members)
        if rank in members:
            check("group size", sub.size() == len(members) and
                  sub.rank() == members.index(rank))
            xs = inputs(size, (4,), torch.float32, salt=150)
            t = xs[rank].clone()
            dist.all_reduce(t, group=sub)
            same(t, reduce_ref([xs[r].numpy() for r in members], hvd.Sum, "float32",
                               len(members)), "subgroup sum")
            t = xs[rank].clone()
            dist.broadcast(t, src=members[-1], group=sub)   # src: a global rank
            check_equal(t.numpy(), xs[members[-1]].numpy(), "subgroup broadcast")
        else:
            check("non-member", sub == dist.GroupMember.NON_GROUP_MEMBER)
        dist.barrier()
    finally:
        hvdlite.remove_process_set(ps)


def test_group_again_after_engine_restart(group, rank, size):
    """destroy_process_group, hvdlite.shutdown() and init again in one
    process: the new default group runs on the new engine (its names start
    again: a DDP step's bucket, from the third step on, is answered from the
    new engine's cache), its messages on a new communicator, DDP on top of it."""
    dist.destroy_process_group()
    hvdlite.shutdown()
    hvdlite.init()
    dist.init_process_group(backend="hvdlite")
    xs = inputs(size, (5,), torch.float32, salt=170)
    ys = inputs(size, (2,), torch.float64, salt=171)
    for i in range(2):
        for zs, dtype in ((xs, "float32"), (ys, "float64")):
            t = zs[rank].clone()
            dist.all_reduce(t)
            same(t, reduce_ref([z.numpy() for z in zs], hvd.Sum, dtype, size),
                 f"all_reduce {i} on the new engine")
    got = torch.zeros(5)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[rank], (rank + 1) % size),
                                     dist.P2POp(dist.irecv, got, (rank - 1) % size)]):
        w.wait()
    check_equal(got.numpy(), xs[(rank - 1) % size].numpy(), "ring on the new group")
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(5, 2))
    hits = 0
    for step in range(6):
        before = hvdlite.engine_stats()["cache_hits"]
        model.zero_grad()
        model(xs[rank].reshape(1, 5)).sum().backward()
        hits += hvdlite.engine_stats()["cache_hits"] - before if step >= 2 else 0
        grads = [p.grad.clone() for p in model.parameters()]
        everyone = [torch.empty_like(grads[0]) for _ in range(size)]
        dist.all_gather(everyone, grads[0])
        check(f"step {step}: DDP's gradients equal on every rank",
              all(torch.equal(g, everyone[0]) for g in everyone))
    check("DDP's bucket answered from the new engine's cache", hits >= 4, f"({hits} hits)")
