"""hvdlite for Keras 3 on TensorFlow: Horovod's ``horovod.tensorflow.keras`` API.

    import keras
    import hvdlite.tensorflow.keras as hvd      # or: import hvdlite.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)
"""
import keras as _keras
import tensorflow as tf

if _keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on KERAS_BACKEND
    raise ImportError(
        f"hvdlite.tensorflow.keras needs Keras' TensorFlow backend, but Keras runs on "
        f"{_keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow before importing keras")

from ...compression import Compression, Compressor
from ...process_sets import (ProcessSet, add_process_set, global_process_set,
                             remove_process_set)
from .. import (Average, Max, Min, Product, Sum, allgather_object, barrier, broadcast_object,
                broadcast_variables, cross_rank, cross_size, init, is_initialized, join,
                local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                nccl_built, rank, reducescatter, shutdown, size)
from .. import mpi_ops as _mpi_ops
from ... import exceptions as _exceptions
from . import callbacks
from .optimizer import DistributedOptimizer, is_distributed, wrap_loaded


def _to_tensor(value, what):
    if _mpi_ops.is_tf_value(value):
        return value
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        raise _exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.keras.{what} takes a tensor-compatible value, not "
            f"{type(value).__name__}: {e}") from None


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set):
    """Reduces a tensor-compatible value (tensor, NumPy array, number) over
    ranks; average by default. Returns a tf.Tensor."""
    return _mpi_ops.allreduce(_to_tensor(value, "allreduce"), average=average,
                              compression=compression, op=op, prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor, name=name,
                              process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    """Concatenates every rank's value along the first dimension."""
    return _mpi_ops.allgather(_to_tensor(value, "allgather"), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s value on every rank."""
    return _mpi_ops.broadcast(_to_tensor(value, "broadcast"), root_rank, name=name,
                              process_set=process_set)


def broadcast_global_variables(root_rank):
    """TF2 has no global variable collection: this raises and says what to use."""
    raise _exceptions.InvalidArgumentError(
        "broadcast_global_variables() has nothing to broadcast in TF2 (there are no global "
        "variables). Use callbacks.BroadcastGlobalVariablesCallback(root_rank) with model.fit, or "
        "hvdlite.tensorflow.broadcast_variables(model.variables + optimizer.variables, root_rank)")


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, **distributed_kwargs):
    """``keras.models.load_model`` whose compiled optimizer comes back
    distributed (keeping the state it was saved with), ready to continue
    training. ``custom_optimizers``: optimizer classes the file needs;
    ``distributed_kwargs`` (op, gradient_predivide_factor, sparse_as_dense,
    process_set) go to the reduction like DistributedOptimizer's."""
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = _keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        wrap_loaded(opt, compression=compression, **distributed_kwargs)
    return model


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_built", "mpi_enabled",
    "nccl_built", "Average", "Sum", "Min", "Max", "Product", "Compression", "Compressor",
    "DistributedOptimizer", "is_distributed", "allreduce", "allgather", "broadcast",
    "reducescatter", "join", "barrier", "broadcast_variables", "broadcast_object",
    "allgather_object", "broadcast_global_variables", "load_model", "callbacks",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
]
