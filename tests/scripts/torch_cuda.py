"""hvdlite.torch with real CUDA tensors: every collective, compression (the
device executor's own, and the compressors with engine state, which stage
through host memory), the DistributedOptimizer on a CUDA model, and the
ordering of a collective after work on another CUDA stream; each result
against a reference computed locally on the CPU.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it on a machine with a GPU: at 1 rank (NCCL through the device executor)
and at 2 ranks sharing one GPU (NCCL refuses that: the tensors are staged
through host memory to the engine). Without a GPU the outer test skips.
"""
from harness.checks import check, require

torch = require("torch")

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)


def cuda():
    """This rank's GPU: its own where there are enough, else shared."""
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def data(r, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


def expected_path(size):
    """'nccl' where each rank has a GPU of its own, else 'host' (staged)."""
    return "nccl" if size <= torch.cuda.device_count() else "host"


def test_path(rank, size):
    check("CUDA build queries", hvd.cuda_built() and hvd.nccl_built())
    before = dict(hvd.device.counts)
    out = hvd.allreduce(data(rank, (5,)).to(cuda()), op=hvd.Sum, name="cuda.path")
    after = hvd.device.counts
    check("result stays on the GPU", out.is_cuda and out.device == cuda())
    jobs, staged = after["device_jobs"] - before["device_jobs"], after["staged"] - before["staged"]
    if expected_path(size) == "nccl":
        check("NCCL executor", hvd.device.backend_name() == "nccl" and jobs == 1 and staged == 0,
              f"{hvd.device.backend_name()} jobs {jobs} staged {staged}")
    else:
        check("staged through the host", hvd.device.backend_name() is None and jobs == 0 and staged == 1,
              f"{hvd.device.backend_name()} jobs {jobs} staged {staged}")


def test_allreduce(rank, size):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        allreduce_ops(rank, size, dtype)


def allreduce_ops(rank, size, dtype):
    ref_sum = sum(data(r, (3, 17), dtype).double() for r in range(size))
    got = hvd.allreduce(data(rank, (3, 17), dtype).to(cuda()), op=hvd.Sum, name=f"cuda.ar.{dtype}")
    tol = 1e-2 * size if dtype in (torch.float16, torch.bfloat16) else 1e-6
    check(f"sum {dtype}", got.dtype == dtype and torch.allclose(got.cpu().double(), ref_sum, atol=tol, rtol=tol))
    if dtype.is_floating_point:
        got = hvd.allreduce(data(rank, (3, 17), dtype).to(cuda()), op=hvd.Average, name=f"cuda.avg.{dtype}")
        check(f"average {dtype}", torch.allclose(got.cpu().double(), ref_sum / size, atol=tol, rtol=tol))
    for op, fn in [(hvd.Min, torch.minimum), (hvd.Max, torch.maximum)]:
        want = data(0, (3, 17), dtype)
        for r in range(1, size):
            want = fn(want, data(r, (3, 17), dtype))
        got = hvd.allreduce(data(rank, (3, 17), dtype).to(cuda()), op=op, name=f"cuda.{op}.{dtype}")
        check(f"op {op} {dtype}", torch.equal(got.cpu(), want))


def test_inplace_grouped_and_scaled(rank, size):
    t = data(rank, (64,)).to(cuda())
    hvd.allreduce_(t, op=hvd.Sum, name="cuda.inplace", prescale_factor=0.5, postscale_factor=3.0)
    want = sum(data(r, (64,)).double() for r in range(size)) * 1.5
    check("in place, pre/postscale", torch.allclose(t.cpu().double(), want, atol=1e-5))
    ts = [data(rank, (n,), salt=n).to(cuda()) for n in (1, 100, 4097)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Average, name="cuda.group")
    for n, o in zip((1, 100, 4097), outs):
        want = sum(data(r, (n,), salt=n).double() for r in range(size)) / size
        check(f"grouped {n}", o.is_cuda and torch.allclose(o.cpu().double(), want, atol=1e-6))


def test_allgather_broadcast_alltoall_reducescatter(rank, size):
    got = hvd.allgather(data(rank, (rank + 1, 3)).to(cuda()), name="cuda.gather")
    want = torch.cat([data(r, (r + 1, 3)) for r in range(size)])
    check("allgather (ragged)", got.is_cuda and torch.equal(got.cpu(), want))
    t = data(rank, (7,)).to(cuda())
    hvd.broadcast_(t, root_rank=size - 1, name="cuda.bcast")
    check("broadcast_", torch.equal(t.cpu(), data(size - 1, (7,))))
    rows = torch.arange(2 * size, dtype=torch.float32).reshape(2 * size, 1) + 100 * rank
    got = hvd.alltoall(rows.to(cuda()), name="cuda.a2a")
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32).reshape(2, 1) + 100 * r
                      for r in range(size)])
    check("alltoall", got.is_cuda and torch.equal(got.cpu(), want))
    m = data(rank, (2 * size, 3), salt=9).to(cuda())
    got = hvd.reducescatter(m, op=hvd.Sum, name="cuda.rs")
    full = sum(data(r, (2 * size, 3), salt=9).double() for r in range(size))
    check("reducescatter", got.is_cuda and torch.allclose(got.cpu().double(), full[2 * rank:2 * rank + 2],
                                                          atol=1e-5))


def test_compression(rank, size):
    """fp16, bf16 and top-k run where the tensor is (the executor, or the engine
    after staging); top-k with DGC's options and PowerSGD keep state in the
    engine, so their CUDA tensors are staged and must equal the same call on
    CPU tensors."""
    x = data(rank, (4096,), salt=3)
    want = sum(data(r, (4096,), salt=3).double() for r in range(size))
    for comp, tol in [(hvd.Compression.fp16, 2e-2 * size), (hvd.Compression.bf16, 6e-2 * size)]:
        got = hvd.allreduce(x.to(cuda()), op=hvd.Sum, compression=comp, name=f"cuda.{comp!r}")
        check(f"{comp!r}", got.is_cuda and torch.allclose(got.cpu().double(), want, atol=tol))
    got = hvd.allreduce(x.to(cuda()), op=hvd.Sum, compression=hvd.Compression.topk(1.0), name="cuda.topk")
    check("topk(1.0)", torch.allclose(got.cpu().double(), want, atol=1e-5))
    m = data(rank, (64, 48), salt=4)
    for comp in [hvd.Compression.topk(0.01, momentum_correction=0.9, warmup_steps=2),
                 hvd.Compression.powersgd(rank=2, start_iter=1)]:
        hvdlite.reset_compression_state()
        before = hvd.device.counts["staged"]
        on_gpu = [hvd.allreduce(m.to(cuda()), op=hvd.Sum, compression=comp, name=f"cuda.state.{comp.kind}")
                  for _ in range(4)]
        staged = hvd.device.counts["staged"] - before
        hvdlite.reset_compression_state()
        on_cpu = [hvd.allreduce(m, op=hvd.Sum, compression=comp, name=f"cuda.state.{comp.kind}")
                  for _ in range(4)]
        check(f"{comp!r}: staged", staged == 4, f"{staged}")
        check(f"{comp!r}: same as on the CPU", all(g.is_cuda and torch.equal(g.cpu(), c)
                                                     for g, c in zip(on_gpu, on_cpu)))


def test_after_work_on_another_stream(rank, size):
    """A tensor written by a kernel on a side stream, then reduced: the
    collective must wait for the kernel (the producer's stream)."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.zeros(1 << 22, device=cuda())
        for _ in range(20):  # long enough that a collective racing it would see zeros
            t.add_(float(rank + 1) / 20)
        out = hvd.allreduce(t, op=hvd.Sum, name="cuda.stream")
    torch.cuda.synchronize()
    want = sum(r + 1 for r in range(size))
    check("ordered after the producer", torch.allclose(out.cpu(), torch.full((1 << 22,), float(want)),
                                                       atol=1e-4), f"{out[:3]}")


def test_optimizer_on_a_cuda_model(rank, size):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(cuda())
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8 * size, 8, generator=g), torch.randint(0, 4, (8 * size,), generator=g)
        opt.zero_grad()
        loss_fn(model(x[8 * rank:8 * rank + 8].to(cuda())), y[8 * rank:8 * rank + 8].to(cuda())).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
    check("matches single-process training", all(torch.allclose(p.detach().cpu(), q.detach(), atol=1e-5)
                                                 for p, q in zip(model.parameters(), ref.parameters())))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name="cuda.params")
    check("identical on all ranks", all(torch.equal(everyone[0], everyone[r]) for r in range(size)))
