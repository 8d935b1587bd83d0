"""``DistributedOptimizer`` and ``PartialDistributedOptimizer`` for both Keras
on TensorFlow: each optimizer is handed to the module of the Keras its class
comes from (hvdlite.tensorflow.keras_flavor).

- Keras 3 (``keras.optimizers.*``): keras3_optimizer, the reduction runs in
  ``apply`` (what Keras 3's fit and ``apply_gradients`` call).
- Keras 2 (``tf_keras.optimizers.*`` and ``tf_keras.optimizers.legacy.*``,
  also through ``tf.keras`` with ``TF_USE_LEGACY_KERAS=1``):
  tf_keras_optimizer, the reduction runs where gradients are computed, as
  in Horovod.
"""
from ... import exceptions
from ...compression import Compression
from ...ops import Average
from ...process_sets import global_process_set
from ..optimizer_options import DistributedOptions, check_groups, take_optimizer_momentum
from .. import keras_flavor as flavor
from . import tf_keras_optimizer

_WHAT = "DistributedOptimizer"


def _check_optimizer(optimizer, what):
    if flavor.is_optimizer(optimizer):
        return flavor.of(optimizer)
    mod = type(optimizer).__module__
    hint = ""
    if mod.startswith("tensorflow"):
        hint = (" TF1 optimizers (tf.compat.v1.train.*) are wrapped by "
                "hvdlite.tensorflow.DistributedOptimizer.")
    raise exceptions.InvalidArgumentError(
        f"hvdlite.tensorflow.keras.{what} takes a Keras optimizer (keras.optimizers.*, "
        f"tf_keras.optimizers.* or tf_keras.optimizers.legacy.*), not "
        f"{mod}.{type(optimizer).__name__}.{hint}")


def is_distributed(optimizer):
    """True when ``optimizer`` was wrapped by DistributedOptimizer."""
    if tf_keras_optimizer.is_distributed(optimizer):
        return True
    if flavor.of(optimizer) == flavor.KERAS3:
        from . import keras3_optimizer
        return keras3_optimizer.is_distributed(optimizer)
    return False


def _distribute(optimizer, options, loaded=False):
    if flavor.of(optimizer) == flavor.KERAS3:
        from . import keras3_optimizer
        return keras3_optimizer.make_distributed(optimizer, options, loaded=loaded)
    return tf_keras_optimizer.make_distributed(optimizer, options)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Makes a Keras optimizer (Keras 3 or tf_keras, v2 or legacy) average
    gradients across ranks.

    Returns the optimizer itself, changed in place: same class name, config,
    ``get_config``/``from_config`` round trip and saved form, and the state it
    already has. Keras 3 reduces in ``apply``/``apply_gradients``; tf_keras,
    as Horovod, in ``compute_gradients``/``_compute_gradients``/
    ``get_gradients`` (what ``model.fit`` and ``minimize`` call). Under a
    Keras 3 ``mixed_float16`` global policy a plain optimizer is first wrapped
    in ``keras.optimizers.LossScaleOptimizer`` and that is returned.

    - ``compression``: Compression.none, .fp16, .bf16, .topk(ratio, ...),
      .powersgd(rank), .quantize(bits), or an object with ``compress``/``decompress`` (run
      around the reduction). ``topk(momentum_correction=True)`` moves an SGD
      optimizer's momentum into the engine (the optimizer's is set to 0).
    - ``op``: Average (default) or Sum. ``gradient_predivide_factor`` f:
      divide by f before the sum, multiply by f/size after.
    - ``sparse_as_dense``: densify tf.IndexedSlices (embeddings) and allreduce
      them, instead of gathering them from all ranks.
    - ``backward_passes_per_step`` n > 1: gradients of n steps are summed
      locally and reduced once; the optimizer applies every n-th step
      (Keras 3: Keras' ``gradient_accumulation_steps``). The reduced sum is
      applied as it is, or divided by n with ``average_aggregated_gradients``.
    - ``opt.register_local_var(v)``: ``v``'s gradients are not reduced, and
      divided by the number of ranks unless ``scale_local_gradients=False``.
    - ``process_set``: reduce over a subset of ranks.
    - ``name``, ``device_dense``, ``device_sparse``, ``num_groups``, ``groups``:
      accepted (and validated) for Horovod compatibility, unused (the engine
      fuses tensors itself).
    """
    _check_optimizer(optimizer, _WHAT)
    check_groups(num_groups, groups, _WHAT)
    compression = take_optimizer_momentum(optimizer, compression, _WHAT)
    options = DistributedOptions(op=op, compression=compression,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 sparse_as_dense=sparse_as_dense, process_set=process_set,
                                 backward_passes_per_step=backward_passes_per_step,
                                 average_aggregated_gradients=average_aggregated_gradients,
                                 scale_local_gradients=scale_local_gradients)
    return distribute(optimizer, options)


def distribute(optimizer, options):
    """DistributedOptimizer of a Keras optimizer with validated options
    (hvdlite.tensorflow.DistributedOptimizer validates Horovod's
    horovod.tensorflow arguments itself)."""
    _check_optimizer(optimizer, _WHAT)
    if is_distributed(optimizer):
        raise exceptions.InvalidArgumentError(
            f"{_WHAT}: this optimizer is already distributed; wrap it only once")
    return _distribute(optimizer, options)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose ``local_layers`` (a Keras layer or a list of
    layers) keep their gradients local: their trainable variables are
    registered with ``register_local_var``. The other arguments are
    DistributedOptimizer's."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if flavor.of(layer) is None or not hasattr(layer, "trainable_weights"):
            raise exceptions.InvalidArgumentError(
                "PartialDistributedOptimizer: local_layers must be Keras layers, not "
                f"{type(layer).__module__}.{type(layer).__name__}")
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense,
                               device_sparse=device_sparse, compression=compression,
                               sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               average_aggregated_gradients=average_aggregated_gradients,
                               groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def wrap_loaded(optimizer, **distributed_kwargs):
    """Distributes an optimizer that a loaded model already holds, in place
    (no LossScaleOptimizer is added: the model keeps this object)."""
    if optimizer is None or is_distributed(optimizer):
        return optimizer
    _check_optimizer(optimizer, "load_model")
    return _distribute(optimizer, DistributedOptions(**distributed_kwargs), loaded=True)
