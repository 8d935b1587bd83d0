"""DistributedOptimizer for Keras 3 optimizers.

The wrapped optimizer keeps its own class: its class becomes a subclass of
that class (same name, module, config, serialized form) whose ``apply``
averages the gradients across ranks before the update. ``apply`` runs once
per step in compiled and eager ``model.fit`` (also with
``steps_per_execution``), in ``apply_gradients`` and in custom loops.

With ``gradient_accumulation_steps`` Keras calls ``apply`` on every
micro-step and updates only every n-th; there the reduction moves to the
gradient-clipping step Keras runs on real updates only, so the ranks
communicate once per update, not once per micro-step.

Mixed precision (``mixed_float16``): Keras' LossScaleOptimizer skips the
update when the gradients are not finite. If the reduction ran inside that
decision, a rank with an overflow would skip the collective the others wait
in. hvdlite therefore distributes the LossScaleOptimizer itself (reduction
first, then the finite check, which then agrees on every rank) and leaves
its inner optimizer plain.
"""
import sys
import threading
import warnings

import keras
from keras.optimizers import LossScaleOptimizer

from ... import exceptions
from ...compression import Compression
from ...ops import Average
from ...process_sets import global_process_set
from ..reduction import ReduceSettings, reduce_gradients

_local = threading.local()
_warned = set()


def _variable_stack():
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _reduces_on_update_only(opt):
    """True when Keras accumulates gradients over micro-steps in this optimizer."""
    return bool(getattr(opt, "gradient_accumulation_steps", None)) and not isinstance(
        opt, LossScaleOptimizer)


class _DistributedOptimizerMixin:
    """Put in front of the optimizer's own class in the MRO."""

    _hvdlite_settings = None

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if grads and not _reduces_on_update_only(self):
            if trainable_variables is not None:
                variables = list(trainable_variables)
            else:
                variables = list(getattr(self, "_trainable_variables", None) or [None] * len(grads))
            grads = reduce_gradients(grads, variables, self._hvdlite_settings, "opt")
        _warn_if_inside_plain_loss_scale(self)
        return super().apply(grads, trainable_variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        stack = _variable_stack()
        stack.append(list(trainable_variables))
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            stack.pop()

    def _clip_gradients(self, grads):
        # Called once per real update (inside Keras' "is update step" branch
        # when accumulating): the place to reduce accumulated gradients.
        if _reduces_on_update_only(self):
            stack = _variable_stack()
            variables = stack[-1] if stack else [None] * len(grads)
            grads = reduce_gradients(list(grads), variables, self._hvdlite_settings, "opt")
        return super()._clip_gradients(grads)


def _warn_if_inside_plain_loss_scale(opt):
    if isinstance(opt, LossScaleOptimizer) or id(opt) in _warned:
        return
    try:
        frame = sys._getframe(2)
    except ValueError:  # called from the top of the stack
        return
    for _ in range(8):
        if frame is None:
            break
        outer = frame.f_locals.get("self")
        if (isinstance(outer, LossScaleOptimizer) and getattr(outer, "inner_optimizer", None) is opt
                and not is_distributed(outer)):
            _warned.add(id(opt))
            warnings.warn(
                "hvdlite: this DistributedOptimizer runs inside a LossScaleOptimizer that is not "
                "distributed (compile() added it for the mixed_float16 policy). Its reduction then "
                "sits inside a per-rank 'gradients finite?' branch and ranks can hang when only "
                "some overflow. Set the policy before calling DistributedOptimizer (it then wraps "
                "the loss-scale optimizer for you), pass DistributedOptimizer("
                "keras.optimizers.LossScaleOptimizer(opt)), or add "
                "BroadcastGlobalVariablesCallback, which fixes this before training.",
                RuntimeWarning, stacklevel=2)
            return
        frame = frame.f_back


def is_distributed(optimizer):
    """True when ``optimizer`` was wrapped by DistributedOptimizer."""
    return isinstance(optimizer, _DistributedOptimizerMixin)


def _register_like(cls, base):
    """Make Keras serialize ``cls`` exactly as it serializes ``base``, so a
    saved model loads with plain Keras (and hvdlite's load_model re-wraps)."""
    try:
        from keras.src import api_export
        public = api_export.get_name_from_symbol(base)
        if public is not None:
            api_export.REGISTERED_OBJS_TO_NAMES[cls] = public
    except Exception:  # pragma: no cover - private Keras internals moved
        pass
    try:
        from keras.src.saving import object_registration
        if base in object_registration.GLOBAL_CUSTOM_NAMES:
            object_registration.GLOBAL_CUSTOM_NAMES[cls] = object_registration.GLOBAL_CUSTOM_NAMES[base]
    except Exception:  # pragma: no cover
        pass


def _make_distributed(optimizer, settings):
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizerMixin, base), {
        "_hvdlite_settings": settings,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })
    _register_like(cls, base)
    optimizer.__class__ = cls
    return optimizer


def _undistribute(optimizer):
    """Gives a wrapped optimizer its own class back; returns its settings."""
    cls = type(optimizer)
    settings = cls._hvdlite_settings
    optimizer.__class__ = next(b for b in cls.__mro__[1:]
                               if not issubclass(b, _DistributedOptimizerMixin)
                               and b is not _DistributedOptimizerMixin)
    return settings


def move_to_loss_scale(loss_scale_optimizer):
    """If ``loss_scale_optimizer`` is plain and its inner optimizer is
    distributed, distribute the outer one instead (see module doc)."""
    if (isinstance(loss_scale_optimizer, LossScaleOptimizer)
            and not is_distributed(loss_scale_optimizer)
            and is_distributed(loss_scale_optimizer.inner_optimizer)):
        settings = _undistribute(loss_scale_optimizer.inner_optimizer)
        _make_distributed(loss_scale_optimizer, settings)
        return True
    return False


def _mixed_float16_policy():
    try:
        return keras.mixed_precision.global_policy().name == "mixed_float16"
    except Exception:  # pragma: no cover
        return False


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Makes a Keras 3 optimizer average gradients across ranks.

    Returns the optimizer itself, changed in place: same class name, config,
    ``get_config``/``from_config`` round trip and saved form; ``apply`` and
    ``apply_gradients`` now reduce first. Under a ``mixed_float16`` global
    policy a plain optimizer is first wrapped in
    ``keras.optimizers.LossScaleOptimizer`` (the one compile() would add)
    and that is returned.

    - ``compression``: Compression.none, .fp16 or .topk(ratio, error_feedback).
    - ``op``: Average (default) or Sum. ``gradient_predivide_factor`` f:
      divide by f before the sum, multiply by f/size after.
    - ``sparse_as_dense``: densify tf.IndexedSlices (embeddings) and allreduce
      them, instead of gathering them from all ranks.
    - ``backward_passes_per_step`` n > 1: uses Keras'
      ``gradient_accumulation_steps`` (set on the optimizer if unset) and
      reduces once per real update; ``average_aggregated_gradients=False``
      (Horovod's default) sums the n micro-batch gradients, True averages.
    - ``process_set``: reduce over a subset of ranks.
    - ``name``, ``device_dense``, ``device_sparse``, ``num_groups``, ``groups``,
      ``scale_local_gradients``: accepted for Horovod compatibility, unused
      (the engine fuses tensors itself).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        hint = ""
        mod = type(optimizer).__module__
        if "tensorflow" in mod or "tf_keras" in mod:
            hint = (" TF1 and tf_keras (Keras 2) optimizers are not supported; use a Keras 3 "
                    "optimizer such as keras.optimizers.SGD, or DistributedGradientTape in a "
                    "custom loop.")
        raise exceptions.InvalidArgumentError(
            "hvdlite.tensorflow.keras.DistributedOptimizer takes a keras.optimizers.Optimizer, "
            f"not {mod}.{type(optimizer).__name__}.{hint}")
    if is_distributed(optimizer):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer: this optimizer is already distributed; wrap it only once")
    try:
        passes = int(backward_passes_per_step)
    except (TypeError, ValueError):
        passes = 0
    if passes < 1:
        raise exceptions.InvalidArgumentError(
            f"DistributedOptimizer: backward_passes_per_step must be an int >= 1, got "
            f"{backward_passes_per_step!r}")
    postscale = 1.0
    if passes > 1:
        target = optimizer.inner_optimizer if isinstance(optimizer, LossScaleOptimizer) else optimizer
        current = target.gradient_accumulation_steps
        if current and current != passes:
            raise exceptions.InvalidArgumentError(
                f"DistributedOptimizer: backward_passes_per_step={passes} conflicts with the "
                f"optimizer's gradient_accumulation_steps={current}")
        if not current:
            if target.built:
                raise exceptions.InvalidArgumentError(
                    "DistributedOptimizer: backward_passes_per_step > 1 needs an optimizer that "
                    "is not built yet; or create it with gradient_accumulation_steps=n")
            target.gradient_accumulation_steps = passes
        if not average_aggregated_gradients:
            postscale = float(passes)
    settings = ReduceSettings(op=op, compression=compression,
                              gradient_predivide_factor=gradient_predivide_factor,
                              sparse_as_dense=sparse_as_dense, process_set=process_set,
                              postscale=postscale, what="DistributedOptimizer")
    if _mixed_float16_policy() and not isinstance(optimizer, LossScaleOptimizer):
        optimizer = LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    return _make_distributed(optimizer, settings)


def wrap_loaded(optimizer, **kwargs):
    """Distributes an optimizer that a loaded model already holds, in place,
    without adding a LossScaleOptimizer (the model keeps this object)."""
    if optimizer is None or is_distributed(optimizer):
        return optimizer
    settings = ReduceSettings(what="DistributedOptimizer", **kwargs)
    return _make_distributed(optimizer, settings)
