"""hvdlite: data-parallel training with a C++ engine over MPI and Horovod's API.

    import hvdlite as hvd
    hvd.init()
    total = hvd.allreduce(numpy_array, op=hvd.Sum)

Framework adapters: ``hvdlite.torch`` and ``hvdlite.tensorflow`` (+ ``.keras``).
"""
__version__ = "0.1.0"

from .basics import (abandon, cross_rank, cross_size, init, is_homogeneous, is_initialized, local_rank,
                     local_size, mpi_library_version, mpi_threads_supported, rank, shutdown, size)
from .compression import Compression, Compressor
from .engine_control import (engine_stats, flight_recorder, reset_compression_state, set_compute_threads,
                             start_timeline, stop_timeline)
from .exceptions import (HvdliteError, HvdliteShutdownError, HvdliteTimeoutError,
                         InvalidArgumentError, MPIError, NotInitializedError, StallError,
                         TensorMismatchError, UnsupportedDTypeError)
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                  allreduce_async, alltoall, alltoall_async, barrier, broadcast, broadcast_async,
                  grouped_allreduce, grouped_allreduce_async, join, poll, reducescatter,
                  reducescatter_async, synchronize)
from .process_sets import (ProcessSet, add_process_set, global_process_set, remove_process_set)


def mpi_built():
    return True


def mpi_enabled():
    return True


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    from . import _build_info
    return bool(getattr(_build_info, "NCCL_BUILT", False))


def cuda_built():
    return nccl_built()


def rocm_built():
    return False


def gpu_available(ext_base_name="", verbose=False):
    """Whether this build runs collectives on GPU tensors (Horovod's
    ``hvd.gpu_available('tensorflow')``); one engine serves every framework,
    so ``ext_base_name`` does not change the answer."""
    return cuda_built()


def ddl_built():
    return False


def ccl_built():
    return False


def DistributedOptimizer(optimizer, *args, **kwargs):
    """Wraps a framework optimizer so gradients are averaged across ranks.

    A ``torch.optim.Optimizer`` goes to :func:`hvdlite.torch.DistributedOptimizer`,
    a Keras optimizer (Keras 3 or tf_keras) to
    :func:`hvdlite.tensorflow.keras.DistributedOptimizer`.
    The adapter is imported only here, so ``import hvdlite`` stays light.
    """
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(optimizer, torch.optim.Optimizer):
        from .torch import DistributedOptimizer as torch_optimizer
        return torch_optimizer(optimizer, *args, **kwargs)
    if any(c.__module__.partition(".")[0] in ("keras", "tf_keras") for c in type(optimizer).__mro__):
        from .tensorflow.keras import DistributedOptimizer as keras_optimizer
        return keras_optimizer(optimizer, *args, **kwargs)
    raise InvalidArgumentError(
        f"hvdlite.DistributedOptimizer() wraps a torch.optim.Optimizer or a Keras optimizer "
        f"(Keras 3 or tf_keras), not {type(optimizer).__module__}.{type(optimizer).__name__}")
