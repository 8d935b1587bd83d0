"""hvdlite for Keras on TensorFlow: Horovod's ``horovod.tensorflow.keras`` API,
for Keras 3 and for Keras 2 (tf_keras, what ``tf.keras`` is with
``TF_USE_LEGACY_KERAS=1``).

    import keras                                # or: import tf_keras as keras
    import hvdlite.tensorflow.keras as hvd      # or: import hvdlite.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

Each optimizer and model is handled as the Keras its class comes from
(see hvdlite.tensorflow.keras_flavor).
"""
import tensorflow as tf

from ...compression import Compression, Compressor
from ...process_sets import (ProcessSet, add_process_set, global_process_set,
                             remove_process_set)
from ...engine_control import start_timeline, stop_timeline
from .. import (Adasum, Average, Max, Min, Product, Sum, allgather_object, barrier,
                broadcast_object, broadcast_variables, ccl_built, cross_rank, cross_size,
                cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_initialized, join,
                local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                nccl_built, rank, rocm_built, shutdown, size)
from .. import mpi_ops as _mpi_ops
from ... import exceptions as _exceptions
from .. import keras_flavor as flavor
from . import callbacks, elastic
from .optimizer import (DistributedOptimizer, PartialDistributedOptimizer, is_distributed,
                        wrap_loaded)


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


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """Reduces a tensor-compatible value over ranks and returns this rank's
    block of rows (Horovod's Keras signature)."""
    return _mpi_ops.reducescatter(_to_tensor(value, "reducescatter"), op=op, name=name,
                                  process_set=process_set)


def broadcast_global_variables(root_rank):
    """TF2 has no global variable collection: this raises and says what to use."""
    raise _exceptions.InvalidArgumentError(
        "broadcast_global_variables() has nothing to broadcast in TF2 (there are no global "
        "variables). Use callbacks.BroadcastGlobalVariablesCallback(root_rank) with model.fit, or "
        "hvdlite.tensorflow.broadcast_variables(model.variables + optimizer.variables, root_rank)")


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False, **distributed_kwargs):
    """Loads a saved Keras model whose compiled optimizer comes back
    distributed (keeping the state it was saved with), ready to continue
    training.

    The file is loaded by the Keras that saved it (its recorded Keras
    version; a SavedModel directory is tf_keras'). ``custom_optimizers``:
    optimizer classes the file needs; ``legacy_opts=True``: optimizer names
    in the file mean tf_keras' legacy optimizers; ``compression`` and
    ``distributed_kwargs`` (op, gradient_predivide_factor, sparse_as_dense,
    process_set, ...) are DistributedOptimizer's."""
    keras = flavor.module(flavor.of_saved_model(filepath))
    objects = {}
    if legacy_opts:
        objects.update({cls.__name__.lower(): cls
                        for cls in keras.optimizers.legacy.Optimizer.__subclasses__()})
    objects.update({cls.__name__: cls for cls in custom_optimizers or ()})
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        wrap_loaded(opt, compression=compression, **distributed_kwargs)
    return model


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_built", "mpi_enabled",
    "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
    "ccl_built", "start_timeline", "stop_timeline",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "Compressor",
    "DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed", "allreduce",
    "allgather", "broadcast",
    "reducescatter", "join", "barrier", "broadcast_variables", "broadcast_object",
    "allgather_object", "broadcast_global_variables", "load_model", "callbacks", "elastic",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
]
