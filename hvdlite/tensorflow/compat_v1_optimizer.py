"""DistributedOptimizer for TF1-style optimizers (``tf.compat.v1.train.*``:
GradientDescentOptimizer, AdamOptimizer, MomentumOptimizer, ...), as used with
tf.compat.v1 sessions and MonitoredTrainingSession, and eagerly.

The wrapper is itself a ``tf.compat.v1.train.Optimizer``, so ``minimize``,
``compute_gradients`` and ``apply_gradients`` are called on it as on the
optimizer it wraps:

- ``compute_gradients`` returns the wrapped optimizer's gradients reduced
  across ranks (one grouped reduction per call, the Keras wrapper's
  LocalVariableReducer); with ``backward_passes_per_step`` n > 1 they are
  summed locally and reduced on every n-th call (LocalGradientAggregation);
- ``apply_gradients`` applies with the wrapped optimizer (every n-th step
  with aggregation; ``global_step`` advances on every step);
- ``op=Adasum`` combines what each rank's optimizer did to the variables
  (the change since the last combination) instead of the gradients.
"""
import contextlib

import tensorflow as tf

from .. import exceptions
from . import mpi_ops
from .aggregation import LocalGradientAggregation, LocalVariableReducer, local_state_variable
from .reduction import reduce_gradients

_V1Optimizer = tf.compat.v1.train.Optimizer


def is_v1_optimizer(optimizer):
    return isinstance(optimizer, _V1Optimizer)


def _reduction_prefix(name):
    """Engine names of one compute_gradients call: the optimizer's name
    eagerly (the same every step), a per-graph unique name while building a
    graph (two calls in one graph may run in the same session.run)."""
    return name if tf.executing_eagerly() else mpi_ops.graph_name(name)


def _graph_entered():
    """In a graph, that graph entered once more around what builds a tf.cond.
    TF1 optimizers make their slots under tf.init_scope(), which, inside the
    cond's branch, looks for the nearest entered graph; when eager execution
    was disabled after TensorFlow had already started eagerly (e.g. after
    ``hvd.init(intra_op_threads=...)``), it would otherwise find the eager
    context and make the slots there."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.compat.v1.get_default_graph().as_default()


def _result(done):
    """What apply_gradients returns, as TF1 optimizers do: an Operation in a
    graph (``sess.run(train_op)``, control dependencies), None eagerly."""
    return None if tf.executing_eagerly() else done.op


class _WrappingOptimizer(_V1Optimizer):
    """A tf.compat.v1.train.Optimizer around another: slots and variables
    are the wrapped optimizer's (it holds the state)."""

    def __init__(self, optimizer, name, use_locking):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class _DistributedOptimizer(_WrappingOptimizer):
    """Wraps a tf.compat.v1.train.Optimizer: gradients are reduced across
    ranks in compute_gradients, applied by the wrapped optimizer."""

    def __init__(self, optimizer, options, name=None, use_locking=False):
        super().__init__(optimizer, name or f"Distributed{type(optimizer).__name__}",
                         use_locking)
        self._reducer = LocalVariableReducer(options.settings, options.scale_local_gradients,
                                             prefix=self.get_name())
        self._agg_helper = None
        if options.backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregation(
                options.backward_passes_per_step, self._reducer,
                options.average_aggregated_gradients)

    def register_local_var(self, var):
        """Gradients of ``var`` are not reduced: each rank applies its own
        (divided by the number of ranks unless scale_local_gradients=False)."""
        self._reducer.register_local_var(var)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients
        reduced across ranks (or summed locally, see backward_passes_per_step)."""
        grads_and_vars = list(self._optimizer.compute_gradients(*args, **kwargs))
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        self._reducer.prefix = _reduction_prefix(self.get_name())
        if self._agg_helper is not None:
            reduced = self._agg_helper.compute_gradients(grads, variables)
        else:
            reduced = self._reducer(grads, variables)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's apply_gradients; with backward_passes_per_step
        only on the steps whose gradients were reduced, the others advance
        ``global_step`` alone (so it counts every step, as hooks expect)."""
        if self._agg_helper is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        grads_and_vars = list(grads_and_vars)  # a zip would be consumed by the first look

        def apply():
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)

        def advance_global_step():
            if global_step is None:
                return []
            return [global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype))]

        with _graph_entered():
            return _result(self._agg_helper.apply_gradients(
                apply, advance_global_step, [g for g, _ in grads_and_vars]))


class _AdasumDeltas:
    """The bookkeeping of one set of variables under op=Adasum: a step
    counter and, per variable, its value after the last combination."""

    def __init__(self, variables):
        self.counter = local_state_variable(lambda: tf.constant(0, tf.int64), "adasum_step")
        self.starts = [local_state_variable(
            lambda v=v: tf.zeros(v.shape, v.dtype.base_dtype), "adasum_start") for v in variables]


class _DistributedAdasumOptimizer(_WrappingOptimizer):
    """op=Adasum: each rank applies its own gradients with the wrapped
    optimizer; every ``backward_passes_per_step``-th step the change each
    variable went through since the last combination is combined across
    ranks with Adasum, and every rank sets the variable to its value at the
    last combination plus the combined change."""

    def __init__(self, optimizer, options, name=None, use_locking=False):
        super().__init__(optimizer, name or f"DistributedDelta{type(optimizer).__name__}",
                         use_locking)
        self._settings = options.settings
        self._passes = options.backward_passes_per_step
        self._deltas = {}  # variable refs -> _AdasumDeltas

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's own gradients (each rank steps on its own)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def _state(self, variables):
        key = tuple(v.ref() for v in variables)
        state = self._deltas.get(key)
        if state is None:
            state = self._deltas[key] = _AdasumDeltas(variables)
        return state

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's step, then (every n-th step) the Adasum
        combination of the changes."""
        with _graph_entered():
            return self._apply_and_combine(list(grads_and_vars), global_step, name)

    def _apply_and_combine(self, grads_and_vars, global_step, name):
        variables = [v for g, v in grads_and_vars if g is not None]
        if not variables:  # the wrapped optimizer says what is wrong
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        state = self._state(variables)
        prefix = _reduction_prefix(self.get_name())

        def capture_starts():  # the first step starts from the (broadcast) values
            return tf.group(*[s.assign(v.read_value()) for s, v in zip(state.starts, variables)])

        first = tf.cond(tf.equal(state.counter.read_value(), 0), capture_starts, tf.no_op)
        with tf.control_dependencies([first]):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                     name=name)
        with tf.control_dependencies([update] if update is not None else []):
            count = tf.identity(state.counter.assign_add(1))

        def combine():
            deltas = [v.read_value() - s.read_value() for v, s in zip(variables, state.starts)]
            combined = reduce_gradients(deltas, variables, self._settings, prefix)
            starts = [tf.identity(s.assign_add(c)) for s, c in zip(state.starts, combined)]
            with tf.control_dependencies(starts):
                assigns = [v.assign(s) for v, s in zip(variables, starts)]
            with tf.control_dependencies(assigns):
                return tf.constant(True)

        return _result(tf.cond(tf.equal(count % self._passes, 0), combine,
                               lambda: tf.constant(False)))


def make_distributed(optimizer, options, name=None, use_locking=False):
    """The distributed wrapper of a tf.compat.v1.train.Optimizer."""
    if isinstance(optimizer, _WrappingOptimizer):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer: this optimizer is already distributed; wrap it only once")
    if name is not None and not isinstance(name, str):
        raise exceptions.InvalidArgumentError(
            f"DistributedOptimizer: name must be a str, not {type(name).__name__}")
    if options.settings.op == mpi_ops.Adasum:
        if options.average_aggregated_gradients:
            raise exceptions.InvalidArgumentError(
                "DistributedOptimizer: op=Adasum combines the changes the optimizer made, not "
                "gradients; average_aggregated_gradients=True does not apply")
        return _DistributedAdasumOptimizer(optimizer, options, name, use_locking)
    return _DistributedOptimizer(optimizer, options, name, use_locking)
