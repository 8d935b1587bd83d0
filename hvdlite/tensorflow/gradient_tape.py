"""DistributedGradientTape: a tf.GradientTape whose gradient() returns
gradients averaged (or summed) across ranks."""
import tensorflow as tf

from .. import exceptions, request
from ..compression import Compression
from ..ops import Average
from ..process_sets import global_process_set
from .reduction import ReduceSettings, reduce_gradients


def _source_key(source):
    # tf.Variable hashes by value in TF2 (its ref() is the identity key);
    # other sources (Keras Variables) by identity.
    ref = getattr(source, "ref", None)
    return ref() if callable(ref) else id(source)


class _DistributedGradientTapeMixin:
    """Put in front of the tape's own class; gradient() reduces, and sources
    registered with register_local_source() keep their local gradient."""

    _hvdlite_settings = None
    _hvdlite_scale_local = True

    def register_local_source(self, source):
        """Marks ``source`` (a variable) as local to this rank: its gradient is
        not reduced across ranks (model parallelism). It is divided by the set
        size unless the tape was made with ``scale_local_gradients=False``."""
        keys = self.__dict__.setdefault("_hvdlite_local_sources", set())
        keys.add(_source_key(source))

    def _is_local(self, source):
        keys = self.__dict__.get("_hvdlite_local_sources")
        return bool(keys) and _source_key(source) in keys

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        if len(flat_sources) != len(flat_grads):  # a single source gives a single gradient
            flat_sources = [sources]
        settings = self._hvdlite_settings
        local = [self._is_local(s) for s in flat_sources]
        shared = [None if is_local else g for g, is_local in zip(flat_grads, local)]
        reduced = reduce_gradients(shared, flat_sources, settings, "tape",
                                   generic_names=use_generic_names)
        if any(local):
            size = float(request.set_size(settings.pset))
            for i, is_local in enumerate(local):
                g = flat_grads[i]
                if is_local and g is not None and self._hvdlite_scale_local:
                    g = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                         if isinstance(g, tf.IndexedSlices) else g / size)
                if is_local:
                    reduced[i] = g
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None):
        """(local, global): lists of (source, gradient) pairs, split by
        register_local_source(); the gradients are those of gradient()."""
        grads = self.gradient(target, sources, output_gradients=output_gradients)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if self._is_local(s) else shared).append((s, g))
        return local, shared


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
    Sources passed to ``tape.register_local_source(var)`` keep their own
    gradient (model parallelism), divided by the set size unless
    ``scale_local_gradients=False``. ``device_dense``, ``device_sparse``,
    ``num_groups`` and ``groups`` are accepted for Horovod compatibility; the
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
        "_hvdlite_scale_local": bool(scale_local_gradients),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })
    gradtape.__class__ = cls
    return gradtape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False, op=Average,
                                   gradient_predivide_factor=1.0, num_groups=0, groups=None,
                                   process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose ``local_layers`` (Keras layers, or one
    layer) keep their local gradients: their trainable variables are
    registered with register_local_source()."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise exceptions.InvalidArgumentError(
                "PartialDistributedGradientTape: local_layers must be Keras layers, not "
                f"{type(layer).__module__}.{type(layer).__name__}")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def is_distributed_tape(tape):
    return isinstance(tape, _DistributedGradientTapeMixin)
