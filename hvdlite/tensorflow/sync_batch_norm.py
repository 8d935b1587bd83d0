"""SyncBatchNormalization: batch normalization whose training statistics are
averaged over the ranks, so every rank normalises with the statistics of the
global batch (ranks with equal batch sizes)."""
import tensorflow as tf

from .. import exceptions, request
from . import mpi_ops

_BatchNormalization = tf.keras.layers.BatchNormalization  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1


class SyncBatchNormalization(_BatchNormalization):
    """``tf.keras.layers.BatchNormalization`` with cross-rank statistics.

    The per-rank mean and mean of squares are averaged with one allreduce in
    each training call; the variance is E[x^2] - E[x]^2 of the global batch.
    ``fused`` is Horovod's argument: fused kernels bypass the statistics this
    layer synchronises, so only ``fused=False`` (the default) is accepted;
    Keras 3 has no fused kernels and takes no such argument.
    """

    def __init__(self, fused=False, process_set=mpi_ops.global_process_set, **kwargs):
        if fused or fused is None:
            raise exceptions.InvalidArgumentError(
                "SyncBatchNormalization does not support fused=True (or None): the fused kernel "
                "computes the statistics this layer synchronises across ranks")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        if "fused" in _init_arguments():
            kwargs["fused"] = False
        super().__init__(**kwargs)
        self._hvdlite_process_set = process_set

    def _moments(self, inputs, *args, **kwargs):
        mean, variance = super()._moments(inputs, *args, **kwargs)
        if request.set_size(self._hvdlite_process_set) == 1:
            return mean, variance
        # Var[x] = E[x^2] - E[x]^2, with both expectations over all ranks.
        stats = tf.stack([mean, variance + tf.math.square(mean)])
        stats = mpi_ops.allreduce(stats, op=mpi_ops.Average, process_set=self._hvdlite_process_set)
        global_mean, global_mean_of_square = tf.unstack(stats)
        return global_mean, global_mean_of_square - tf.math.square(global_mean)


def _init_arguments():
    import inspect
    return inspect.signature(_BatchNormalization.__init__).parameters
