"""LocalSGD and DiLoCo on real ranks, against a NumPy simulation of every rank.

Each rank r minimises its own quadratic, 0.5 * c_r * |p - T_r|^2 per
parameter tensor, so its gradient c_r * (p - T_r) is known in closed form
and the NumPy reference can run all ranks' local steps, the averages and the
outer Nesterov steps itself.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 and 4 ranks.
"""
import copy
import time

import numpy as np

from harness.checks import check, check_close, expect, require
from quantize_reference import QuantizeReference, wire_bytes

torch = require("torch")

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)

SHAPES = [(4, 3), (3,), (5,)]
LR, MOMENTUM = 0.1, 0.9
OUTER_LR, OUTER_MOMENTUM = 1.0, 0.5   # the documented defaults


def targets(r):
    rng = np.random.default_rng(100 + r)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def weight(r):
    return np.float32(1.0 + 0.5 * r)


def initial():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


class Quad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b, self.v = (torch.nn.Parameter(torch.from_numpy(a)) for a in initial())


def local_step(model, opt, r):
    opt.zero_grad()
    c = float(weight(r))
    loss = sum(0.5 * c * ((p - torch.from_numpy(t)) ** 2).sum()
               for p, t in zip(model.parameters(), targets(r)))
    loss.backward()
    opt.step()


def params_of(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


def all_equal(arrays_per_rank):
    first = arrays_per_rank[0]
    return all(all(np.array_equal(a, b) for a, b in zip(first, other))
               for other in arrays_per_rank[1:])


class NpSGD:
    """torch.optim.SGD's update (dampening 0) on NumPy arrays."""

    def __init__(self, n, lr, momentum=0.0, nesterov=False):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.buf = [None] * n

    def step(self, params, grads, which=None):
        for i in (range(len(params)) if which is None else which):
            g = grads[i]
            if self.momentum:
                self.buf[i] = g.copy() if self.buf[i] is None else \
                    np.float32(self.momentum) * self.buf[i] + g
                g = g + np.float32(self.momentum) * self.buf[i] if self.nesterov else self.buf[i]
            params[i] = params[i] - np.float32(self.lr) * g


def np_grads(params, r):
    return [weight(r) * (p - t) for p, t in zip(params, targets(r))]


def check_rank_params(what, got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        check_close(g, w, f"{what}: parameter {i}", rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- LocalSGD

def test_local_sgd_averages_every_h_steps(rank, size):
    H, steps = 3, 7
    model = Quad()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                       sync_every=H, model=model)
    ref = [initial() for _ in range(size)]
    ref_opts = [NpSGD(len(SHAPES), LR, MOMENTUM) for _ in range(size)]
    for t in range(1, steps + 1):
        local_step(model, opt, rank)
        for r in range(size):
            ref_opts[r].step(ref[r], np_grads(ref[r], r))
        if t % H == 0:
            mean = [sum(ref[r][i] for r in range(size)) / np.float32(size)
                    for i in range(len(SHAPES))]
            ref = [[m.copy() for m in mean] for _ in range(size)]
        everyone = hvd.allgather_object(params_of(model))
        check(f"step {t}: parameters equal across ranks exactly after a sync, different between "
              "syncs", all_equal(everyone) == (t % H == 0))
        check_rank_params(f"step {t}", params_of(model), ref[rank])


def test_local_sgd_averages_buffers(rank, size):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR), sync_every=2, model=model,
                       sync_buffers=True)
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([rank, 2.0 * rank]))
        bn.running_var.fill_(1.0 + rank)
        bn.num_batches_tracked.fill_(5)
    opt.synchronize()
    mean_rank = (size - 1) / 2
    check_close(bn.running_mean.numpy(), np.array([mean_rank, 2 * mean_rank], np.float32),
                "running_mean averaged", rtol=1e-6)
    check_close(bn.running_var.numpy(), np.full(2, 1 + mean_rank, np.float32),
                "running_var averaged", rtol=1e-6)
    check("num_batches_tracked untouched", int(bn.num_batches_tracked) == 5)


def test_local_sgd_on_a_process_set(rank, size):
    members = [0, 1]
    ps = hvd.add_process_set(members) if size > 2 else hvd.global_process_set
    try:
        model = Quad()
        if rank not in members:
            expect(ValueError, lambda: hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR),
                                                    sync_every=2, process_set=ps),
                   "not in", "build it only on the ranks of the process set")
            everyone = hvd.allgather_object(None)
        else:
            opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR), sync_every=2,
                               process_set=ps, name="local_sgd.ps")
            for _ in range(2):
                local_step(model, opt, rank)
            ref = []
            for r in members:
                p = initial()
                for _ in range(2):
                    NpSGD(len(SHAPES), LR).step(p, np_grads(p, r))
                ref.append(p)
            mean = [(a + b) / np.float32(2) for a, b in zip(*ref)]
            check_rank_params("averaged over the set", params_of(model), mean)
            everyone = hvd.allgather_object(params_of(model))
        check("the set's ranks are equal", all_equal([everyone[r] for r in members]))
    finally:
        if size > 2:
            hvd.remove_process_set(ps)


# ---------------------------------------------------------------- DiLoCo

def np_split(diloco, fragments):
    """The fragments' pieces and offsets DiLoCo chose, checked to cut the
    parameters' elements, in order, into runs of equal size (to one element)."""
    pieces = diloco.fragment_pieces
    flat = [(i, e) for frag in pieces for i, a, b in frag for e in range(a, b)]
    want = [(i, e) for i, shape in enumerate(SHAPES) for e in range(int(np.prod(shape)))]
    check("fragments cover every element once, in order", flat == want, str(pieces))
    sizes = [sum(b - a for _, a, b in frag) for frag in pieces]
    check(f"{fragments} fragments of equal size", len(sizes) == fragments and
          max(sizes) - min(sizes) <= 1, str(sizes))
    return pieces, diloco.offsets


def piece(array, first, end):
    return array.reshape(-1)[first:end]


class NpPieceSGD:
    """torch.optim.SGD's update (dampening 0) on pieces of NumPy arrays,
    a momentum buffer per piece."""

    def __init__(self, lr, momentum, nesterov):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.buf = {}

    def step(self, params, pieces, grads):
        for (i, a, b), g in zip(pieces, grads):
            buf = self.buf.get((i, a))
            buf = g.copy() if buf is None else np.float32(self.momentum) * buf + g
            self.buf[(i, a)] = buf
            g = g + np.float32(self.momentum) * buf if self.nesterov else buf
            p = params[i].reshape(-1).copy()
            p[a:b] = p[a:b] - np.float32(self.lr) * g
            params[i] = p.reshape(params[i].shape)


def run_diloco_against_reference(rank, size, H, fragments, overlap, steps, compression=None,
                                 tol=1e-5):
    model = Quad()
    kwargs = {} if compression is None else {"compression": compression}
    diloco = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=LR), sync_every=H,
                        fragments=fragments, overlap_steps=overlap, **kwargs)
    frags, offsets = np_split(diloco, fragments)
    check("offsets are f*H//F", offsets == [f * H // fragments for f in range(fragments)],
          str(offsets))
    ref = [initial() for _ in range(size)]
    anchor = initial()
    outer = NpPieceSGD(OUTER_LR, OUTER_MOMENTUM, nesterov=True)
    quantized = None    # every rank's quantizer, residuals kept per reduction name
    if isinstance(compression, hvdlite.compression.QuantizeCompressor):
        quantized = QuantizeReference(size, compression.bits, compression.block_size,
                                      compression.rounding == "stochastic", compression.seed,
                                      compression.error_feedback)
    pending = {}    # fragment -> (due step, averaged outer gradient)
    synced_at = []
    for t in range(1, steps + 1):
        local_step(model, diloco, rank)
        for r in range(size):
            NpSGD(len(SHAPES), LR).step(ref[r], np_grads(ref[r], r))
        finished = []

        def outer_step(f):
            """The outer step of fragment f's pending gradient; every rank takes the anchor."""
            _, g = pending.pop(f)
            outer.step(anchor, frags[f], g)
            for r in range(size):
                for i, a, b in frags[f]:
                    piece(ref[r][i], a, b)[:] = piece(anchor[i], a, b)
            finished.append(f)

        for f in sorted(f for f, (due, _) in pending.items() if due <= t):
            outer_step(f)
        for f in range(fragments):
            if t > offsets[f] and (t - offsets[f]) % H == 0:
                g = []
                for j, (i, a, b) in enumerate(frags[f]):
                    deltas = [piece(anchor[i], a, b) - piece(ref[r][i], a, b) for r in range(size)]
                    if quantized is not None:   # the grouped reduction's j-th tensor
                        g.append(quantized.reduce(deltas, f"diloco.fragment{f}.{j}", average=True))
                        continue
                    if compression is hvd.Compression.fp16:
                        deltas = [d.astype(np.float16).astype(np.float32) for d in deltas]
                    g.append(sum(deltas) / np.float32(size))
                pending[f] = (t + overlap, g)
                if overlap == 0:
                    outer_step(f)
        synced_at += [(t, f) for f in finished]
        mine = params_of(model)
        for i, (g, w) in enumerate(zip(mine, ref[rank])):
            check_close(g, w, f"step {t}: parameter {i}", rtol=tol, atol=tol)
        for i, (g, w) in enumerate(zip(diloco.anchor, anchor)):
            check_close(g.numpy(), w, f"step {t}: anchor {i}", rtol=tol, atol=tol)
        everyone = hvd.allgather_object(mine)
        for f in finished:
            check(f"step {t}: fragment {f} equal on every rank after its outer step",
                  all(np.array_equal(piece(everyone[0][i], a, b), piece(e[i], a, b))
                      for e in everyone for i, a, b in frags[f]))
    check("every fragment had outer steps", {f for _, f in synced_at} == set(range(fragments)),
          str(synced_at))
    return synced_at


def test_diloco_outer_nesterov_matches_reference(rank, size):
    synced = run_diloco_against_reference(rank, size, H=3, fragments=1, overlap=0, steps=7)
    check("outer steps after steps 3 and 6", synced == [(3, 0), (6, 0)], str(synced))


def test_streaming_diloco_two_fragments_overlapped(rank, size):
    # H=4, F=2: fragment 0 starts after steps 4, 8, 12; fragment 1 after 6, 10;
    # each finishes one inner step later.
    synced = run_diloco_against_reference(rank, size, H=4, fragments=2, overlap=1, steps=13)
    check("staggered, overlapped outer steps", synced == [(5, 0), (7, 1), (9, 0), (11, 1), (13, 0)],
          str(synced))


def test_diloco_fp16_compressed_outer_gradient(rank, size):
    before = hvdlite.engine_stats()["wire_bytes_fp16"]
    run_diloco_against_reference(rank, size, H=3, fragments=1, overlap=0, steps=6,
                                 compression=hvd.Compression.fp16, tol=2e-3)
    check("the outer gradients crossed the wire as fp16",
          hvdlite.engine_stats()["wire_bytes_fp16"] > before)


def test_diloco_4bit_quantized_outer_gradient(rank, size):
    """Streaming DiLoCo's 4-bit outer gradients (rounding to nearest, error
    feedback per fragment tensor) against the simulation quantizing every
    rank's outer gradient as the engine does; 4 bits and a scale per block
    on the wire."""
    before = hvdlite.engine_stats()["wire_bytes_quantize"]
    synced = run_diloco_against_reference(rank, size, H=4, fragments=2, overlap=1, steps=13,
                                          compression=hvd.Compression.quantize())
    sent = hvdlite.engine_stats()["wire_bytes_quantize"] - before
    # 20 elements cut 10 / 10: the first 10 of the (4, 3) tensor; its last 2, then (3,) and (5,).
    per_sync = {0: wire_bytes(10), 1: wire_bytes(2) + wire_bytes(3) + wire_bytes(5)}
    check("each sync sent its fragment's 4-bit form", sent == sum(per_sync[f] for _, f in synced),
          f"({sent} bytes for syncs {synced})")


def test_diloco_synchronize_after_a_full_sync_keeps_the_anchor(rank, size):
    model = Quad()
    diloco = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=LR), sync_every=2)
    for _ in range(4):     # synced after steps 2 and 4: nothing moved since
        local_step(model, diloco, rank)
    before = [a.detach().numpy().copy() for a in diloco.anchor]
    diloco.synchronize()
    check("the anchor did not move (no outer step on a zero gradient)",
          all(np.array_equal(b, a.detach().numpy()) for b, a in zip(before, diloco.anchor)))
    check("parameters are the anchor", all(np.array_equal(p, a.detach().numpy())
                                           for p, a in zip(params_of(model), diloco.anchor)))


def test_diloco_synchronize_makes_ranks_equal(rank, size):
    model = Quad()
    diloco = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=LR), sync_every=4,
                        fragments=2)
    for _ in range(6):     # fragment 1 in flight after step 6
        local_step(model, diloco, rank)
    check("a sync in flight", bool(diloco._pending))
    diloco.synchronize()
    everyone = hvd.allgather_object(params_of(model))
    check("equal parameters on every rank after synchronize()", all_equal(everyone))
    check("parameters are the anchor", all(np.array_equal(p, a.numpy())
                                           for p, a in zip(params_of(model), diloco.anchor)))


def diloco_setup(rank, momentum=MOMENTUM):
    model = Quad()
    diloco = hvd.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum),
                        sync_every=4, fragments=2)
    return model, diloco


def snapshot(model, diloco):
    return (params_of(model), [a.numpy().copy() for a in diloco.anchor],
            [opt.state[a]["momentum_buffer"].numpy().copy()
             for opt, views in zip(diloco.outer_optimizers, diloco.anchor_pieces) for a in views
             if a in opt.state],
            diloco.local_step)


def same_snapshot(a, b):
    return all(all(np.array_equal(x, y) for x, y in zip(u, v)) for u, v in zip(a[:3], b[:3])) \
        and len(a[2]) == len(b[2]) and a[3] == b[3]


def first_run(rank, saved_at, steps=6):
    """A DiLoCo model run ``saved_at`` steps, its states saved there, then
    ``steps`` more: (model, diloco, saved DiLoCo state, saved parameters,
    the snapshot after each of the later steps)."""
    model, diloco = diloco_setup(rank)
    for _ in range(saved_at):
        local_step(model, diloco, rank)
    saved = copy.deepcopy(diloco.state_dict())
    saved_params = copy.deepcopy(model.state_dict())
    first = []
    for _ in range(steps):
        local_step(model, diloco, rank)
        first.append(snapshot(model, diloco))
    return model, diloco, saved, saved_params, first


def test_diloco_state_dict_round_trip_replays_exactly(rank, size):
    model, diloco, saved, saved_params, first = first_run(rank, 5)   # after step 5 no sync is in flight
    model.load_state_dict(saved_params)
    diloco.load_state_dict(saved)
    for t in range(6):
        local_step(model, diloco, rank)
        check(f"replayed step {t + 6} equals the first run",
              same_snapshot(snapshot(model, diloco), first[t]))


def test_diloco_state_loaded_with_a_sync_in_flight(rank, size):
    """load_state_dict while a fragment's reduction is still in flight (rank 1
    issues its part 0.5 s late): the dropped sync ends before the fragment's
    next sync reuses its name, and the replay equals the first run."""
    model, diloco, saved, saved_params, first = first_run(rank, 3)
    # (a copy each time: torch's optimizer keeps the loaded state's tensors and steps them)
    model.load_state_dict(saved_params)
    diloco.load_state_dict(copy.deepcopy(saved))
    if rank == 1:
        time.sleep(0.5)
    local_step(model, diloco, rank)   # step 4 starts fragment 0's sync
    check("fragment 0's sync is in flight after step 4", list(diloco._pending) == [0])
    model.load_state_dict(saved_params)
    diloco.load_state_dict(copy.deepcopy(saved))
    check("loading a state drops the sync in flight", diloco._pending == {})
    for t in range(6):
        local_step(model, diloco, rank)
        check(f"replayed step {t + 4} equals the first run", same_snapshot(snapshot(model, diloco), first[t]))


def test_torch_state_commit_restore_and_sync_diloco(rank, size):
    model, diloco = diloco_setup(rank)
    state = hvd.elastic.TorchState(model, optimizer=diloco, epoch=0)
    for _ in range(9):
        local_step(model, diloco, rank)
    committed = snapshot(model, diloco)
    check("the outer optimizer has momentum to keep, one buffer per anchor piece",
          len(committed[2]) == sum(len(views) for views in diloco.anchor_pieces) == 4)
    state.commit()
    for _ in range(5):
        local_step(model, diloco, rank)
    check("training moved on", not same_snapshot(snapshot(model, diloco), committed))
    state.restore()
    check("restore: parameters, anchor, outer momentum and step are the committed ones",
          same_snapshot(snapshot(model, diloco), committed))
    # Different anchors and steps on every rank: sync makes them rank 0's.
    with torch.no_grad():
        for a in diloco.anchor:
            a.add_(float(rank))
    diloco.local_step += rank
    state.sync()
    everyone = hvd.allgather_object(snapshot(model, diloco))
    check("sync: every rank has rank 0's anchor, outer state and step",
          all(same_snapshot(e, everyone[0]) for e in everyone))


def test_local_sgd_state_in_torch_state(rank, size):
    model = Quad()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), sync_every=2)
    state = hvd.elastic.TorchState(model, optimizer=opt)
    for _ in range(3):
        local_step(model, opt, rank)
    state.commit()
    params, step = params_of(model), opt.local_step
    for _ in range(2):
        local_step(model, opt, rank)
    state.restore()
    check("restore: parameters and step count",
          all(np.array_equal(a, b) for a, b in zip(params_of(model), params))
          and opt.local_step == step == 3)


def test_bad_arguments_say_what_to_do(rank, size):
    model = Quad()

    def inner():
        return torch.optim.SGD(model.parameters(), lr=LR)
    expect(ValueError, lambda: hvd.LocalSGD(inner(), sync_every=0), "sync_every must be an int >= 1")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), sync_every=0), "sync_every must be")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), sync_every=30, fragments=21),
           "fragments=21", "only 20 trainable elements", "fragments <= 20")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), sync_every=2, fragments=3),
           "use fragments <= sync_every")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), sync_every=4, overlap_steps=4),
           "overlap_steps must be an int in [0, sync_every)")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), outer_optimizer=inner()),
           "outer_optimizer must be None or a callable", "lambda params")
    dist = hvd.DistributedOptimizer(inner(), named_parameters=model.named_parameters())
    expect(ValueError, lambda: hvd.DiLoCo(model, dist), "pass the plain torch optimizer")
    dist.remove_hooks()
    expect(ValueError, lambda: hvd.LocalSGD(inner(), sync_every=2, sync_buffers=True),
           "sync_buffers=True needs model=")
    expect(ValueError, lambda: hvd.DiLoCo(model, torch.optim.SGD([model.w], lr=LR)),
           "does not optimize", "b, v")
    expect(ValueError, lambda: hvd.DiLoCo(model, inner(), compression="fp16"),
           "compression must be one of hvdlite's Compression")
    strided = Quad()
    strided.w.data = strided.w.data.t().contiguous().t()      # (4, 3), column-major
    expect(ValueError, lambda: hvd.DiLoCo(strided, torch.optim.SGD(strided.parameters(), lr=LR),
                                          sync_every=4, fragments=2),
           "cuts the non-contiguous parameter(s) w", "contiguous()")
