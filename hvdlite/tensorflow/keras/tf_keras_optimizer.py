"""DistributedOptimizer for Keras 2 optimizers (``tf_keras.optimizers.*`` and
``tf_keras.optimizers.legacy.*``), with Horovod's semantics.

Keras 2's ``model.fit`` trains through ``optimizer.minimize``, which computes
gradients (``compute_gradients`` in the tf_keras optimizers,
``_compute_gradients`` in the legacy ones, ``get_gradients`` in TF1 graphs)
and then applies them. As in Horovod, the reduction runs where gradients
are computed, so ``apply_gradients`` applies what it is given: a custom
loop reduces with ``DistributedGradientTape`` or calls
``opt.compute_gradients`` / ``opt._compute_gradients``. Because the
reduction comes before ``apply_gradients``, tf_keras' LossScaleOptimizer
sees reduced gradients and its finite check agrees on every rank.

The optimizer keeps its own class (a generated subclass with the same
name, module and config) and its state; ``from_config`` on that class gives
another distributed optimizer with the same settings.
"""
import tensorflow as tf

from ..aggregation import LocalGradientAggregation, LocalVariableReducer
from .. import keras_flavor as flavor


def _keras_state_variable(initial_value, name):
    """A non-trainable variable made outside any function being traced
    (``initial_value`` is a function, run there too). In a TF1 graph it is
    initialized at once in Keras' session (Keras initializes only the
    variables it made itself)."""
    with tf.init_scope():
        variable = tf.Variable(initial_value(), trainable=False, name=name)
        if not tf.executing_eagerly():
            flavor.graph_session().run(variable.initializer)
    return variable


class _DistributedTfKerasOptimizer:
    """Put in front of the tf_keras optimizer's own class in the MRO."""

    _hvdlite_options = None  # DistributedOptions, set on the generated class

    def __init__(self, *args, **kwargs):
        # Runs for copies made from this class (from_config); the wrapped
        # optimizer itself gets _hvdlite_setup() from DistributedOptimizer.
        super().__init__(*args, **kwargs)
        self._hvdlite_setup()

    def _hvdlite_setup(self):
        options = type(self)._hvdlite_options
        self._hvdlite_reducer = LocalVariableReducer(options.settings,
                                                     options.scale_local_gradients)
        self._agg_helper = None
        if options.backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregation(
                options.backward_passes_per_step, self._hvdlite_reducer,
                options.average_aggregated_gradients, new_variable=_keras_state_variable)

    def register_local_var(self, var):
        """Gradients of ``var`` are not reduced: each rank applies its own
        (divided by the number of ranks unless scale_local_gradients=False)."""
        self._hvdlite_reducer.register_local_var(var)

    def _hvdlite_allreduce(self, grads, variables):
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(grads, variables)
        return self._hvdlite_reducer(grads, variables)

    def compute_gradients(self, loss, var_list, tape=None):
        """(reduced gradient, variable) pairs; see ``_compute_gradients``."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """The optimizer's own gradient computation, then the reduction across
        ranks (or the local accumulation of backward_passes_per_step)."""
        base = super()
        tape = tf.GradientTape() if tape is None else tape
        if hasattr(base, "_compute_gradients"):  # legacy optimizers
            grads_and_vars = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
        else:
            grads_and_vars = base.compute_gradients(loss, var_list, tape=tape)
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._hvdlite_allreduce(grads, variables), variables))

    def get_gradients(self, loss, params):
        """TF1-graph Keras path: the optimizer's gradients, reduced."""
        return self._hvdlite_allreduce(super().get_gradients(loss, params), params)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Applies the gradients; with backward_passes_per_step only on the
        steps whose gradients were reduced (the others advance ``iterations``)."""
        base = super()
        if self._agg_helper is None:
            return base.apply_gradients(grads_and_vars, *args, **kwargs)
        grads_and_vars = list(grads_and_vars)  # a zip would be consumed by the first look
        return self._agg_helper.apply_gradients(
            lambda: base.apply_gradients(grads_and_vars, *args, **kwargs),
            lambda: [self.iterations.assign_add(1, read_value=False)],
            [g for g, _ in grads_and_vars])


def is_distributed(optimizer):
    return isinstance(optimizer, _DistributedTfKerasOptimizer)


def make_distributed(optimizer, options):
    """Changes ``optimizer``'s class in place to a distributed subclass."""
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedTfKerasOptimizer, base), {
        "_hvdlite_options": options,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
    })
    _register_like(cls, base)
    optimizer.__class__ = cls
    optimizer._hvdlite_setup()
    return optimizer


def _register_like(cls, base):
    """Make tf_keras serialize ``cls`` exactly as it serializes ``base`` (its
    public API name, or its registered custom name), so a saved model loads
    with plain tf_keras (and hvdlite's load_model re-wraps)."""
    for attr in ("_keras_api_names", "_keras_api_names_v1"):  # where tf_export keeps them
        if attr in vars(base):
            setattr(cls, attr, vars(base)[attr])
    try:
        from tf_keras.src.saving import object_registration
        names = object_registration._GLOBAL_CUSTOM_NAMES
        if base in names:
            names[cls] = names[base]
    except Exception:  # pragma: no cover - private tf_keras internals moved
        pass
