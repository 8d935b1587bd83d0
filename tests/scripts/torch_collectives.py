"""hvdlite.torch collectives against references computed locally.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 and 3 ranks. Every rank can rebuild every other rank's input
(seeded by rank), so each result is checked against what it must be.
"""
from harness.checks import check, expect, require

torch = require("torch")

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)


def data(r, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    unsigned = dtype in (torch.uint8, torch.uint16)
    return torch.randint(0 if unsigned else -20, 20, shape, generator=g).to(dtype)


def test_basics(rank, size):
    check("size", hvd.size() == size and hvd.rank() == rank)
    check("local", hvd.local_size() == size and hvd.local_rank() == rank)
    check("cross", hvd.cross_size() == 1 and hvd.cross_rank() == 0)
    check("initialized", hvd.is_initialized())
    # The engine thread needs MPI_THREAD_MULTIPLE (init() refuses less).
    check("mpi_threads", hvd.mpi_threads_supported() is True)
    check("build queries", hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_built()
          and not hvd.gloo_enabled() and not hvd.nccl_built() and not hvd.cuda_built()
          and not hvd.rocm_built() and not hvd.ddl_built() and not hvd.ccl_built())
    for name in ["Average", "Sum", "Min", "Max", "Product", "Adasum"]:
        check(f"op {name}", isinstance(getattr(hvd, name), int))


def test_engine_priority_from_torch_threads(rank, size):
    # The adapter reports torch's threads at init; the default priority (auto)
    # makes the engine idle exactly where ranks x threads fill the usable cores.
    import os
    hvd.allreduce(torch.zeros(1), name="prio.round")  # a round after the report
    full = size * torch.get_num_threads() >= len(os.sched_getaffinity(0))
    check("auto priority", hvdlite.engine_stats()["engine_idle_priority"] == int(full),
          f"{size} ranks x {torch.get_num_threads()} threads, "
          f"{len(os.sched_getaffinity(0))} cores: {hvdlite.engine_stats()}")


def test_allreduce_dtypes_and_ops(rank, size):
    ops = {
        hvd.Sum: lambda xs: torch.stack(xs).sum(0),
        hvd.Average: lambda xs: torch.stack(xs).sum(0) / size,
        hvd.Min: lambda xs: torch.stack(xs).min(0).values,
        hvd.Max: lambda xs: torch.stack(xs).max(0).values,
        hvd.Product: lambda xs: torch.stack(xs).prod(0),
    }
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64, torch.uint8, torch.int8, torch.int16, torch.uint16]
    for dtype in dtypes:
        for op, ref in ops.items():
            if op == hvd.Average and not dtype.is_floating_point:
                continue
            if op == hvd.Product and dtype in (torch.uint8, torch.int8, torch.int16, torch.uint16):
                continue
            shape = (3, 5)
            xs = [data(r, shape, dtype, salt=op) for r in range(size)]
            want = ref([x.double() for x in xs])
            got = hvd.allreduce(xs[rank], op=op, name=f"ar.{dtype}.{op}")
            tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)
            check(f"allreduce {dtype} op{op} dtype", got.dtype == dtype and got.shape == shape)
            check(f"allreduce {dtype} op{op}", torch.allclose(got.double(), want, rtol=tol, atol=tol),
                  f"{got} vs {want}")
            check("input untouched", torch.equal(xs[rank], data(rank, shape, dtype, salt=op)))


def test_allreduce_average_scaling_0d_empty(rank, size):
    x = data(rank, (4, 4))
    total = sum(data(r, (4, 4)).double() for r in range(size))
    check("average default", torch.allclose(hvd.allreduce(x).double(), total / size, atol=1e-6))
    check("average=False is Sum", torch.allclose(hvd.allreduce(x, average=False).double(), total, atol=1e-5))
    check("average=True", torch.allclose(hvd.allreduce(x, True).double(), total / size, atol=1e-6))
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    check("pre/postscale", torch.allclose(got.double(), total, atol=1e-5))
    got = hvd.allreduce(x, op=hvd.Average, postscale_factor=size)
    check("average postscale", torch.allclose(got.double(), total, atol=1e-5))
    scalar = hvd.allreduce(torch.tensor(float(rank + 1)), op=hvd.Sum)
    check("0-dim allreduce", scalar.shape == () and scalar.item() == size * (size + 1) / 2)
    empty = hvd.allreduce(torch.empty(0, 3))
    check("empty allreduce", empty.shape == (0, 3))


def test_allreduce_in_place_and_async(rank, size):
    x = data(rank, (4, 4))
    total = sum(data(r, (4, 4)).double() for r in range(size))
    # in place, contiguous and not
    y = data(rank, (4, 6))
    ptr = y.data_ptr()
    out = hvd.allreduce_(y, op=hvd.Sum)
    ref = sum(data(r, (4, 6)).double() for r in range(size))
    check("allreduce_ returns tensor", out is y and y.data_ptr() == ptr)
    check("allreduce_ value", torch.allclose(y.double(), ref, atol=1e-5))
    base = data(rank, (6, 4))
    view = base.t()
    assert not view.is_contiguous()
    hvd.allreduce_(view, op=hvd.Sum)
    ref = sum(data(r, (6, 4)).double() for r in range(size))
    check("allreduce_ non-contiguous writes back", torch.allclose(base.double(), ref, atol=1e-5))
    sl = data(rank, (8,))[::2]
    got = hvd.allreduce(sl, op=hvd.Sum)
    check("allreduce non-contiguous input", torch.allclose(
        got.double(), sum(data(r, (8,))[::2].double() for r in range(size)), atol=1e-5))

    h = hvd.allreduce_async(x, op=hvd.Sum, name="async.one")
    res = hvd.synchronize(h)
    check("allreduce_async", torch.allclose(res.double(), total, atol=1e-5))
    check("poll after sync", hvd.poll(h) is True)
    z = x.clone()
    h = hvd.allreduce_async_(z, op=hvd.Max)
    while not hvd.poll(h):
        pass
    res = hvd.synchronize(h)
    check("allreduce_async_", res is z and torch.equal(
        z, torch.stack([data(r, (4, 4)) for r in range(size)]).max(0).values))


def test_grouped_allreduce(rank, size):
    # grouped
    ts = [data(rank, (i + 1, 3), salt=i) for i in range(4)]
    refs = [sum(data(r, (i + 1, 3), salt=i).double() for r in range(size)) for i in range(4)]
    got = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grp")
    check("grouped_allreduce", all(torch.allclose(g.double(), e, atol=1e-5) for g, e in zip(got, refs)))
    got = hvd.grouped_allreduce(ts)
    check("grouped_allreduce avg", all(torch.allclose(g.double(), e / size, atol=1e-5)
                                       for g, e in zip(got, refs)))
    h = hvd.grouped_allreduce_async(ts, op=hvd.Sum)
    check("grouped_allreduce_async", all(torch.allclose(g.double(), e, atol=1e-5)
                                         for g, e in zip(hvd.synchronize(h), refs)))
    cl = [t.clone() for t in ts]
    out = hvd.grouped_allreduce_(cl, op=hvd.Sum)
    check("grouped_allreduce_", all(o is c for o, c in zip(out, cl)) and all(
        torch.allclose(c.double(), e, atol=1e-5) for c, e in zip(cl, refs)))
    cl = [t.clone() for t in ts]
    h = hvd.grouped_allreduce_async_(cl, op=hvd.Sum)
    hvd.synchronize(h)
    check("grouped_allreduce_async_", all(torch.allclose(c.double(), e, atol=1e-5)
                                          for c, e in zip(cl, refs)))
    check("grouped empty", hvd.grouped_allreduce([]) == [])


def test_allreduce_compression(rank, size):
    # compression runs in the engine
    big = [data(r, (300,), salt=21) for r in range(size)]
    ref = sum(b.double() for b in big)
    got = hvd.allreduce(big[rank], op=hvd.Sum, compression=hvd.Compression.fp16, name="c.fp16")
    check("allreduce fp16 compression", got.dtype == torch.float32 and
          torch.allclose(got.double(), ref, atol=5e-3 * size), f"{(got.double() - ref).abs().max()}")
    got = hvd.allreduce(big[rank], op=hvd.Sum, compression=hvd.Compression.topk(1.0), name="c.topk1")
    check("allreduce topk(1.0) is exact", torch.allclose(got.double(), ref, atol=1e-5))
    got = hvd.allreduce(big[rank], op=hvd.Sum, compression=hvd.Compression.topk(0.1, error_feedback=False),
                        name="c.topk.small")
    check("allreduce topk(0.1) sends a tensor under 1024 entries whole",
          torch.allclose(got.double(), ref, atol=1e-5))
    large = [data(r, (3000,), salt=22) for r in range(size)]
    got = hvd.allreduce(large[rank], op=hvd.Sum, compression=hvd.Compression.topk(0.1, error_feedback=False),
                        name="c.topk")
    check("allreduce topk(0.1) is sparse", 0 < int((got != 0).sum()) <= 300 * size)


def test_compressor_interface_and_user_compressor(rank, size):
    big = [data(r, (300,), salt=21) for r in range(size)]
    ref = sum(b.double() for b in big)
    # Horovod's compressor interface on tensors, and a user's compressor
    for dtype in (torch.float32, torch.float64):
        t = torch.ones(5, dtype=dtype)
        c, ctx = hvd.Compression.fp16.compress(t)
        check(f"fp16.compress {dtype}", c.dtype == torch.float16)
        check(f"fp16.decompress {dtype}", hvd.Compression.fp16.decompress(c, ctx).dtype == dtype)
        got = hvd.allreduce(t, op=hvd.Sum, compression=hvd.Compression.fp16, name=f"c.fp16.{dtype}")
        check(f"allreduce fp16 compression of {dtype}", got.dtype == dtype and torch.equal(got, t * size))
    for dtype in (torch.int32, torch.uint8):
        c, ctx = hvd.Compression.fp16.compress(torch.ones(3, dtype=dtype))
        check(f"fp16.compress leaves {dtype}", c.dtype == dtype and ctx is None)


    class Offset(hvd.Compressor):
        @staticmethod
        def compress(tensor):
            return tensor + 100.0, "offset"

        @staticmethod
        def decompress(tensor, ctx):
            assert ctx == "offset"
            return tensor - 100.0 * size


    got = hvd.allreduce(big[rank], op=hvd.Sum, compression=Offset, name="c.user")
    check("allreduce with a user compressor", torch.allclose(got.double(), ref, atol=1e-3))
    inplace = big[rank].clone()
    hvd.allreduce_(inplace, op=hvd.Sum, compression=Offset, name="c.user_")
    check("allreduce_ with a user compressor writes in place", torch.allclose(inplace.double(), ref, atol=1e-3))
    got = hvd.grouped_allreduce([big[rank]], op=hvd.Sum, compression=hvd.Compression.fp16)
    check("grouped_allreduce fp16", torch.allclose(got[0].double(), ref, atol=5e-3 * size))
    got = hvd.reducescatter(torch.stack([big[rank]] * size), op=hvd.Sum, compression=hvd.Compression.fp16)
    check("reducescatter fp16", torch.allclose(got[0].double(), ref, atol=5e-3 * size))


def test_sparse_allreduce(rank, size):
    def sparse_data(r, rows, salt):
        g = torch.Generator().manual_seed(100 * r + salt)
        t = torch.randn(rows, 4, generator=g, dtype=torch.float64)
        t[torch.rand(rows, generator=g) < 0.6] = 0
        return t


    for op, salt in ((hvd.Average, 1), (hvd.Sum, 2)):
        dense = [sparse_data(r, 9, salt) for r in range(size)]
        want = sum(dense) / (size if op == hvd.Average else 1)
        h = hvd.sparse_allreduce_async(dense[rank].to_sparse(), name=f"sp.{salt}", op=op)
        got = h()  # Horovod returns a callable
        check(f"sparse_allreduce_async op={op}", got.is_sparse and got.shape == (9, 4)
              and torch.allclose(got.to_dense(), want))
        h = hvd.sparse_allreduce_async(dense[rank].to_sparse(), name=f"sp.sync.{salt}", op=op)
        check(f"sparse_allreduce_async with synchronize op={op}",
              torch.allclose(hvd.synchronize(h).to_dense(), want))


def test_allgather(rank, size):
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.int16,
                  torch.uint16, torch.bool]:
        rows = [r + 1 for r in range(size)]
        xs = [data(r, (rows[r], 2, 3), dtype) for r in range(size)]
        got = hvd.allgather(xs[rank])
        check(f"allgather {dtype}", got.dtype == dtype and torch.equal(got, torch.cat(xs)))
    got = hvd.allgather(torch.tensor(rank))
    check("allgather 0-dim", torch.equal(got, torch.arange(size)))
    h = hvd.allgather_async(data(rank, (2, 2)))
    check("allgather_async", torch.equal(hvd.synchronize(h), torch.cat([data(r, (2, 2)) for r in range(size)])))
    got = hvd.grouped_allgather([data(rank, (rank + 1,)), data(rank, (1, 2), torch.int32)])
    check("grouped_allgather", torch.equal(got[0], torch.cat([data(r, (r + 1,)) for r in range(size)]))
          and torch.equal(got[1], torch.cat([data(r, (1, 2), torch.int32) for r in range(size)])))
    h = hvd.grouped_allgather_async([torch.full((2,), rank)], name="gag")
    check("grouped_allgather_async", torch.equal(hvd.synchronize(h)[0],
                                                 torch.arange(size).repeat_interleave(2)))
    nc = data(rank, (3, 4)).t()
    check("allgather non-contiguous", torch.equal(hvd.allgather(nc),
                                                   torch.cat([data(r, (3, 4)).t() for r in range(size)])))
    big = hvd.allgather(torch.ones(1000, dtype=torch.float64) * rank)
    del_ref = big.clone()
    import gc  # noqa: E402
    gc.collect()
    check("allgather result owns memory", torch.equal(big, del_ref) and big.sum() == 1000 * sum(range(size)))


def test_broadcast(rank, size):
    for root in range(size):
        for dtype in [torch.float32, torch.bfloat16, torch.int32, torch.int16, torch.uint16, torch.bool]:
            t = data(rank, (3, 2), dtype)
            got = hvd.broadcast(t, root)
            check(f"broadcast {root} {dtype}", torch.equal(got, data(root, (3, 2), dtype)))
            check("broadcast leaves input", torch.equal(t, data(rank, (3, 2), dtype)))
    t = data(rank, (5,))
    out = hvd.broadcast_(t, size - 1)
    check("broadcast_", out is t and torch.equal(t, data(size - 1, (5,))))
    t = data(rank, (4, 3))
    v = t.t()
    hvd.broadcast_(v, 0)
    check("broadcast_ non-contiguous", torch.equal(t, data(0, (4, 3))))
    h = hvd.broadcast_async(data(rank, (2,)), 1)
    check("broadcast_async", torch.equal(hvd.synchronize(h), data(1, (2,))))
    t = data(rank, (2,))
    h = hvd.broadcast_async_(t, 1, name="bca_")
    hvd.synchronize(h)
    check("broadcast_async_", torch.equal(t, data(1, (2,))))


def test_alltoall(rank, size):
    x = torch.arange(size * 2, dtype=torch.float32).reshape(size * 2, 1) + 100 * rank
    got = hvd.alltoall(x)
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32).reshape(2, 1) + 100 * r
                        for r in range(size)])
    check("alltoall equal splits", isinstance(got, torch.Tensor) and torch.equal(got, want))
    splits = [(rank + d) % 3 for d in range(size)]   # rows this rank sends to rank d
    x = torch.full((sum(splits), 2), float(rank))
    got, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    exp_recv = [(r + rank) % 3 for r in range(size)]
    check("alltoall splits received", received.dtype == torch.int32 and received.tolist() == exp_recv)
    check("alltoall splits data", torch.equal(got, torch.cat([torch.full((exp_recv[r], 2), float(r))
                                                             for r in range(size)])))
    got2, received2 = hvd.synchronize(hvd.alltoall_async(x, splits=splits))
    check("alltoall_async", torch.equal(got2, got) and torch.equal(received2, received))


def test_reducescatter(rank, size):
    rows = 2 * size + 1
    xs = [data(r, (rows, 3), salt=7) for r in range(size)]
    full = sum(x.double() for x in xs)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    got = hvd.reducescatter(xs[rank], op=hvd.Sum)
    check("reducescatter sum", torch.allclose(got.double(), full[start:start + counts[rank]], atol=1e-5))
    got = hvd.reducescatter(xs[rank])
    check("reducescatter average", torch.allclose(got.double(), full[start:start + counts[rank]] / size,
                                                  atol=1e-5))
    got = hvd.reducescatter(xs[rank], op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
    check("reducescatter scale", torch.allclose(got.double(), 1.5 * full[start:start + counts[rank]],
                                                atol=1e-5))
    got = hvd.synchronize(hvd.reducescatter_async(xs[rank], op=hvd.Sum))
    check("reducescatter_async", torch.allclose(got.double(), full[start:start + counts[rank]], atol=1e-5))
    got = hvd.grouped_reducescatter([xs[rank], xs[rank].to(torch.float64)], op=hvd.Sum)
    check("grouped_reducescatter", len(got) == 2 and got[1].dtype == torch.float64 and
          torch.allclose(got[1], full[start:start + counts[rank]]))
    got = hvd.synchronize(hvd.grouped_reducescatter_async([xs[rank]], op=hvd.Max))
    check("grouped_reducescatter_async", torch.equal(
        got[0], torch.stack(xs).max(0).values[start:start + counts[rank]]))


def test_autograd(rank, size):
    w = [data(r, (3, 2), salt=99) for r in range(size)]
    x = data(rank, (3, 2)).requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum) * w[rank]).sum().backward()
    check("allreduce grad", torch.allclose(x.grad, sum(w)))
    x = data(rank, (3, 2)).requires_grad_()
    (hvd.allreduce(x) * w[rank]).sum().backward()
    check("allreduce average grad", torch.allclose(x.grad, sum(w) / size))
    xs = [data(r, (3, 2)).requires_grad_() for r in range(2)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    sum((o * w[rank]).sum() for o in outs).backward()
    check("grouped_allreduce grad", all(torch.allclose(t.grad, sum(w)) for t in xs))
    x = data(rank, (rank + 1, 2)).requires_grad_()
    gw = [data(r, (size * (size + 1) // 2, 2), salt=5) for r in range(size)]
    (hvd.allgather(x) * gw[rank]).sum().backward()
    off = rank * (rank + 1) // 2
    check("allgather grad (average, as Horovod)", torch.allclose(
        x.grad, (sum(gw) / size)[off:off + rank + 1], atol=1e-6))
    xs = [data(rank, (rank + 1, 2), salt=s).requires_grad_() for s in range(2)]
    outs = hvd.grouped_allgather(xs)
    sum((o * gw[rank]).sum() for o in outs).backward()
    check("grouped_allgather grad", all(torch.allclose(t.grad, (sum(gw) / size)[off:off + rank + 1],
                                                       atol=1e-6) for t in xs))
    x = data(rank, (3, 2)).requires_grad_()
    (hvd.broadcast(x, 1) * w[rank]).sum().backward()
    check("broadcast grad", torch.allclose(x.grad, sum(w) / size if rank == 1 else torch.zeros(3, 2)))
    x = (torch.arange(2 * size, dtype=torch.float32) + 10 * rank).requires_grad_()
    y = hvd.alltoall(x)
    (y * (rank + 1)).sum().backward()
    check("alltoall grad", torch.equal(x.grad, torch.arange(size).repeat_interleave(2).float() + 1))
    x = data(rank, (2 * size, 2)).requires_grad_()
    y = hvd.reducescatter(x, op=hvd.Sum)
    (y * (rank + 1)).sum().backward()
    # Horovod's rule: the gathered gradient times the set size for Sum, and not
    # divided by the set size for Average.
    check("reducescatter grad", torch.equal(x.grad, (torch.arange(size).repeat_interleave(2).float() + 1)
                                            .reshape(-1, 1).expand(-1, 2) * size))
    x = data(rank, (2 * size, 2)).requires_grad_()
    (hvd.grouped_reducescatter([x])[0] * (rank + 1)).sum().backward()
    check("grouped_reducescatter grad (average)", torch.allclose(
        x.grad, (torch.arange(size).repeat_interleave(2).float() + 1).reshape(-1, 1).expand(-1, 2)))
    x = data(rank, (2 * size, 2)).requires_grad_()
    (hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25) * (rank + 1)).sum().backward()
    check("reducescatter grad with factors", torch.allclose(
        x.grad, (torch.arange(size).repeat_interleave(2).float() + 1).reshape(-1, 1).expand(-1, 2) * size * 0.5))


def test_process_sets(rank, size):
    if size >= 3:
        even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
        odd = hvd.add_process_set(hvd.ProcessSet([r for r in range(size) if r % 2 == 1]))
        mine = even if rank % 2 == 0 else odd
        members = mine.ranks
        got = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=mine)
        check("ps allreduce", got.item() == sum(members))
        got = hvd.allgather(torch.tensor([rank]), process_set=mine)
        check("ps allgather", got.tolist() == members)
        root = members[-1]
        got = hvd.broadcast(torch.tensor([rank]), root_rank=root, process_set=mine)
        check("ps broadcast global root", got.item() == root)
        obj = hvd.broadcast_object({"from": rank}, root_rank=root, process_set=mine)
        check("ps broadcast_object", obj == {"from": root})
        check("ps allgather_object", hvd.allgather_object(rank, process_set=mine) == members)
        other = odd if mine is even else even
        expect(hvdlite.InvalidArgumentError,
               lambda: hvd.broadcast(torch.tensor([rank]), root_rank=other.ranks[0], process_set=mine),
               "not a member")
        hvd.barrier(process_set=mine)
        hvd.remove_process_set(odd)
        hvd.remove_process_set(even)
    else:
        solo = hvd.add_process_set([0])
        if rank == 0:
            got = hvd.allreduce(torch.tensor([5.0]), op=hvd.Sum, process_set=solo)
            check("ps single allreduce", got.item() == 5.0)
        else:
            expect(hvdlite.InvalidArgumentError,
                   lambda: hvd.allreduce(torch.tensor([5.0]), process_set=solo), "not a member")
        hvd.barrier()
        hvd.remove_process_set(solo)
    check("global set", hvd.global_process_set.size() == size)


def test_broadcast_object_and_parameters(rank, size):
    obj = {"rank": rank, "data": [1, 2, {"x": torch.arange(3) * rank}]} if rank == 0 else None
    got = hvd.broadcast_object(obj, root_rank=0)
    check("broadcast_object", got["rank"] == 0 and torch.equal(got["data"][2]["x"], torch.zeros(3,
                                                                                               dtype=torch.int64)))
    got = hvd.broadcast_object(lambda v: v + rank, root_rank=size - 1, name="lam")
    check("broadcast_object lambda", got(1) == size)
    got = hvd.allgather_object({"r": rank, "pad": "x" * (rank * 100)})
    check("allgather_object", [g["r"] for g in got] == list(range(size)) and len(got[-1]["pad"]) == 100 * (size - 1))

    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    torch.manual_seed(0)
    ref_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                    torch.nn.Linear(3, 2))
    model[1].running_mean.fill_(float(rank))
    ref_model[1].running_mean.fill_(0.0)
    model[1].num_batches_tracked.fill_(rank + 5)
    ref_model[1].num_batches_tracked.fill_(5)
    if rank == 0:
        model.load_state_dict(ref_model.state_dict())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    check("broadcast_parameters state_dict", all(torch.equal(a, b) for a, b in zip(
        model.state_dict().values(), ref_model.state_dict().values())))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    check("broadcast_parameters named_parameters", all(torch.equal(a, b) for a, b in zip(
        model.parameters(), ref_model.parameters())))
    ps = [torch.full((2,), float(rank)), torch.full((3,), float(rank))]
    hvd.broadcast_parameters(ps, root_rank=1)
    check("broadcast_parameters list", all(torch.equal(p, torch.ones_like(p)) for p in ps))
    check("param still leaf", all(p.is_leaf and p.requires_grad for p in model.parameters()))


def test_broadcast_optimizer_state(rank, size):
    # optimizer state: root has stepped (Adam: moments + step), others are new
    params = [torch.nn.Parameter(torch.ones(3) * (rank + 1)), torch.nn.Parameter(torch.ones(2, 2))]
    opt = torch.optim.Adam(params, lr=0.1 * (rank + 1), betas=(0.8, 0.9 + 0.01 * rank))
    if rank == 0:
        for _ in range(3):
            opt.zero_grad()
            (params[0].sum() * 2 + (params[1] ** 2).sum()).backward()
            opt.step()
    hvd.broadcast_parameters([p for p in params], root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    ref = hvd.broadcast_object(sd if rank == 0 else None, root_rank=0)
    check("optimizer lr/betas", opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["betas"] == (0.8, 0.9))
    check("optimizer state", set(sd["state"]) == {0, 1} and all(
        torch.equal(sd["state"][i][k], ref["state"][i][k]) for i in (0, 1) for k in ("exp_avg", "exp_avg_sq", "step")))
    check("optimizer step type", float(sd["state"][0]["step"]) == 3.0)
    # fresh everywhere: no state is created, options still synchronised
    opt2 = torch.optim.SGD(params, lr=0.5 + rank, momentum=0.9)
    hvd.broadcast_optimizer_state(opt2, root_rank=1)
    check("sgd fresh", len(opt2.state) == 0 and opt2.param_groups[0]["lr"] == 1.5)
    before = [p.detach().clone() for p in params]
    check("no dummy step", all(torch.equal(a, b) for a, b in zip(before, params)))
    # non-tensor scalar state (custom optimizer)


    class Counting(torch.optim.SGD):
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                self.state[p]["count"] = self.state[p].get("count", 0) + 1
                self.state[p]["tag"] = f"r{rank}"
            return super().step(closure)


    opt3 = Counting(params, lr=0.01)
    for _ in range(rank + 1):
        opt3.step()
    hvd.broadcast_optimizer_state(opt3, root_rank=size - 1)
    check("scalar state", all(opt3.state[p]["count"] == size and opt3.state[p]["tag"] == f"r{size - 1}"
                              for p in params))


def test_sync_batch_norm(rank, size):
    for shape in [(4, 3), (3, 3, 5), (2, 3, 4, 4)]:
        rows_each = [shape[0] + r for r in range(size)]      # uneven local batches
        xs = [data(r, (rows_each[r],) + shape[1:], salt=3) * 2 + 1 for r in range(size)]
        gs = [data(r, (rows_each[r],) + shape[1:], salt=4) for r in range(size)]
        bn = torch.nn.BatchNorm1d(3) if len(shape) <= 3 else torch.nn.BatchNorm2d(3)
        with torch.no_grad():
            bn.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
            bn.bias.copy_(torch.tensor([0.1, 0.0, 0.3]))
        sbn = hvd.SyncBatchNorm(3)
        sbn.load_state_dict(bn.state_dict())
        full = torch.cat(xs).requires_grad_()
        ref_out = bn(full)
        (ref_out * torch.cat(gs)).sum().backward()
        mine = xs[rank].clone().requires_grad_()
        out = sbn(mine)
        (out * gs[rank]).sum().backward()
        start = sum(rows_each[:rank])
        check(f"syncbn out {shape}", torch.allclose(out, ref_out[start:start + rows_each[rank]].detach(),
                                                    atol=1e-5))
        check(f"syncbn grad {shape}", torch.allclose(mine.grad, full.grad[start:start + rows_each[rank]],
                                                     atol=1e-5))
        wsum = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
        check(f"syncbn weight grad {shape}", torch.allclose(wsum, bn.weight.grad, atol=1e-4))
        check(f"syncbn running {shape}", torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-6)
              and torch.allclose(sbn.running_var, bn.running_var, atol=1e-5))
        sbn.eval()
        bn.eval()
        check(f"syncbn eval {shape}", torch.allclose(sbn(xs[rank]), bn(xs[rank]), atol=1e-6))
    conv = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(4)))
    check("convert_sync_batchnorm", isinstance(conv[0], hvd.SyncBatchNorm))


def test_device_path_in_use(rank, size):
    """Under HVDLITE_DEVICE_TRANSPORT=gloo/host the tensors really take that path."""
    import os
    mode = os.environ.get("HVDLITE_DEVICE_TRANSPORT", "auto")
    before = dict(hvd.device.counts)
    hvd.allreduce(torch.ones(3), name="device.path")
    hvd.allgather(torch.ones(1, 2), name="device.path.g")
    after = hvd.device.counts
    jobs, staged = after["device_jobs"] - before["device_jobs"], after["staged"] - before["staged"]
    check("backend", hvd.device.backend_name() == ("gloo" if mode == "gloo" else None))
    check("executor jobs", jobs == (2 if mode == "gloo" else 0), f"{jobs}")
    check("staged copies", staged == (2 if mode == "host" else 0), f"{staged}")

    class FakeCuda(torch.Tensor):
        # What a CUDA tensor looks like to the adapter; this torch has no CUDA.
        @property
        def device(self):
            return torch.device("cuda", 0)

        @property
        def is_cuda(self):
            return True
    t = torch.ones(4).as_subclass(FakeCuda)
    check("a CUDA tensor without NCCL is staged through the host",
          hvd.device.executor_for(t) is None and hvd.device.needs_staging(t))
    check("no NCCL on this CPU torch", not hvd.nccl_built() and not hvd.device.nccl_usable())

    import tempfile
    path = os.path.join(tempfile.gettempdir(), "hvdl-device-timeline-%d-%%r.json" % os.getpid())
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(3), name="device.timeline")
    hvd.stop_timeline()
    written = path.replace("%r", str(rank))
    with open(written) as f:
        text = f.read()
    os.unlink(written)
    check("the timeline names the device collective",
          ("GLOO_ALLREDUCE" in text) == (mode == "gloo") and "allreduce.device.timeline" in text)


def test_errors(rank, size):
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.allreduce(torch.empty(3, device="meta")), "takes CPU tensors and CUDA tensors")
    expect(hvdlite.UnsupportedDTypeError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.uint32)),
           "uint32")
    expect(hvdlite.UnsupportedDTypeError,
           lambda: hvd.allgather(torch.ones(2, dtype=torch.complex64)), "complex64")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.allreduce([1.0, 2.0]), "torch.Tensor")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.allreduce(torch.eye(2).to_sparse()), "sparse")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.sparse_allreduce_async(torch.ones(2), name="sp.dense"), "sparse COO")
    expect(NotImplementedError,
           lambda: hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), op=hvd.Max), "averaged or summed")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.allreduce(torch.ones(2), op=42), "op")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum), "not both")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum), "Adasum", "float32")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Sum), "bool")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.broadcast(torch.ones(2), size), "root_rank")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.synchronize(3), "handle")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.poll("x"), "handle")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.grouped_allreduce(torch.ones(2)),
           "list")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.alltoall(torch.ones(3, 1), splits=[1] * size + [1]), "splits")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.alltoall(torch.ones(size + 1, 1)), "divisible")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.broadcast_parameters(torch.ones(2), 0), "state_dict")
    expect(ValueError, lambda: hvd.SyncBatchNorm(3)(torch.ones(3)), "2D")
    # mismatched shapes across ranks: every rank gets the error, training goes on
    expect(hvdlite.TensorMismatchError,
           lambda: hvd.allreduce(torch.ones(rank + 1), name="mismatch"))
    expect(hvdlite.HvdliteError,
           lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if rank else torch.float64),
                                 name="mismatch2"))
    check("still works after mismatch", hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size)
    check("HorovodInternalError alias", hvd.HorovodInternalError is hvdlite.HvdliteError)


def test_join(rank, size):
    # Every rank joins at once: any of them may be the last, and all agree which.
    last = hvd.join()
    check("join", 0 <= last < size and hvd.allgather_object(last) == [last] * size, f"{last}")
    # Horovod scripts pass their GPU index; a CPU build accepts and ignores it.
    last = hvd.join(device=hvd.local_rank())
    check("join(device=local_rank) on a CPU build",
          0 <= last < size and hvd.allgather_object(last) == [last] * size, f"{last}")
    expect(hvdlite.InvalidArgumentError, lambda: hvd.join(device="gpu"), "device")
    # Horovod's rules while a rank has joined: allgather and broadcast fail on the
    # ranks that issue them (their unnamed-collective counters then differ from
    # the joined rank's), allreduce goes on with zeros; object collectives still
    # meet afterwards because their default names are fixed.
    for first in range(size):
        if rank == first:
            last = hvd.join()
        else:
            expect(hvdlite.HvdliteError,
                   lambda: hvd.allgather(torch.ones(2, 3)), "joined")
            expect(hvdlite.HvdliteError,
                   lambda: hvd.broadcast(torch.ones(2), (first + 1) % size, name="after.join"), "joined")
            got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"ar.after.join.{first}")
            check(f"allreduce after rank {first} joined gets zeros from it", torch.equal(got, torch.full((3,), size - 1.0)))
            last = hvd.join()
        check(f"join returns a rank other than the first to join ({first})", last != first or size == 1)
        check(f"allgather_object after join ({first})", hvd.allgather_object(last) == [last] * size)


def test_shutdown(rank, size):
    hvd.barrier()
    hvd.shutdown()
    check("shutdown", not hvd.is_initialized())
    expect(hvdlite.HvdliteError, lambda: hvd.allreduce(torch.ones(1)))
