"""DistributedGradientTape: a tf.GradientTape whose gradient() returns
gradients averaged (or summed) across ranks."""
import tensorflow as tf

from .. import exceptions
from ..compression import Compression
from ..ops import Average
from ..process_sets import global_process_set
from .reduction import ReduceSettings, reduce_gradients


class _DistributedGradientTapeMixin:
    """Put in front of the tape's own class; only gradient() changes."""

    _hvdlite_settings = None

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        if len(flat_sources) != len(flat_grads):  # a single source gives a single gradient
            flat_sources = [sources]
        reduced = reduce_gradients(flat_grads, flat_sources, self._hvdlite_settings, "tape")
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Makes ``gradtape`` reduce its gradients across ranks.

    ``gradient()`` then returns, for every source, the gradient averaged over
    the ranks of ``process_set`` (``op=Sum`` sums). All gradients of one call
    go to the engine together (one graph node inside tf.function). ``None``
    gradients stay None; nested ``sources`` keep their structure; persistent
    tapes may call gradient() many times; tf.IndexedSlices (embeddings) are
    gathered from all ranks, or densified and reduced with
    ``sparse_as_dense=True``. ``compression`` is Compression.none, .fp16 or
    .topk(ratio); ``gradient_predivide_factor`` f divides by f before the sum
    and multiplies by f/size after.

    The tape itself is changed in place (its class becomes a subclass of its
    own class) and returned, so this works before, during or after recording.
    ``device_dense``, ``device_sparse``, ``num_groups``, ``groups`` and
    ``scale_local_gradients`` are accepted for Horovod compatibility; the
    engine fuses tensors itself.
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise exceptions.InvalidArgumentError(
            "hvdlite.tensorflow.DistributedGradientTape takes a tf.GradientTape, not "
            f"{type(gradtape).__module__}.{type(gradtape).__name__}")
    base = type(gradtape)
    if issubclass(base, _DistributedGradientTapeMixin):
        raise exceptions.InvalidArgumentError(
            "DistributedGradientTape: this tape is already distributed; wrap a tape only once")
    settings = ReduceSettings(op=op, compression=compression,
                              gradient_predivide_factor=gradient_predivide_factor,
                              sparse_as_dense=sparse_as_dense, process_set=process_set,
                              what="DistributedGradientTape")
    cls = type(base.__name__, (_DistributedGradientTapeMixin, base), {
        "_hvdlite_settings": settings,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })
    gradtape.__class__ = cls
    return gradtape


def is_distributed_tape(tape):
    return isinstance(tape, _DistributedGradientTapeMixin)
