"""hvdlite for TensorFlow 2 (and Keras 3): Horovod's ``horovod.tensorflow`` API.

    import tensorflow as tf
    import hvdlite.tensorflow as hvd

    hvd.init(intra_op_threads="auto")
    ...
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

TF1-style code wraps a tf.compat.v1.train optimizer the same way:
``train_op = hvd.DistributedOptimizer(opt).minimize(loss)``.

Collectives take tf.Tensor / tf.Variable and work eagerly, inside
tf.function and in tf.compat.v1 graphs (not inside XLA: jit_compile=True
raises a clear error). They are ops of a TensorFlow op library built for the
installed TensorFlow (see hvdlite/tensorflow/op_library.py).
"""
import os
import warnings

import tensorflow as tf

from .. import basics as _basics
from ..basics import (cross_rank, cross_size, is_homogeneous, is_initialized, local_rank,
                      local_size, mpi_library_version, mpi_threads_supported, rank, shutdown, size)
from ..compression import Compression, Compressor
from ..engine_control import set_compute_threads as _set_compute_threads
from ..engine_control import start_timeline, stop_timeline
from ..exceptions import (HvdliteError, HvdliteShutdownError, InvalidArgumentError, MPIError,
                          NotInitializedError, StallError, TensorMismatchError,
                          UnsupportedDTypeError)
from ..process_sets import (ProcessSet, add_process_set, global_process_set,
                            remove_process_set)
from .. import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, gpu_available,
                mpi_built, mpi_enabled, nccl_built, rocm_built)
from . import compat_v1_optimizer, elastic, util
from .functions import (BroadcastGlobalVariablesHook, allgather_object,
                        broadcast_global_variables, broadcast_object, broadcast_object_fn,
                        broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .optimizer_options import DistributedOptions as _DistributedOptions
from .optimizer_options import check_groups as _check_groups
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall,
                      barrier, broadcast, broadcast_, grouped_allgather, grouped_allreduce,
                      grouped_reducescatter, join, local_rank_op, local_size_op,
                      process_set_included_op, rank_op, reducescatter, size_op)
from .util import _executing_eagerly

# Autograph re-raises exceptions from code it traced as a generic StagingError
# unless they carry this marker; hvdlite's errors should reach users as they are.
HvdliteError.ag_pass_through = True

_THREAD_ENV = {"intra": "HVDLITE_TF_INTRA_OP_THREADS", "inter": "HVDLITE_TF_INTER_OP_THREADS"}


def _thread_count(value, kind):
    if value is None:
        value = os.environ.get(_THREAD_ENV[kind]) or None
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cores or 1) // max(1, local_size()))
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"init({kind}_op_threads=...) takes a positive int or 'auto', not {value!r}") from None
    if n < 1:
        raise InvalidArgumentError(f"init({kind}_op_threads=...) must be >= 1, got {n}")
    return n


def _set_threads(intra, inter):
    setters = ((intra, tf.config.threading.set_intra_op_parallelism_threads,
                tf.config.threading.get_intra_op_parallelism_threads, "intra_op_threads",
                "TF_NUM_INTRAOP_THREADS"),
               (inter, tf.config.threading.set_inter_op_parallelism_threads,
                tf.config.threading.get_inter_op_parallelism_threads, "inter_op_threads",
                "TF_NUM_INTEROP_THREADS"))
    for value, setter, getter, label, env in setters:
        if value is None:
            continue
        if getter() == value:
            continue
        try:
            setter(value)
        except RuntimeError:
            warnings.warn(
                f"hvdlite.tensorflow.init({label}={value}): TensorFlow has already started, so its "
                f"thread pools cannot change any more (now {getter() or 'default'}). Call init() "
                f"before any TF op, or set {env} in the environment.", RuntimeWarning, stacklevel=3)


def init(comm=None, process_sets=None, intra_op_threads=None, inter_op_threads=None):
    """Starts hvdlite (see :func:`hvdlite.init`) and optionally sizes
    TensorFlow's thread pools for this rank.

    ``intra_op_threads`` / ``inter_op_threads``: an int, or ``"auto"`` =
    usable cores // ranks on this host, so ranks sharing a machine do not
    fight for cores. Defaults come from ``HVDLITE_TF_INTRA_OP_THREADS`` /
    ``HVDLITE_TF_INTER_OP_THREADS``; unset leaves TF's own choice (which
    also honours ``TF_NUM_INTRAOP_THREADS``). Takes effect only before TF runs
    its first op; later a RuntimeWarning says so.
    """
    global _sizing_threads
    _sizing_threads = True
    try:
        _basics.init(comm, process_sets)
    finally:
        _sizing_threads = False
    _set_threads(_thread_count(intra_op_threads, "intra"), _thread_count(inter_op_threads, "inter"))
    if is_initialized():
        _report_compute_threads()


# Set while init() starts the engine: it reports the threads once it has sized them.
_sizing_threads = False


def _report_compute_threads():
    """Tells the engine TF's intra-op threads per rank (what
    HVDLITE_ENGINE_PRIORITY=auto decides from); nothing where TF has a GPU,
    whose host threads mostly wait on the device."""
    if _sizing_threads or tf.config.list_physical_devices("GPU"):
        return
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    if not threads:  # TF's default: one per usable core, or TF_NUM_INTRAOP_THREADS
        env = os.environ.get("TF_NUM_INTRAOP_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))
    _set_compute_threads(threads)


_basics.add_engine_hooks(_report_compute_threads, lambda: None)


def __getattr__(name):
    # SyncBatchNormalization subclasses tf.keras's BatchNormalization, whose
    # import (Keras) waits until the layer is asked for.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Makes an optimizer average its gradients across ranks.

    - A TF1-style ``tf.compat.v1.train.Optimizer`` (GradientDescentOptimizer,
      AdamOptimizer, ...) gives a new tf.compat.v1 optimizer whose
      ``compute_gradients`` (what ``minimize`` calls) returns reduced
      gradients; see hvdlite.tensorflow.compat_v1_optimizer. ``name``
      defaults to "Distributed" + the class name; ``use_locking`` is the
      TF1 optimizers'. ``op=Adasum`` combines each rank's updates instead.
    - A Keras optimizer (Keras 3 or tf_keras) is changed in place, see
      :func:`hvdlite.tensorflow.keras.DistributedOptimizer` (``use_locking``
      does not apply there).

    The other arguments are the same for both kinds: ``compression``,
    ``sparse_as_dense``, ``op`` (Average or Sum; Adasum),
    ``gradient_predivide_factor``, ``backward_passes_per_step`` with
    ``average_aggregated_gradients``, ``process_set``,
    ``scale_local_gradients`` (for ``opt.register_local_var``).
    ``device_dense``, ``device_sparse``, ``num_groups`` and ``groups`` are
    validated and otherwise unused: the engine fuses tensors itself."""
    _check_groups(num_groups, groups, "DistributedOptimizer")
    options = _DistributedOptions(op=op, compression=compression,
                                  gradient_predivide_factor=gradient_predivide_factor,
                                  sparse_as_dense=sparse_as_dense, process_set=process_set,
                                  backward_passes_per_step=backward_passes_per_step,
                                  average_aggregated_gradients=average_aggregated_gradients,
                                  scale_local_gradients=scale_local_gradients)
    if compat_v1_optimizer.is_v1_optimizer(optimizer):
        return compat_v1_optimizer.make_distributed(optimizer, options, name, use_locking)
    from .keras.optimizer import distribute
    return distribute(optimizer, options)


__all__ = [
    "init", "shutdown", "is_initialized", "is_homogeneous", "rank", "size", "local_rank",
    "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_library_version",
    "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built",
    "rocm_built", "ddl_built", "ccl_built", "gpu_available", "start_timeline", "stop_timeline",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "Compressor",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object",
    "broadcast_object_fn", "allgather_object", "BroadcastGlobalVariablesHook",
    "SyncBatchNormalization",
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer",
    "elastic",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "size_op", "rank_op", "local_rank_op", "local_size_op", "process_set_included_op",
    "HvdliteError", "InvalidArgumentError", "NotInitializedError", "TensorMismatchError",
    "HvdliteShutdownError", "MPIError", "StallError", "UnsupportedDTypeError",
]
