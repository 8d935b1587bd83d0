"""DDP and FSDP2 on torch.distributed's "hvdlite" backend (hvdlite/torch/c10d.py)
and hvdlite's compressors as DDP communication hooks (hvdlite/torch/ddp_hooks.py).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it at 2 and at 4 ranks under mpiexec, so
``init_process_group(backend="hvdlite")`` gets no other argument. DDP and
FSDP2 on hvdlite are checked against the same model on a gloo group of the
same job, step by step; DDP's buckets against the engine's response cache;
each hook against hvdlite's DistributedOptimizer with the same compression
(and fp16/bf16 against a NumPy reference of the compressed average).
"""
import numpy as np
import pytest

from harness.checks import check, check_close, expect, require

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402  (registers the backend)
from hvdlite.torch import ddp_hooks  # noqa: E402
from harness.c10d_ranks import Branchy, backward, batch, gloo, group, make_model  # noqa: E402,F401  (fixtures)

torch.set_num_threads(1)


def DDP(*args, **kwargs):
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(*args, **kwargs)


# ---------------------------------------------------------------- DDP

def ddp_pair(gloo, **kwargs):
    """The same model twice, one DDP on the hvdlite default group, one on gloo.
    Rank 1 starts from other weights: DDP's broadcast at construction must fix that."""
    seed = dist.get_rank()
    a = DDP(make_model(seed), **kwargs)
    b = DDP(make_model(seed), process_group=gloo, **kwargs)
    return a, b


def check_params(a, b, what, tol=1e-6):
    for (name, pa), (_, pb) in zip(a.module.named_parameters(), b.module.named_parameters()):
        diff = (pa.detach() - pb.detach()).abs().max().item()
        check(f"{what}: {name} within {tol:g} of gloo", diff <= tol, f"(max difference {diff:g})")


def train(models, steps, accumulate=1, hook=None):
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for step in range(steps):
        for m, opt in zip(models, opts):
            backward(m, step, dist.get_rank(), accumulate)
            opt.step()
            opt.zero_grad()
        yield step


def test_ddp_matches_gloo(group, gloo, rank, size):
    a, b = ddp_pair(gloo)
    check_params(a, b, "after construction")
    first = [p.detach().clone() for p in a.module.parameters()]
    gathered = [torch.empty_like(first[0]) for _ in range(size)]
    dist.all_gather(gathered, first[0])
    check("construction broadcast rank 0's weights",
          all(torch.equal(g, gathered[0]) for g in gathered))
    before = hvdlite.engine_stats()["tensors"]
    for step in train([a, b], 5):
        check_params(a, b, f"step {step}")
    reduced = hvdlite.engine_stats()["tensors"] - before
    check("DDP's buckets went through the engine", reduced >= 5, f"({reduced} tensors)")


def test_ddp_no_sync_accumulation(group, gloo, rank, size):
    a, b = ddp_pair(gloo)
    for step in train([a, b], 3, accumulate=3):
        check_params(a, b, f"step {step} (3 accumulated)")


def test_ddp_find_unused_parameters(group, gloo, rank, size):
    torch.manual_seed(rank)
    a = DDP(Branchy(rank), find_unused_parameters=True)
    b = DDP(Branchy(rank), process_group=gloo, find_unused_parameters=True)
    for step in train([a, b], 3):
        check_params(a, b, f"step {step} (unused parameters)")


def test_ddp_fp16_compress_hook(group, gloo, rank, size):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    a, b = ddp_pair(gloo)
    a.register_comm_hook(None, default_hooks.fp16_compress_hook)
    b.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    # torch's hook sums float16 tensors: two are summed with one rounding, the
    # same everywhere, but gloo and the engine add more than two in other
    # orders, each rounding to float16 (1e-3 of a gradient, times lr 0.1).
    tol = 1e-6 if size == 2 else 2e-5
    for step in train([a, b], 3):
        check_params(a, b, f"step {step} (fp16 hook)", tol)


def _torch_powersgd():
    """torch's powerSGD_hook and a state maker. (Its batched_powerSGD_hook
    fails in torch 2.13 on any backend: it orthogonalizes a 2-d tensor with a
    function that asserts 3-d ones.)"""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    hook = psgd.powerSGD_hook

    def state(group):
        return psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                  start_powerSGD_iter=2, min_compression_rate=0.5, random_seed=7)
    return hook, state


def test_ddp_torch_powersgd_hook(group, gloo, rank, size):
    hook, state = _torch_powersgd()
    a, b = ddp_pair(gloo)
    a.register_comm_hook(state(None), hook)
    b.register_comm_hook(state(gloo), hook)
    for step in train([a, b], 5):
        check_params(a, b, f"step {step} (torch's {hook.__name__})", 1e-5)


def test_ddp_join_uneven_inputs(group, gloo, rank, size):
    """Rank r has r + 2 batches; Join's allreduces run on the hvdlite group."""
    from torch.distributed.algorithms.join import Join
    a, b = ddp_pair(gloo)
    loss_fn = torch.nn.CrossEntropyLoss()
    for m in (a, b):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with Join([m]):
            for step in range(rank + 2):
                x, y = batch(step, rank)
                loss_fn(m(x), y).backward()
                opt.step()
                opt.zero_grad()
    check_params(a, b, "after uneven inputs")


def test_ddp_static_graph_matches_gloo(group, gloo, rank, size):
    a, b = ddp_pair(gloo, static_graph=True)
    for step in train([a, b], 4):
        check_params(a, b, f"step {step} (static_graph)")


def bucket_model():
    """With bucket_cap_mb=0.0001 DDP's rebuilt buckets hold one layer each
    (bias and weight): 68, 272, 272 and 144 floats, two of one size in a row."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def cache_counts(model, steps, rank):
    """Per step: the engine's completed tensors, cache hits and misses, and
    negotiation rounds."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    keys = ("tensors", "cache_hits", "cache_misses", "negotiations")
    counts = []
    for step in range(steps):
        before = hvdlite.engine_stats()
        x, y = batch(step, rank)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        after = hvdlite.engine_stats()
        counts.append({k: after[k] - before[k] for k in keys})
    return counts


def check_cached(counts, buckets, what):
    """From the third step on (the first runs one bucket of everything, the
    second the rebuilt buckets) every bucket allreduce is a cache hit."""
    steady = counts[2:]
    check(f"{what}: {buckets} allreduces every step", all(c["tensors"] == buckets for c in steady),
          counts)
    check(f"{what}: every bucket answered from the cache",
          all(c["cache_hits"] == buckets for c in steady), counts)
    check(f"{what}: no cache misses", all(c["cache_misses"] == 0 for c in steady), counts)


def test_ddp_buckets_hit_the_response_cache(group, rank, size):
    """The backend names DDP's bucket allreduces alike every step, so the
    engine's response cache answers them: as many cache hits as allreduces
    and no misses once the buckets are rebuilt. Four buckets (two of one size
    in a row), then the usual single bucket of a small model."""
    counts = cache_counts(DDP(bucket_model(), bucket_cap_mb=0.0001), 12, rank)
    print(f"rank {rank} of {size}, 4 buckets, per step: {counts}")
    check_cached(counts, 4, "4 buckets")
    counts = cache_counts(DDP(bucket_model()), 12, rank)
    print(f"rank {rank} of {size}, 1 bucket, per step: {counts}")
    check_cached(counts, 1, "1 bucket")


# ---------------------------------------------------------------- FSDP2

def test_fsdp2_matches_gloo(group, gloo, rank, size):
    """fully_shard on the hvdlite default group (all-gathers and reduce-scatters
    of every layer's shards) against the same model sharded over gloo."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def sharded(mesh):
        model = make_model(0)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    a = sharded(None)   # the default group: hvdlite
    b = sharded(DeviceMesh.from_group(gloo, "cpu"))
    check("shards", all(p.to_local().numel() < p.numel() for p in a.parameters() if p.numel() >= size))
    loss_fn = torch.nn.CrossEntropyLoss()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (a, b)]
    before = hvdlite.engine_stats()["tensors"]
    for step in range(4):
        x, y = batch(step, rank)
        for m, opt in zip((a, b), opts):
            loss_fn(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            diff = (pa.full_tensor() - pb.full_tensor()).abs().max().item()
            check(f"step {step}: {name} within 1e-6 of gloo", diff <= 1e-6, f"({diff:g})")
    moved = hvdlite.engine_stats()["tensors"] - before
    check("FSDP's all-gathers and reduce-scatters went through the engine", moved >= 4 * 2,
          f"({moved} tensors)")


# ---------------------------------------------------------------- compressors as DDP hooks

def hook_model():
    """Large enough for the compressors to act: top-k sends tensors under
    1024 entries whole, PowerSGD sends vectors and small matrices dense."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 4))


def hook_batch(step, r):
    g = torch.Generator().manual_seed(500 + 100 * step + r)
    return torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)


def run_steps(model, opt, steps, rank):
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = hook_batch(step, rank)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def trained_with_hook(make_hook, steps, momentum, rank):
    hvdlite.reset_compression_state()
    ddp = DDP(hook_model(), bucket_cap_mb=0.01)    # several buckets
    ddp.register_comm_hook(None, make_hook(ddp.module.named_parameters()))
    run_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=momentum), steps, rank)
    return [p.detach().clone() for p in ddp.module.parameters()]


def trained_with_optimizer(compression, steps, momentum, rank):
    hvdlite.reset_compression_state()
    model = hook_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    run_steps(model, opt, steps, rank)
    return [p.detach().clone() for p in model.parameters()]


def max_diff(xs, ys):
    return max((x - y).abs().max().item() for x, y in zip(xs, ys))


def compare_hook(make_hook, compression, kind, rank, steps=6, momentum=0.9, changes=True):
    """Trains hook_model with DDP and the hook, then with DistributedOptimizer
    and ``compression``: the same parameters (1e-6). The hook must have put
    ``kind``'s bytes on the wire, and (``changes``) the result must differ
    from uncompressed training, or the comparison would prove nothing."""
    wire = f"wire_bytes_{kind}"
    before = hvdlite.engine_stats()[wire]
    hooked = trained_with_hook(make_hook, steps, momentum, rank)
    sent = hvdlite.engine_stats()[wire] - before
    check(f"{kind} ran in the engine", sent > 0, f"({wire} grew by {sent})")
    reference = trained_with_optimizer(compression, steps, momentum, rank)
    diff = max_diff(hooked, reference)
    check(f"{kind} hook trains as DistributedOptimizer(compression={compression!r})", diff <= 1e-6,
          f"(max difference {diff:g})")
    if changes:
        plain = trained_with_optimizer(hvd.Compression.none, steps, momentum, rank)
        away = max_diff(hooked, plain)
        check(f"{kind} changed the training", away > 1e-4, f"(max difference from none {away:g})")


def test_fp16_hook_trains_as_distributed_optimizer(group, rank, size):
    compare_hook(lambda _named: ddp_hooks.fp16_hook, hvd.Compression.fp16, "fp16", rank,
                 changes=False)


def test_bf16_hook_trains_as_distributed_optimizer(group, rank, size):
    compare_hook(lambda _named: ddp_hooks.bf16_hook, hvd.Compression.bf16, "bf16", rank,
                 changes=False)


def test_topk_hook_trains_as_distributed_optimizer(group, rank, size):
    compare_hook(lambda named: ddp_hooks.topk_hook(0.05, named_parameters=named),
                 hvd.Compression.topk(0.05), "topk", rank)


def test_topk_dgc_hook_trains_as_distributed_optimizer(group, rank, size):
    """Deep Gradient Compression: momentum correction (given as a number: the
    hook does not see the optimizer, so plain SGD), warm-up and clipping."""
    options = dict(momentum_correction=0.9, warmup_steps=2, clip_norm=5.0)
    compare_hook(lambda named: ddp_hooks.topk_hook(0.05, named_parameters=named, **options),
                 hvd.Compression.topk(0.05, **options), "topk", rank, momentum=0.0)


def test_powersgd_hook_trains_as_distributed_optimizer(group, rank, size):
    compare_hook(lambda named: ddp_hooks.powersgd_hook(2, start_iter=2, named_parameters=named),
                 hvd.Compression.powersgd(2, start_iter=2), "powersgd", rank)


def test_quantize_hook_trains_as_distributed_optimizer(group, rank, size):
    """The 4-bit quantizer (rounding to nearest, error feedback) per parameter."""
    compare_hook(lambda named: ddp_hooks.quantize_hook(4, named_parameters=named),
                 hvd.Compression.quantize(4), "quantize", rank)
    # compression_hook maps it to the per-parameter hook (8 bits: too close to
    # uncompressed training for the "changed" check).
    compare_hook(lambda named: ddp_hooks.compression_hook(hvd.Compression.quantize(8), named_parameters=named),
                 hvd.Compression.quantize(8), "quantize", rank, changes=False)


def local_gradients(r):
    """Rank ``r``'s own gradients of hook_model on its first batch."""
    model = hook_model()
    x, y = hook_batch(0, r)
    torch.nn.CrossEntropyLoss()(model(x), y).backward()
    return [p.grad.numpy().astype(np.float64) for p in model.parameters()]


def check_compressed_average(hook, wire_dtype, rtol, rank, size):
    """One backward with ``hook``: each gradient is the average over the ranks
    of their gradients rounded to ``wire_dtype`` (every rank computes every
    rank's gradients), within ``rtol`` of the largest entry, and not the
    exact average."""
    ddp = DDP(hook_model(), bucket_cap_mb=0.01)
    ddp.register_comm_hook(None, hook)
    x, y = hook_batch(0, rank)
    torch.nn.CrossEntropyLoss()(ddp(x), y).backward()
    got = [p.grad.detach().clone() for p in ddp.module.parameters()]
    local = [local_gradients(r) for r in range(size)]
    rounded_anywhere = False
    for i, g in enumerate(got):
        exact = np.mean([grads[i] for grads in local], axis=0)
        wire = [torch.from_numpy(grads[i]).to(wire_dtype).double().numpy() for grads in local]
        want = np.mean(wire, axis=0).astype(np.float32)
        scale = float(np.abs(exact).max())
        check_close(g.numpy(), want, f"parameter {i}", rtol=rtol, atol=rtol * scale)
        rounded_anywhere |= bool(np.abs(g.numpy() - exact.astype(np.float32)).max() > 0)
    check(f"rounded through {wire_dtype}", rounded_anywhere)


def test_fp16_hook_is_the_compressed_average(group, rank, size):
    check_compressed_average(ddp_hooks.fp16_hook, torch.float16, 2e-3, rank, size)


def test_bf16_hook_is_the_compressed_average(group, rank, size):
    check_compressed_average(ddp_hooks.bf16_hook, torch.bfloat16, 1.6e-2, rank, size)


def test_hook_errors(group, gloo, rank, size):
    expect(ValueError, lambda: ddp_hooks.fp16_hook(gloo, None), "hvdlite", "backend")
    expect(ValueError, lambda: ddp_hooks.topk_hook(0.01, momentum_correction=True),
           "momentum_correction=0.9", "plain SGD")
    expect(ValueError, lambda: ddp_hooks.powersgd_hook(0), "powersgd rank")
    expect(ValueError, lambda: ddp_hooks.compression_hook(
        hvd.Compression.topk(0.01, momentum_correction=True)), "momentum_correction=0.9")
