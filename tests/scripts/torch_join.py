"""hvdlite.torch.join with DistributedOptimizer: ranks run out of data at
different steps; a joined rank contributes zeros to the others' reductions
until every rank has joined. Run on 2 or 3 ranks."""
import sys

import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
steps = 2 + 2 * R                     # rank N-1 has the most data and joins last
x = torch.ones(5, 4) * (R + 1)
twin = torch.nn.Linear(4, 3)          # no hooks: this rank's own gradient
for step in range(steps):
    twin.load_state_dict(model.state_dict())
    twin.zero_grad()
    twin(x).square().mean().backward()
    local = [p.grad for p in twin.parameters()]
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.synchronize()
    active = sum(1 for r in range(N) if step < 2 + 2 * r)
    if active < N:
        # The ranks that joined sent zeros: the average is over all N ranks.
        for p, g in zip(model.parameters(), local):
            assert torch.allclose(p.grad * N, g * active) or active > 1, \
                (step, p.grad, g, active)
    with opt.skip_synchronize():
        opt.step()
last = hvd.join()
assert last == N - 1, f"rank {R}: join() returned {last}, expected {N - 1}"
# Everyone is back in lockstep: collectives and broadcasts work again.
hvd.broadcast_parameters(model.state_dict(), root_rank=last)
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0))
assert all(torch.equal(gathered[0], gathered[r]) for r in range(N))
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == N
print(f"RANK {R} OK")
sys.stdout.flush()
