"""One job of the train step (6 x Linear(2048, 2048) + ReLU, batch 64 per rank, SGD) for
step_timeline_read.py, as the Horovod API (hvd: run it with the engine's timeline on every
rank) or as a DDP script on gloo (gloo: a communication hook around DDP's own allreduce notes
when this rank launched each bucket and when it completed; bucket 0 holds the last layer's
gradients, the first ready). Each rank writes the wall-clock moments of its steps (start,
forward done, its gradients reduced, optimizer done) to DIR/marks-RANK.json.

    HVDLITE_TIMELINE=DIR/hvd-%r.json hvdrun -np 4 -H ... python step_timeline.py hvd DIR [STEPS]
    hvdrun -np 4 -H ... python step_timeline.py gloo DIR [STEPS]
"""
import json
import os
import sys
import time

import torch


def horovod_api(model):
    """hvdlite's DistributedOptimizer over the model; steps after synchronize()."""
    import hvdlite.torch as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())

    def reduce_and_step():
        opt.synchronize()
        reduced = time.time()
        with opt.skip_synchronize():
            opt.step()
        return reduced
    return hvd.rank(), model, opt, reduce_and_step, hvd.shutdown


def ddp_on_gloo(model, buckets=None):
    """DDP over gloo on MPI's ranks; with `buckets`, a hook notes each bucket's launch and end."""
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    comm = MPI.COMM_WORLD
    os.environ.setdefault("MASTER_ADDR", comm.bcast(os.uname().nodename if comm.rank == 0 else None))
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    def timed_allreduce(state, bucket):
        launched = time.time()

        def done(fut):
            buckets.append((bucket.index(), launched, time.time()))
            return fut.value()
        return default_hooks.allreduce_hook(state, bucket).then(done)
    if buckets is not None:
        ddp.register_comm_hook(None, timed_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def reduce_and_step():
        reduced = time.time()     # DDP's backward returns with its buckets reduced
        opt.step()
        return reduced
    return comm.rank, ddp, opt, reduce_and_step, dist.destroy_process_group


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())])
    buckets = []
    rank, model, opt, reduce_and_step, finish = (
        horovod_api(model) if mode == "hvd" else ddp_on_gloo(model, buckets))
    x, y = torch.randn(64, 2048), torch.randn(64, 2048)
    marks = []
    for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 14):
        start = time.time()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        forward = time.time()
        del buckets[:]
        loss.backward()
        reduced = reduce_and_step()
        marks.append((start, forward, reduced, time.time()) + ((sorted(buckets),) if mode == "gloo" else ()))
    with open("%s/marks-%d.json" % (folder, rank), "w") as f:
        json.dump(marks, f)
    finish()


if __name__ == "__main__":
    main()
