"""step_timeline.py's step as a DDP script on gloo, for step_timeline_read.py --ddp: a
communication hook around DDP's own allreduce notes, per bucket, when this rank launched
it and when it completed (bucket 0 holds the last layer's gradients, the first ready).

    hvdrun -np 4 -H ... python step_timeline_gloo.py DIR [STEPS]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from mpi4py import MPI

torch.set_num_threads(1)
comm = MPI.COMM_WORLD
os.environ.setdefault("MASTER_ADDR", comm.bcast(os.uname().nodename if comm.rank == 0 else None))
os.environ.setdefault("MASTER_PORT", "29541")
dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]))
buckets = []


def timed_allreduce(state, bucket):
    launched = time.time()
    fut = default_hooks.allreduce_hook(state, bucket)

    def done(f):
        buckets.append((bucket.index(), launched, time.time()))
        return f.value()
    return fut.then(done)


model.register_comm_hook(None, timed_allreduce)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 2048), torch.randn(64, 2048)
marks = []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 14):
    start = time.time()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    forward = time.time()
    del buckets[:]
    loss.backward()
    reduced = time.time()
    opt.step()
    marks.append((start, forward, reduced, time.time(), sorted(buckets)))
with open("%s/marks-%d.json" % (sys.argv[1], comm.rank), "w") as f:
    json.dump(marks, f)
dist.destroy_process_group()
