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

Horovod's custom-loop methods are there too: ``compute_gradients`` /
``_compute_gradients`` return reduced gradients, and ``apply`` does not reduce
those tensors again; ``register_local_var`` keeps a variable's gradients
local (see aggregation.LocalVariableReducer).

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
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer

from ... import exceptions
from ..aggregation import LocalVariableReducer

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

    _hvdlite_settings = None       # ReduceSettings
    _hvdlite_scale_local = True    # scale_local_gradients

    def _hvdlite_local_reducer(self):
        reducer = self.__dict__.get("_hvdlite_reducer")
        if reducer is None:  # made lazily: from_config copies never ran DistributedOptimizer
            reducer = LocalVariableReducer(self._hvdlite_settings, self._hvdlite_scale_local)
            object.__setattr__(self, "_hvdlite_reducer", reducer)  # not a tracked Keras attribute
        return reducer

    def _hvdlite_reduce(self, grads, variables):
        return self._hvdlite_local_reducer()(grads, variables)

    def register_local_var(self, var):
        """Gradients of ``var`` are not reduced: each rank applies its own
        (divided by the number of ranks unless scale_local_gradients=False)."""
        self._hvdlite_local_reducer().register_local_var(var)

    def compute_gradients(self, loss, var_list, tape=None):
        """See ``_compute_gradients``."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's gradient step for custom loops: (gradient, variable)
        pairs, reduced across ranks (local variables scaled, not reduced).
        ``apply_gradients`` then applies these very tensors without reducing
        them again. ``loss`` is a tensor recorded on ``tape`` or a function.
        With gradient accumulation they come back as computed: Keras sums
        them in ``apply`` and the sum is reduced on the update step."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        grads = tape.gradient(loss, var_list, output_gradients=grad_loss)
        if not _reduces_on_update_only(self):
            grads = self._hvdlite_reduce(list(grads), var_list)
            # Remembered by identity (eager tensors, or symbolic ones of the
            # same trace) for the next apply().
            object.__setattr__(self, "_hvdlite_reduced", {id(g): g for g in grads if g is not None})
        return list(zip(grads, var_list))

    def _hvdlite_reduce_pending(self, grads, variables):
        """Reduces the gradients that _compute_gradients did not hand out."""
        done = self.__dict__.pop("_hvdlite_reduced", None) or {}
        todo = [i for i, g in enumerate(grads) if done.get(id(g)) is not g]
        if len(todo) == len(grads):
            return self._hvdlite_reduce(grads, variables)
        out = list(grads)
        reduced = self._hvdlite_reduce([grads[i] for i in todo], [variables[i] for i in todo])
        for i, g in zip(todo, reduced):
            out[i] = g
        return out

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if grads and not _reduces_on_update_only(self):
            if trainable_variables is not None:
                variables = list(trainable_variables)
            else:
                variables = list(getattr(self, "_trainable_variables", None) or [None] * len(grads))
            grads = self._hvdlite_reduce_pending(grads, variables)
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
            grads = self._hvdlite_reduce(list(grads), variables)
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


def _make_distributed(optimizer, settings, scale_local_gradients=True):
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizerMixin, base), {
        "_hvdlite_settings": settings,
        "_hvdlite_scale_local": bool(scale_local_gradients),
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })
    _register_like(cls, base)
    optimizer.__class__ = cls
    return optimizer


def _undistribute(optimizer):
    """Gives a wrapped optimizer its own class back; returns what
    _make_distributed needs to wrap another one the same way."""
    cls = type(optimizer)
    reducer = optimizer.__dict__.get("_hvdlite_reducer")
    optimizer.__class__ = next(b for b in cls.__mro__[1:]
                               if not issubclass(b, _DistributedOptimizerMixin)
                               and b is not _DistributedOptimizerMixin)
    return cls._hvdlite_settings, cls._hvdlite_scale_local, reducer


def move_to_loss_scale(loss_scale_optimizer):
    """If ``loss_scale_optimizer`` is plain and its inner optimizer is
    distributed, distribute the outer one instead (see module doc)."""
    if (isinstance(loss_scale_optimizer, LossScaleOptimizer)
            and not is_distributed(loss_scale_optimizer)
            and is_distributed(loss_scale_optimizer.inner_optimizer)):
        settings, scale_local, reducer = _undistribute(loss_scale_optimizer.inner_optimizer)
        _make_distributed(loss_scale_optimizer, settings, scale_local)
        if reducer is not None:  # keep the local variables registered on the inner one
            object.__setattr__(loss_scale_optimizer, "_hvdlite_reducer", reducer)
        return True
    return False


def _mixed_float16_policy():
    try:
        return keras.mixed_precision.global_policy().name == "mixed_float16"
    except Exception:  # pragma: no cover
        return False


def make_distributed(optimizer, options, loaded=False):
    """Distributes a Keras 3 optimizer in place (see DistributedOptimizer).

    ``backward_passes_per_step`` n > 1 uses Keras' own
    ``gradient_accumulation_steps`` (set on the optimizer if unset) and
    reduces once per real update; without ``average_aggregated_gradients``
    the reduced average is multiplied by n (Horovod sums the micro-batch
    gradients). Under a ``mixed_float16`` global policy a plain optimizer is
    first wrapped in ``keras.optimizers.LossScaleOptimizer`` (the one
    compile() would add) and that is returned, unless it is a ``loaded``
    model's optimizer (the model keeps that object)."""
    passes = options.backward_passes_per_step
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
        if not options.average_aggregated_gradients:
            postscale = float(passes)
    settings = options.reduce_settings(postscale=postscale)
    if not loaded and _mixed_float16_policy() and not isinstance(optimizer, LossScaleOptimizer):
        optimizer = LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    return _make_distributed(optimizer, settings, options.scale_local_gradients)
