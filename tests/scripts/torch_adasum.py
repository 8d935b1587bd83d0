"""op=Adasum through hvdlite.torch: allreduce on torch tensors, and
DistributedOptimizer(op=Adasum), Horovod's delta optimizer, against a NumPy
reference (engine_adasum.py's, Horovod's tree written out in float64); the
digits example trains with --op adasum.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 and 4 ranks.
"""
import os
import sys

import numpy as np
import pytest

from adasum_reference import adasum_tree
from harness.checks import check, expect, require

torch = require("torch")

import hvdlite.torch as hvd  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
torch.set_num_threads(1)


def grads_of(rank, shape, salt):
    """Rank-dependent gradients sharing a direction, so the Adasum coefficients
    are far from 1 (a plain sum or average would not pass)."""
    shared = torch.randn(shape, generator=torch.Generator().manual_seed(salt), dtype=torch.float64)
    own = torch.randn(shape, generator=torch.Generator().manual_seed(1000 * salt + rank),
                      dtype=torch.float64)
    return (rank + 1) * (shared + own)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12), (torch.float16, 2e-3)],
                         ids=["float32", "float64", "float16"])
def test_allreduce(rank, size, dtype, tol):
    xs = [grads_of(r, (5, 7), 1) for r in range(size)]
    want = adasum_tree([x.to(dtype).double().numpy() for x in xs]).reshape(5, 7)
    got = hvd.allreduce(xs[rank].to(dtype), op=hvd.Adasum, name=f"ada.{dtype}")
    err = float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())
    check(f"allreduce Adasum {dtype}", got.dtype == dtype and err < tol, f"error {err}")


def test_allreduce_async_in_place(rank, size):
    xs = [grads_of(r, (5, 7), 1) for r in range(size)]
    h = hvd.allreduce_async_(xs[rank].float().clone(), op=hvd.Adasum, name="ada.inplace")
    check("allreduce_async_ Adasum", np.allclose(hvd.synchronize(h).double().numpy(),
                                                 adasum_tree([x.float().double().numpy() for x in xs])
                                                 .reshape(5, 7), rtol=1e-5, atol=1e-5))


# ---------------------------------------------------------------- delta optimizer

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def data(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def local_update(model, opt_state, x, y, lr, momentum):
    """One rank's plain SGD(+momentum) update, computed locally: returns the
    deltas (what that rank's optimizer would change) and its new momentum."""
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    deltas, new_state = [], []
    for p, buf in zip(model.parameters(), opt_state):
        g = p.grad.detach().double()
        buf = g if buf is None else momentum * buf + g
        new_state.append(buf)
        deltas.append((-lr * buf).numpy())
    return deltas, new_state


LR, MOMENTUM = 0.3, 0.9


def adasum_optimizer(model):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                    named_parameters=model.named_parameters(), op=hvd.Adasum)


def test_delta_optimizer_matches_reference(rank, size):
    """Every rank's parameters equal the reference after each step: the
    reference replays every rank's optimizer from the same starting model and
    combines their deltas with Adasum."""
    model = make_model()
    opt = adasum_optimizer(model)
    check("isinstance SGD", isinstance(opt, torch.optim.SGD))
    ref = [p.detach().double().clone() for p in model.parameters()]
    ref_momentum = [[None] * len(ref) for _ in range(size)]
    shadow = make_model().double()
    for step in range(4):
        x, y = data(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        per_rank = []
        for r in range(size):
            with torch.no_grad():
                for sp, rp in zip(shadow.parameters(), ref):
                    sp.copy_(rp)
            xr, yr = data(r, step)
            deltas, ref_momentum[r] = local_update(shadow, ref_momentum[r], xr.double(), yr, LR, MOMENTUM)
            per_rank.append(deltas)
        for i in range(len(ref)):
            combined = adasum_tree([per_rank[r][i] for r in range(size)]).reshape(ref[i].shape)
            ref[i] = ref[i] + torch.from_numpy(combined)
        err = max(float((p.detach().double() - q).abs().max()) for p, q in zip(model.parameters(), ref))
        check(f"delta optimizer step {step} matches the reference", err < 1e-5, f"error {err}")
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = hvd.allgather(flat.unsqueeze(0), name="ada.identical")
        check(f"parameters identical on all ranks after step {step}",
              all(torch.equal(everyone[0], everyone[r]) for r in range(size)))


def test_skip_synchronize_refused(rank, size):
    opt = adasum_optimizer(make_model())

    def skip():
        with opt.skip_synchronize():
            pass
    expect(hvd.OptimizerMisuseError, skip, "Adasum")


def test_digits_trains(rank, size):
    require("sklearn")
    import pytorch_digits
    result = pytorch_digits.train(pytorch_digits.parse_args(["--op", "adasum", "--epochs", "12", "--json"]))
    print(f"ADASUM DIGITS {size} ranks: test accuracy {result['test_accuracy']}%")
    check("digits trains with op=Adasum", result["test_accuracy"] >= 95.0, str(result))
