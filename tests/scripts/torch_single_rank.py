"""One rank: hvdlite.torch is plain torch (collectives are identities, the
optimizer adds no hooks), and `import hvdlite` alone does not import torch."""
import subprocess
import sys

out = subprocess.run([sys.executable, "-c", "import sys, hvdlite; print('torch' in sys.modules)"],
                     capture_output=True, text=True, check=True).stdout.strip()
assert out == "False", "import hvdlite must not import torch"

import torch  # noqa: E402

import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)
hvd.init()
assert hvd.size() == 1 and hvd.rank() == 0
x = torch.randn(3, 4)
assert torch.equal(hvd.allreduce(x), x)
assert torch.equal(hvd.allgather(x), x)
assert torch.equal(hvd.broadcast(x, 0), x)
assert torch.equal(hvd.alltoall(x), x)
assert torch.equal(hvd.reducescatter(x), x)
assert hvd.broadcast_object({"a": 1}) == {"a": 1}
assert hvd.allgather_object(5) == [5]

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
ref = torch.nn.Linear(4, 2)
ref.load_state_dict(model.state_dict())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
assert not opt._hook_handles, "no hooks on one rank"
for _ in range(3):
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
bn = hvd.SyncBatchNorm(4)
ref_bn = torch.nn.BatchNorm1d(4)
assert torch.allclose(bn(x), ref_bn(x))
print("RANK 0 OK")
