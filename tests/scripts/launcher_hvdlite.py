"""Rank script for hvdrun's multi-host tests that uses the hvdlite engine.

usage: launcher_hvdlite.py TAG MODE
  numpy    hvdlite.init(); NumPy allreduce (Sum and Average) of a 1 M-float array;
           prints one JSON line per rank with rank/size/local/cross, results and
           how many reductions took the ring and its sockets
  torch    hvdlite.torch.DistributedOptimizer trains a small model for 3 steps on
           per-rank shards; every rank also trains a single-process reference on the
           whole batch; prints the largest parameter difference
  raise R  after one allreduce, rank R raises ValueError while the others keep
           reducing: the job must end
"""

import json
import os
import socket
import sys

import numpy as np


def numpy_mode():
    import hvdlite as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x = np.full(1 << 20, r + 1, dtype=np.float32)
    total = hvd.allreduce(x, op=hvd.Sum, name="launcher.sum")
    mean = hvd.allreduce(x, op=hvd.Average, name="launcher.avg")
    print(json.dumps({
        "rank": r, "size": n, "host": socket.gethostname(),
        "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
        "sum_ok": bool((total == n * (n + 1) / 2).all()),
        "avg_ok": bool(np.allclose(mean, (n + 1) / 2)),
        "ring": hvd.engine_stats()["ring_collectives"],
        "socket_ring": hvd.engine_stats()["socket_ring_collectives"],
        "socket_ifname": os.environ.get("HVDLITE_SOCKET_IFNAME"),
    }), flush=True)
    hvd.shutdown()


def torch_mode():
    import torch
    import hvdlite.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

    rows = 4
    dist, ref = model(), model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(dist.parameters(), lr=0.1),
                                   named_parameters=dist.named_parameters())
    hvd.broadcast_parameters(dist.state_dict(), root_rank=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(rows * n, 8, generator=g)
        y = torch.randint(0, 4, (rows * n,), generator=g)
        opt.zero_grad()
        loss_fn(dist(x[r * rows:(r + 1) * rows]), y[r * rows:(r + 1) * rows]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()      # mean over the whole batch = average of shard means
        ref_opt.step()
    diff = max((a - b).abs().max().item() for a, b in zip(dist.parameters(), ref.parameters()))
    print(json.dumps({"rank": r, "size": n, "host": socket.gethostname(), "max_diff": diff}),
          flush=True)
    hvd.shutdown()


def raise_mode():
    import time
    bad = int(sys.argv[3])
    import hvdlite as hvd
    hvd.init()
    x = np.ones(1000, dtype=np.float32)
    hvd.allreduce(x, op=hvd.Sum, name="warmup")
    print("READY %d" % hvd.rank(), flush=True)
    if hvd.rank() == bad:
        time.sleep(0.5)
        print("FAIL_AT %.3f" % time.time(), flush=True)
        raise ValueError("simulated failure in rank %d" % bad)
    for step in range(100000):
        hvd.allreduce(x, op=hvd.Sum, name="step")


if __name__ == "__main__":
    {"numpy": numpy_mode, "torch": torch_mode, "raise": raise_mode}[sys.argv[2]]()
