"""One job of the train step (6 x Linear(2048, 2048), batch 64 per rank, the Horovod API)
with the engine's timeline on every rank, for step_timeline_read.py: each rank writes the
wall-clock moments of its step (start, forward done, its allreduces waited for, optimizer
done) beside its timeline.

    HVDLITE_TIMELINE=DIR/hvd-%r.json hvdrun -np 4 -H ... python step_timeline.py DIR [STEPS]
"""
import json
import sys
import time

import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
x, y = torch.randn(64, 2048), torch.randn(64, 2048)
marks = []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 14):
    start = time.time()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    forward = time.time()
    loss.backward()
    opt.synchronize()
    reduced = time.time()
    with opt.skip_synchronize():
        opt.step()
    marks.append((start, forward, reduced, time.time()))
with open("%s/marks-%d.json" % (sys.argv[1], hvd.rank()), "w") as f:
    json.dump(marks, f)
hvd.shutdown()
