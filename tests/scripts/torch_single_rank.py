"""One rank: hvdlite.torch is plain torch (collectives are identities, the
optimizer adds no hooks), and `import hvdlite` alone does not import torch.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it on 1 rank.
"""
import subprocess
import sys

from harness.checks import check, require

torch = require("torch")

import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)


def test_import_hvdlite_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, hvdlite; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    check("import hvdlite must not import torch", out == "False", out)


def test_collectives_are_identities(rank, size):
    check("one rank", size == 1 and rank == 0)
    x = torch.randn(3, 4)
    check("allreduce", torch.equal(hvd.allreduce(x), x))
    check("allgather", torch.equal(hvd.allgather(x), x))
    check("broadcast", torch.equal(hvd.broadcast(x, 0), x))
    check("alltoall", torch.equal(hvd.alltoall(x), x))
    check("reducescatter", torch.equal(hvd.reducescatter(x), x))
    check("broadcast_object", hvd.broadcast_object({"a": 1}) == {"a": 1})
    check("allgather_object", hvd.allgather_object(5) == [5])


def test_optimizer_is_plain_sgd(rank, size):
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    check("no hooks on one rank", not opt._hook_handles)
    for _ in range(3):
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    check("same parameters as plain SGD", all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters())))


def test_sync_batch_norm_is_batch_norm(rank, size):
    x = torch.randn(3, 4)
    bn = hvd.SyncBatchNorm(4)
    ref_bn = torch.nn.BatchNorm1d(4)
    check("SyncBatchNorm equals BatchNorm1d", torch.allclose(bn(x), ref_bn(x)))
