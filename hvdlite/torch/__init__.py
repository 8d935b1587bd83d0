"""Horovod's torch API on hvdlite's engine.

Change ``import horovod.torch as hvd`` to ``import hvdlite.torch as hvd``::

    import hvdlite.torch as hvd
    hvd.init()
    model = ...
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

See docs/torch.md.
"""
import torch

import hvdlite as _hvdlite
from hvdlite import (HvdliteError, ccl_built, cross_rank, cross_size, ddl_built,
                     gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank,
                     local_size,
                     mpi_built, mpi_enabled, mpi_threads_supported, rank,
                     rocm_built, shutdown, size)
from hvdlite.compression import Compression, Compressor
from hvdlite.process_sets import (ProcessSet, add_process_set, global_process_set,
                                  remove_process_set)

from . import c10d, device, elastic
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                      allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                      alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, join, poll, reducescatter,
                      reducescatter_async, sparse_allreduce_async, start_timeline,
                      stop_timeline, synchronize)
from .local_sgd import DiLoCo, LocalSGD
from .optimizer import DistributedOptimizer, OptimizerMisuseError
from .sync_batch_norm import SyncBatchNorm

HorovodInternalError = HvdliteError  # the name Horovod scripts catch


# The device executor (NCCL for CUDA tensors, docs/gpu.md) starts with every
# engine start, whichever module's init() started it, and stops with it.
_hvdlite.basics.add_engine_hooks(device.start, device.stop, device.abandon)


def _report_compute_threads():
    # A CUDA job's host threads mostly wait on the device: leave the engine
    # an ordinary thread there (nothing reported).
    if not torch.cuda.is_available():
        _hvdlite.engine_control.set_compute_threads(torch.get_num_threads())


_hvdlite.basics.add_engine_hooks(_report_compute_threads, lambda: None)

# torch.distributed's "hvdlite" backend: init_process_group(backend="hvdlite")
# (docs/ddp.md).
c10d.register()


def nccl_built():
    """Whether CUDA tensors can go through NCCL here (torch's NCCL, at run time)."""
    import torch.distributed as dist
    return int(torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available())


def cuda_built():
    """Whether this torch can hold CUDA tensors (they go through NCCL or host staging)."""
    return torch.backends.cuda.is_built() and torch.cuda.is_available()

__all__ = [
    "init", "shutdown", "is_initialized", "is_homogeneous", "size", "rank", "local_size",
    "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_built", "mpi_enabled",
    "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ddl_built",
    "ccl_built",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "sparse_allreduce_async", "join", "barrier", "poll",
    "synchronize",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "Compressor",
    "DistributedOptimizer", "OptimizerMisuseError", "LocalSGD", "DiLoCo", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object", "SyncBatchNorm",
    "start_timeline", "stop_timeline", "HvdliteError", "HorovodInternalError", "elastic",
]
