"""hvdlite.torch.DistributedOptimizer on real ranks, against a single-process
reference trained on the combined batch (every rank computes the reference
itself, from the same seeded data), and join with ranks that run out of
data at different steps.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 ranks.
"""
import os
import shutil
import tempfile
import time
import warnings

from harness.checks import check, expect, require

torch = require("torch")

import hvdlite  # noqa: E402
import hvdlite.timeline  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)
B = 6                     # rows per rank


def make_model(seed=0, width=16):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, 4))


def batch(step, rows=B * 2):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(rows, 8, generator=g)
    y = torch.randint(0, 4, (rows,), generator=g)
    return x, y


def shard(t):
    """This rank's rows of a combined batch."""
    n = t.shape[0] // hvd.size()
    return t[hvd.rank() * n:(hvd.rank() + 1) * n]


loss_fn = torch.nn.CrossEntropyLoss()


def identical_everywhere(params):
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    gathered = hvd.allgather(flat.unsqueeze(0))
    return all(torch.equal(gathered[0], gathered[r]) for r in range(hvd.size()))


def close(a_params, b_params, tol=1e-5):
    return all(torch.allclose(a, b, atol=tol, rtol=tol) for a, b in zip(a_params, b_params))


def step_both(model, opt, ref, ref_opt, first_batch, steps):
    """``steps`` steps of the distributed model on this rank's shard and of the
    single-process reference on the combined batch."""
    for step in range(steps):
        x, y = batch(first_batch + step, B * hvd.size())
        opt.zero_grad()
        loss_fn(model(shard(x)), shard(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()


def run_variant(name, steps=2, clip=None, ref_scale=1.0, **kwargs):
    model, ref = make_model(6), make_model(6)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), **kwargs)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batch(40 + step, B * hvd.size())
        opt.zero_grad()
        loss_fn(model(shard(x)), shard(y)).backward()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        for p in ref.parameters():
            p.grad.mul_(ref_scale)
        if clip is not None:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        ref_opt.step()
    check(f"{name} matches", close(model.parameters(), ref.parameters()))
    check(f"{name} identical", identical_everywhere(model.parameters()))
    return model, opt


def test_sgd_matches_single_process(rank, size):
    model, ref = make_model(rank), make_model(0)        # rank-dependent init, fixed by broadcast
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check("isinstance", isinstance(opt, torch.optim.SGD) and isinstance(opt, torch.optim.Optimizer)
          and type(opt).__name__ == "SGD")
    check("shares state", opt.param_groups is base.param_groups and opt.state is base.state)
    for step in range(5):
        x, y = batch(step, B * size)
        opt.zero_grad()
        loss_fn(model(shard(x)), shard(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
        check(f"bitwise identical step {step}", identical_everywhere(model.parameters()))
        check(f"matches single process step {step}", close(model.parameters(), ref.parameters()),
              str(max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))))
    check("_parameter_names (Horovod's attribute)",
          opt._parameter_names == {p: n for n, p in model.named_parameters()})
    sd = opt.state_dict()
    check("state_dict", len(sd["state"]) == 6 and "momentum_buffer" in sd["state"][0])
    opt.load_state_dict(sd)
    check("load_state_dict", torch.equal(opt.state_dict()["state"][0]["momentum_buffer"],
                                         sd["state"][0]["momentum_buffer"]))


def test_top_level_dispatch_and_adam(rank, size):
    model, ref = make_model(1), make_model(1)
    opt = hvdlite.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    check("top-level dispatch", isinstance(opt, torch.optim.Adam) and hasattr(opt, "synchronize"))
    step_both(model, opt, ref, ref_opt, 10, 3)
    check("adam matches", close(model.parameters(), ref.parameters(), 1e-5))
    check("adam identical", identical_everywhere(model.parameters()))


def test_backward_passes_per_step(rank, size):
    model, ref = make_model(2), make_model(2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(2):
            x, y = batch(100 + 10 * step + micro, B * size)
            loss_fn(model(shard(x)), shard(y)).backward()
            loss_fn(ref(x), y).backward()
            if micro == 0:
                check("no reduction before k passes", all(h is None for h, _ in opt._handles.values()))
        opt.step()
        ref_opt.step()
    check("accumulation matches", close(model.parameters(), ref.parameters()))
    check("accumulation identical", identical_everywhere(model.parameters()))
    opt.zero_grad()
    x, y = batch(7, B * size)
    for _ in range(2):
        loss_fn(model(shard(x)), shard(y)).backward()
    expect(hvd.OptimizerMisuseError,
           lambda: loss_fn(model(shard(x)), shard(y)).backward(), "backward_passes_per_step=2")
    check("misuse is AssertionError", issubclass(hvd.OptimizerMisuseError, AssertionError))
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    expect(hvdlite.InvalidArgumentError,
           lambda: opt.set_backward_passes_per_step(0), ">= 1")
    opt.set_backward_passes_per_step(1)
    loss_fn(model(shard(x)), shard(y)).backward()
    check("after set_backward_passes_per_step", all(h is not None for h, _ in opt._handles.values()))
    expect(hvd.OptimizerMisuseError, lambda: opt.zero_grad(), "zero_grad")
    opt.step()
    opt.zero_grad(set_to_none=False)
    check("zero_grad(set_to_none=False)", all(p.grad is not None and not p.grad.any()
                                              for p in model.parameters()))
    opt.zero_grad()
    check("zero_grad() sets None", all(p.grad is None for p in model.parameters()))


def test_unused_and_frozen_parameters(rank, size):


    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(3)
            self.body = torch.nn.Linear(8, 8)
            self.a = torch.nn.Linear(8, 4)
            self.b = torch.nn.Linear(8, 4)
            self.frozen = torch.nn.Linear(8, 8)
            self.frozen.requires_grad_(False)

        def forward(self, x, use_b):
            h = torch.tanh(self.frozen(self.body(x)))
            out = self.a(h)
            return out + self.b(h) if use_b else out


    m = TwoHeads()
    frozen_before = m.frozen.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    x, y = batch(20, B * size)
    twin = TwoHeads()           # same weights, no hooks: this rank's own gradient
    loss_fn(twin(shard(x), use_b=(rank == 1)), shard(y)).backward()
    local_b = twin.b.weight.grad if rank == 1 else None
    opt.zero_grad()
    loss_fn(m(shard(x), use_b=(rank == 1)), shard(y)).backward()
    opt.synchronize()
    all_b = hvd.broadcast_object(local_b, root_rank=1)
    check("unused param reduced with zeros", torch.allclose(m.b.weight.grad, all_b / size))
    with opt.skip_synchronize():
        opt.step()
    check("unused param identical", identical_everywhere(m.parameters()))
    check("frozen untouched", m.frozen.weight.grad is None and torch.equal(m.frozen.weight, frozen_before))

    # unfreezing after wrapping and add_param_group: reduced from the next step on
    m.frozen.requires_grad_(True)
    extra = torch.nn.Parameter(torch.full((3,), float(rank)))
    opt.add_param_group({"params": [extra]})
    opt.zero_grad()
    x, y = batch(21, B * size)
    (loss_fn(m(shard(x), use_b=True), shard(y)) + (extra * (rank + 1)).sum()).backward()
    opt.step()
    check("unfrozen parameter reduced", identical_everywhere([m.frozen.weight, m.frozen.bias]))
    check("add_param_group parameter reduced",
          torch.allclose(extra.grad, torch.full((3,), (size + 1) / 2)))
    m.frozen.requires_grad_(False)
    m.frozen.weight.grad = m.frozen.bias.grad = None
    import copy  # noqa: E402
    check("deepcopy of a wrapped model", isinstance(copy.deepcopy(m), TwoHeads))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt_new = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                           named_parameters=m.named_parameters())
        check("rewrapping warns", any("already wrapped" in str(w.message) for w in caught))
    opt_new.zero_grad()
    loss_fn(m(shard(x), use_b=True), shard(y)).backward()
    opt_new.step()
    check("rewrapped optimizer reduces once", identical_everywhere(m.parameters()))
    opt_new.remove_hooks()


def test_bad_arguments(rank, size):
    # duplicates, unnamed, bad arguments
    m2 = make_model(4)
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            named_parameters=[("w", p) for p in m2.parameters()]),
           "unique", "w")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            named_parameters=list(m2.named_parameters())[:2]),
           "not in it")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            named_parameters=list(m2.parameters())), "tuples")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(m2), "torch.optim.Optimizer")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvdlite.DistributedOptimizer(object()), "torch.optim.Optimizer")
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1))
    expect(hvdlite.InvalidArgumentError, lambda: hvd.DistributedOptimizer(wrapped),
           "already")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            backward_passes_per_step=0), "backward_passes_per_step")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), op=hvd.Sum,
                                            gradient_predivide_factor=2.0), "Average")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), op=hvd.Adasum,
                                            groups=2), "groups")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            compression="fp16"), "compression")
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1), groups=-1),
           "groups")
    p0 = next(m2.parameters())
    expect(hvdlite.InvalidArgumentError,
           lambda: hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                            groups=[[p0], [p0]]), "only one group")
    wrapped.remove_hooks()
    del wrapped


def test_create_graph_refused(rank, size):
    # create_graph backward cannot be reduced
    m3 = make_model(5)
    opt3 = hvd.DistributedOptimizer(torch.optim.SGD(m3.parameters(), lr=0.1),
                                    named_parameters=m3.named_parameters())
    x, y = batch(30, B * size)
    expect(hvd.OptimizerMisuseError,
           lambda: loss_fn(m3(shard(x)), shard(y)).backward(create_graph=True), "create_graph")
    opt3.remove_hooks()
    for p in m3.parameters():
        p.grad = None


def test_clipping_sum_predivide_groups_and_warnings(rank, size):




    run_variant("clip with synchronize/skip_synchronize", clip=0.05)
    run_variant("op=Sum", op=hvd.Sum, ref_scale=float(size))
    run_variant("gradient_predivide_factor", gradient_predivide_factor=4.0)
    run_variant("groups=2", groups=2)
    gm = make_model(6)
    run_variant("groups list", groups=[[p for p in gm.parameters()][:2]])  # foreign params are ignored
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, opt = run_variant("no warning", steps=1)
        check("no warning by default", not any("skip_synchronize" in str(w.message) for w in caught))
        x, y = batch(50, B * size)
        opt.zero_grad()
        loss_fn(model(shard(x)), shard(y)).backward()
        opt.synchronize()
        opt.step()
        check("warning for step after synchronize",
              any("optimizer.step() called without optimizer.skip_synchronize()" in str(w.message)
                  for w in caught))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.DistributedOptimizer(torch.optim.SGD(make_model(6).parameters(), lr=0.1),
                                 num_groups=2).remove_hooks()
        check("num_groups deprecated", any(issubclass(w.category, DeprecationWarning) for w in caught))


def test_channels_last_gradients(rank, size):
    # channels_last conv: dense but not contiguous gradients are reduced in place
    torch.manual_seed(8)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    conv_ref = torch.nn.Conv2d(3, 4, 3)
    conv_ref.load_state_dict(conv.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(conv.parameters(), lr=0.1),
                                   named_parameters=conv.named_parameters())
    ref_opt = torch.optim.SGD(conv_ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(9)
    img = torch.randn(2 * size, 3, 6, 6, generator=g)
    opt.zero_grad()
    conv(shard(img).contiguous(memory_format=torch.channels_last)).square().mean().backward()
    check("channels_last grad is not contiguous", not conv.weight.grad.is_contiguous())
    opt.step()
    ref_opt.zero_grad()
    conv_ref(img).square().mean().backward()
    ref_opt.step()
    check("channels_last matches", close(conv.parameters(), conv_ref.parameters()))


def test_horovod_side_effects_and_user_compressor(rank, size):
    # A new optimizer's broadcast_optimizer_state leaves every trainable
    # parameter with a zero .grad (Horovod's dummy step does); frozen ones keep None.
    fresh = make_model(3)
    fresh[0].bias.requires_grad_(False)
    fresh_opt = hvd.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=fresh.named_parameters())
    before = [p.detach().clone() for p in fresh.parameters()]
    hvd.broadcast_optimizer_state(fresh_opt, root_rank=0, model=fresh)  # Horovod's model= is accepted
    check("broadcast_optimizer_state: zero grads for trainable parameters",
          all(p.grad is not None and not p.grad.any() for p in fresh.parameters() if p.requires_grad))
    check("broadcast_optimizer_state: frozen parameter keeps grad None", fresh[0].bias.grad is None)
    check("broadcast_optimizer_state: parameters untouched",
          all(torch.equal(a, b) for a, b in zip(before, fresh.parameters())))
    fresh_opt.remove_hooks()
    check("default names are unique", len(set(hvd.DistributedOptimizer(
        torch.optim.SGD([{"params": make_model(4)[0].parameters()},
                         {"params": make_model(5)[2].parameters()}], lr=0.1))
        ._parameter_names.values())) == 4)


    class ScaledCompressor(hvd.Compressor):
        """A user's compressor in Horovod's style: halves on the way out, doubles
        back; the front end applies it around an uncompressed allreduce."""
        calls = 0

        @staticmethod
        def compress(tensor):
            ScaledCompressor.calls += 1
            return tensor * 0.5, tensor.dtype

        @staticmethod
        def decompress(tensor, ctx):
            return (tensor * 2.0).to(ctx)


    run_variant("user compressor", compression=ScaledCompressor)
    check("user compressor was applied", ScaledCompressor.calls > 0)


def test_sparse_gradients(rank, size):
    for as_dense in (False, True):
        torch.manual_seed(11)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        emb_ref = torch.nn.Embedding(10, 3, sparse=True)
        emb_ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=as_dense)
        ref_opt = torch.optim.SGD(emb_ref.parameters(), lr=0.5)
        idx = torch.tensor([[1, 2, 3], [3, 4, 9]][:size] if size == 2 else [[r, r + 1, 9] for r in range(size)])
        opt.zero_grad()
        emb(idx[rank]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        sum(emb_ref(idx[r]).pow(2).mean() for r in range(size)).div(size).backward()
        ref_opt.step()
        check(f"sparse grads (as_dense={as_dense}) match", torch.allclose(emb.weight, emb_ref.weight, atol=1e-6))
        check(f"sparse grad stays sparse (as_dense={as_dense})", emb.weight.grad.is_sparse)
        check(f"sparse identical (as_dense={as_dense})", identical_everywhere([emb.weight]))


def test_grad_scaler(rank, size):
    model, ref = make_model(12), make_model(12)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(3):
        x, y = batch(60 + step, B * size)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(shard(x))
        loss = loss_fn(out.float(), shard(y))
        if step == 1 and rank == 0:
            loss = loss * float("inf")      # overflow on one rank only (inside backward, not racing)
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = [ref(shard_x) for shard_x in x.chunk(size)]
        ref_loss = sum(loss_fn(o.float(), t) for o, t in zip(outs, y.chunk(size))) / size
        ref_scaler.scale(ref_loss).backward()
        if step == 1:
            next(ref.parameters()).grad[0, 0] = float("inf")
        ref_scaler.unscale_(ref_opt)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        check(f"GradScaler step {step} identical", identical_everywhere(model.parameters()))
    check("GradScaler skipped the overflow step on every rank", scaler.get_scale() == ref_scaler.get_scale() == 1024.0 * 0.5 * 1)
    check("GradScaler matches", close(model.parameters(), ref.parameters(), 1e-4))


def test_lbfgs_closure_and_lr_scheduler(rank, size):
    model, ref = make_model(13), make_model(13)
    opt = hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=4)
    x, y = batch(70, B * size)


    def closure():
        opt.zero_grad()
        loss = loss_fn(model(shard(x)), shard(y))
        loss.backward()
        return loss


    def ref_closure():
        ref_opt.zero_grad()
        loss = loss_fn(ref(x), y)
        loss.backward()
        return loss


    for _ in range(2):
        opt.step(closure)
        ref_opt.step(ref_closure)
    check("LBFGS closure matches", close(model.parameters(), ref.parameters(), 1e-4))
    check("LBFGS identical", identical_everywhere(model.parameters()))

    model = make_model(14)
    plain = torch.optim.SGD(model.parameters(), lr=1.0)
    early_sched = torch.optim.lr_scheduler.StepLR(plain, step_size=1, gamma=0.5)  # before wrapping
    opt = hvd.DistributedOptimizer(plain, named_parameters=model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(2):
        x, y = batch(80 + step, B * size)
        opt.zero_grad()
        loss_fn(model(shard(x)), shard(y)).backward()
        opt.step()
        sched.step()
    check("scheduler lr", opt.param_groups[0]["lr"] == 0.25)
    check("scheduler made before wrapping does not bypass reduction", identical_everywhere(model.parameters()))


def test_process_set(rank, size):
    # A set of one rank (a set of all ranks is the global set): its member
    # averages over the set, the others keep their own gradients, as in Horovod;
    # both equal a model trained on this rank's shard alone.
    ps = hvd.add_process_set([0])
    model, ref = make_model(15), make_model(15)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=ps)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = batch(90, B * size)
    opt.zero_grad()
    loss_fn(model(shard(x)), shard(y)).backward()
    opt.step()
    ref_opt.zero_grad()
    loss_fn(ref(shard(x)), shard(y)).backward()
    ref_opt.step()
    check("process_set optimizer", close(model.parameters(), ref.parameters()))
    opt.remove_hooks()
    hvd.remove_process_set(ps)


def test_torch_compile(rank, size):
    model, ref = make_model(16), make_model(16)
    compiled = torch.compile(model, backend="aot_eager")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=compiled.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    step_both(compiled, opt, ref, ref_opt, 95, 3)
    check("torch.compile matches", close(model.parameters(), ref.parameters()))
    check("torch.compile identical", identical_everywhere(model.parameters()))


def test_overlap(rank, size):


    class SlowBackward(torch.autograd.Function):
        """Identity whose backward takes a while (an expensive early layer)."""
        seen = {}

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            # Gradients of every layer after this point are final by now, and
            # their allreduces were handed to the engine by the hooks: the
            # engine completes them while this backward still runs (nothing
            # calls step() or synchronize() until it returns).
            SlowBackward.seen["enqueued"] = {name for p, name in names.items()
                                             if p in opt._handles and opt._handles[p][0] is not None}
            late = [opt._handles[p][0] for p in late_params if p in opt._handles]
            late = [h for h in late if h is not None]
            while not all(h.poll() for h in late):
                time.sleep(0.002)
            SlowBackward.seen["done_at"] = time.monotonic()
            SlowBackward.seen["late_done"] = len(late) == len(late_params)
            time.sleep(0.05)        # the rest of this layer's backward
            return g


    torch.manual_seed(17)
    layers = [torch.nn.Linear(64, 64) for _ in range(4)]
    model = torch.nn.Sequential(*layers)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    names = {p: n for n, p in model.named_parameters()}
    late_params = list(layers[1].parameters()) + list(layers[2].parameters()) + list(layers[3].parameters())
    x = torch.randn(8, 64)
    timeline_dir = hvd.broadcast_object(tempfile.mkdtemp() if rank == 0 else None, root_rank=0)
    hvd.start_timeline(os.path.join(timeline_dir, "tl-%r.json"))
    opt.zero_grad()
    out = layers[0](x)
    out = SlowBackward.apply(out)
    for layer in layers[1:]:
        out = layer(out)
    out.square().mean().backward()
    backward_end = time.monotonic()
    backward_end_us = time.time() * 1e6
    first_layer_enqueued = all(opt._handles[p][0] is not None for p in layers[0].parameters())
    opt.step()
    seen = SlowBackward.seen
    check("late layers enqueued during backward",
          seen["enqueued"] == {names[p] for p in late_params}, str(seen["enqueued"]))
    check("late layers reduced before backward finished",
          seen["late_done"] and seen["done_at"] < backward_end)
    check("first layer enqueued by the end of backward", first_layer_enqueued)
    # The engine's own record (timestamps are epoch microseconds): the reductions
    # of the late layers' gradients ended before backward did.
    hvd.stop_timeline()
    events = hvdlite.timeline.load(os.path.join(timeline_dir, f"tl-{rank}.json"))
    # Event times count from the timeline's start (epoch microseconds).
    timeline_start_us = hvdlite.timeline.start_time_us(events)
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    mpi_end = {}
    for e in events:
        if e.get("name") in ("MPI_ALLREDUCE", "SHM_ALLREDUCE") and e.get("ph") == "E":
            mpi_end[rows.get(e["tid"], "")] = timeline_start_us + e["ts"]
    late_names = {names[p] for p in late_params}
    found = {n: t for row, t in mpi_end.items() for n in late_names if row.endswith(n)}
    check("timeline has the late layers' MPI_/SHM_ALLREDUCE", set(found) == late_names, str(sorted(mpi_end)))
    check("timeline: late layers reduced before backward ended",
          all(t < backward_end_us for t in found.values()),
          f"{max(found.values()) - backward_end_us:.0f} us after")
    hvd.barrier()
    if rank == 0:
        shutil.rmtree(timeline_dir, ignore_errors=True)


def test_compression(rank, size):
    """fp16 and top-k (ratio 1) on the wire: training close to the reference
    on the combined batch (both compressors are always built in)."""
    got = hvd.allreduce(torch.full((2,), rank + 1.5), op=hvd.Sum, compression=hvd.Compression.fp16)
    check("fp16 allreduce", torch.equal(got, torch.full((2,), sum(r + 1.5 for r in range(size)))), f"{got}")
    for comp, tol in [(hvd.Compression.fp16, 2e-3), (hvd.Compression.topk(1.0), 1e-5)]:
        model, ref = make_model(18), make_model(18)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=comp)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(2):
            x, y = batch(120 + step, B * size)
            opt.zero_grad()
            loss_fn(model(shard(x)), shard(y)).backward()
            opt.step()
            ref_opt.zero_grad()
            loss_fn(ref(x), y).backward()
            ref_opt.step()
        check(f"{comp} close to reference", close(model.parameters(), ref.parameters(), tol))
        check(f"{comp} identical", identical_everywhere(model.parameters()))


def test_momentum_correction_takes_the_optimizers_momentum(rank, size):
    """Compression.topk(1.0, momentum_correction=True): the engine applies the
    SGD's momentum before top-k and the optimizer's own is set to 0. At ratio
    1 everything is sent, so it is momentum SGD on the combined batch."""
    model, ref = make_model(19), make_model(19)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.topk(1.0, momentum_correction=True))
    check("the optimizer's momentum moved to the engine",
          all(g["momentum"] == 0.0 for g in opt.param_groups) and sgd.param_groups[0]["momentum"] == 0.0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    step_both(model, opt, ref, ref_opt, 140, 4)
    check("momentum SGD, moved into the engine", close(model.parameters(), ref.parameters(), 1e-5))
    check("identical on all ranks", identical_everywhere(model.parameters()))
    for bad, words in [(torch.optim.SGD(make_model(1).parameters(), lr=0.1, momentum=0.9, nesterov=True),
                        "Nesterov"),
                       (torch.optim.Adam(make_model(1).parameters()), "has none")]:
        try:
            hvd.DistributedOptimizer(bad, compression=hvd.Compression.topk(0.01, momentum_correction=True))
            check(f"refused: {words}", False)
        except hvdlite.InvalidArgumentError as e:
            check(f"refused: {words}", words in str(e))


def test_join_with_uneven_data(rank, size):
    """Ranks run out of data at different steps: a joined rank contributes
    zeros to the others' reductions until every rank has joined. Each step's
    gradient is the sum of the active ranks' gradients over ``size``; each
    rank's parameters follow that trajectory for its own number of steps."""
    steps_of = [2 + 2 * r for r in range(size)]  # the last rank has the most data and joins last
    inputs = [torch.ones(5, 4) * (r + 1) for r in range(size)]

    def fresh():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 3)

    def local_grads(state, r):
        twin = fresh()                    # no hooks: rank r's own gradient at ``state``
        twin.load_state_dict(state)
        twin(inputs[r]).square().mean().backward()
        return [p.grad.clone() for p in twin.parameters()]

    # The reference on every rank: the step of each rank still active.
    ref = fresh()
    ref_sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    trajectory, expected_grads = [], []
    for step in range(max(steps_of)):
        active = [r for r in range(size) if step < steps_of[r]]
        grads = [local_grads(ref.state_dict(), r) for r in active]
        expected_grads.append([sum(g[i] for g in grads) / size for i in range(len(grads[0]))])
        for p, g in zip(ref.parameters(), expected_grads[-1]):
            p.grad = g.clone()
        ref_sgd.step()
        trajectory.append([p.detach().clone() for p in ref.parameters()])

    model = fresh()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(steps_of[rank]):
        opt.zero_grad()
        model(inputs[rank]).square().mean().backward()
        opt.synchronize()
        active = sum(1 for r in range(size) if step < steps_of[r])
        check(f"step {step}: sum over the {active} active ranks / {size}",
              close([p.grad for p in model.parameters()], expected_grads[step]),
              f"{[p.grad for p in model.parameters()]} {expected_grads[step]}")
        with opt.skip_synchronize():
            opt.step()
    check(f"parameters after this rank's {steps_of[rank]} steps",
          close(model.parameters(), trajectory[steps_of[rank] - 1]))
    last = hvd.join()
    check("join() returns the last rank to join", last == size - 1, f"{last}")
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    check("every rank has the last rank's trained parameters",
          close(model.parameters(), trajectory[-1]))
    check("allreduce after join", hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size)
