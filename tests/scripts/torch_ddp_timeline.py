"""A DDP script on the "hvdlite" backend for the timeline test
(tests/test_torch_distributed.py): run it with HVDLITE_TIMELINE set; it
trains ``argv[1]`` steps of a model whose rebuilt buckets are one layer each
(two of the same size in a row) and prints the parameter count."""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hvdlite.torch  # noqa: F401  (registers the backend)

torch.set_num_threads(1)
steps = int(sys.argv[1])
dist.init_process_group(backend="hvdlite")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                            torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 4))
ddp = DistributedDataParallel(model, bucket_cap_mb=0.0001)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(steps):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    opt.zero_grad()
print(f"PARAMS {sum(p.numel() for p in model.parameters())}", flush=True)
dist.destroy_process_group()
print(f"RANK {rank} OK", flush=True)
