"""hvdlite's device executor beside a script's own torch.distributed default
group, in either order (hvdlite/torch/device.py: the executor's groups are
its own). Run by tests/test_torch_distributed.py under mpiexec with
HVDLITE_DEVICE_TRANSPORT=gloo, so CPU tensors of the Horovod API go through
the executor; prints ``RANK <r> OK``.

``python torch_c10d_device_order.py hvdlite-first``: hvdlite.init() starts
the executor, then ``init_process_group(backend="hvdlite")``; both APIs
reduce; ``destroy_process_group()`` leaves the executor's groups working, and
the default group can be made again.

``python torch_c10d_device_order.py gloo-default``: ``init_process_group("gloo")``
without MASTER_ADDR, so torch's env:// rendezvous takes the layout from MPI
and starts hvdlite (and the executor) in the middle of torch's creation of
the default group; both work, and hvdlite.shutdown() leaves the script's
group alone.
"""
import sys

import torch
import torch.distributed as dist

import hvdlite.torch as hvd
from hvdlite.torch import device

torch.set_num_threads(1)


def check(what, cond, detail=""):
    if not cond:
        raise AssertionError(f"{what} failed {detail}".rstrip())


def both_reduce(size, rank, what):
    """dist.all_reduce on the default group and hvd.allreduce through the executor."""
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    want = float(size * (size + 1) // 2)
    check(f"{what}: dist.all_reduce", torch.equal(t, torch.full((4,), want)), str(t))
    jobs = device.counts["device_jobs"]
    got = hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum, name=f"order.{what}")
    check(f"{what}: hvd.allreduce", torch.equal(got, torch.full((3,), want)), str(got))
    check(f"{what}: on the executor", device.counts["device_jobs"] > jobs, str(device.counts))


def hvdlite_first():
    hvd.init()
    check("executor", device.backend_name() == "gloo", str(device.backend_name()))
    dist.init_process_group(backend="hvdlite")
    rank, size = dist.get_rank(), dist.get_world_size()
    check("backend", dist.get_backend() == "hvdlite")
    both_reduce(size, rank, "hvdlite default group")
    dist.destroy_process_group()
    check("destroyed", not dist.is_initialized())
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="order.after_destroy")
    check("executor after destroy_process_group()", torch.equal(got, torch.full((2,), float(size))))
    dist.init_process_group(backend="hvdlite")
    both_reduce(size, rank, "hvdlite default group again")
    dist.destroy_process_group()
    return rank


def gloo_default():
    check("hvdlite not started", not hvd.is_initialized())
    dist.init_process_group(backend="gloo")
    check("hvdlite started by env://", hvd.is_initialized())
    check("executor", device.backend_name() == "gloo", str(device.backend_name()))
    rank, size = dist.get_rank(), dist.get_world_size()
    check("backend", dist.get_backend() == "gloo")
    both_reduce(size, rank, "gloo default group")
    hvd.shutdown()
    check("the script's group outlives hvdlite", dist.is_initialized())
    t = torch.ones(2)
    dist.all_reduce(t)
    check("gloo after hvdlite.shutdown()", torch.equal(t, torch.full((2,), float(size))))
    dist.destroy_process_group()
    return rank


if __name__ == "__main__":
    order = sys.argv[1]
    rank = {"hvdlite-first": hvdlite_first, "gloo-default": gloo_default}[order]()
    print(f"RANK {rank} OK", flush=True)
