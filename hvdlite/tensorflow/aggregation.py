"""What Horovod's DistributedOptimizers (Keras and tf.compat.v1) do around
the reduction:

- local variables (``register_local_var``, ``PartialDistributedOptimizer``):
  their gradients are not reduced; with ``scale_local_gradients`` they are
  divided by the number of ranks, so a local step has the size of a shared
  one (an average of a sum over ranks);
- ``backward_passes_per_step`` n: gradients are summed locally over n calls,
  the sum is reduced on the n-th, and the optimizer applies only then
  (``average_aggregated_gradients`` divides the reduced sum by n).

Both run eagerly, inside tf.function and in TF1 graphs: the decisions are
``tf.cond`` on a counter variable, identical on every rank because every rank
counts the same calls, so the reduction runs on the same steps everywhere.
Explicit control dependencies order the reads and writes where no automatic
ones exist (TF1 graphs).
"""
import tensorflow as tf

from .. import exceptions, request
from .reduction import reduce_gradients


def _ref(variable):
    """A hashable key for a tf.Variable (its ref) or a Keras 3 Variable (its id)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def local_state_variable(initial_value, name):
    """A non-trainable variable holding this rank's bookkeeping, made outside
    any function being traced (``initial_value`` is a function, run there
    too). In a tf.compat.v1 graph it goes to the LOCAL_VARIABLES collection
    only, as Horovod's: ``tf.compat.v1.local_variables_initializer()`` (which
    MonitoredTrainingSession runs) initializes it, and checkpoints leave it out."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return tf.Variable(initial_value(), trainable=False, name=name)
        return tf.compat.v1.Variable(initial_value(), trainable=False, name=name,
                                     use_resource=True,
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


def _after(ops, make):
    """``make()`` with control dependencies on ``ops`` (no-op eagerly)."""
    with tf.control_dependencies([op for op in ops if op is not None]):
        return make()


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


class LocalVariableReducer:
    """Reduces a list of gradients across ranks, except those of variables
    registered as local."""

    def __init__(self, settings, scale_local_gradients=True, prefix="opt"):
        self.settings = settings
        self.scale_local_gradients = bool(scale_local_gradients)
        self.prefix = prefix
        self._local = {}  # key -> variable (kept alive so an id() key stays valid)

    def register_local_var(self, variable):
        """Gradients of ``variable`` stay on this rank (not reduced)."""
        self._local[_ref(variable)] = variable

    def is_local(self, variable):
        return variable is not None and _ref(variable) in self._local

    def __call__(self, grads, variables):
        grads, variables = list(grads), list(variables)
        shared = [i for i, v in enumerate(variables) if not self.is_local(v)]
        reduced = reduce_gradients([grads[i] for i in shared], [variables[i] for i in shared],
                                   self.settings, self.prefix)
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self.scale_local_gradients and len(shared) < len(grads):
            factor = 1.0 / request.set_size(self.settings.process_set)
            for i, (g, v) in enumerate(zip(grads, variables)):
                if g is not None and self.is_local(v):
                    out[i] = _scale(g, factor)
        return out


class LocalGradientAggregation:
    """``backward_passes_per_step`` with Horovod's semantics (see module doc).

    ``counter`` counts the calls since the last reduction; ``apply_gradients``
    applies when it is back at 0 (the reduction just happened) and otherwise
    runs only the bookkeeping its caller gives (advancing a step count).
    ``new_variable(initial_value, name)`` makes the counter and the sums,
    when first needed (so in the graph the gradients are built in)."""

    def __init__(self, backward_passes_per_step, reducer, average_aggregated_gradients=False,
                 new_variable=local_state_variable):
        self.backward_passes_per_step = backward_passes_per_step
        self.reducer = reducer
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self._new_variable = new_variable
        self._counter = None
        self._sums = {}

    @property
    def counter(self):
        if self._counter is None:
            self._counter = self._new_variable(lambda: tf.constant(0, tf.int32),
                                               "aggregation_counter")
        return self._counter

    def register_local_var(self, variable):
        self.reducer.register_local_var(variable)

    def _dense(self, grad):
        if isinstance(grad, tf.IndexedSlices):
            if not self.reducer.settings.sparse_as_dense:
                raise exceptions.InvalidArgumentError(
                    "DistributedOptimizer: backward_passes_per_step > 1 accumulates gradients in "
                    "dense variables, so sparse (tf.IndexedSlices) gradients need "
                    "sparse_as_dense=True")
            return tf.convert_to_tensor(grad)
        return grad

    def _sum_variable(self, index, grad, variable):
        key = _ref(variable) if variable is not None else index
        acc = self._sums.get(key)
        if acc is None:
            shape = grad.shape if grad.shape.is_fully_defined() else variable.shape
            dtype = grad.dtype
            acc = self._new_variable(lambda: tf.zeros(shape, dtype), "aggregated_gradient")
            self._sums[key] = acc
        return acc

    def _restart(self):
        """Counter and sums back to 0; returns the assignments."""
        return [self.counter.assign(0, read_value=False)] + [
            acc.assign(tf.zeros_like(acc), read_value=False) for acc in self._sums.values()]

    def compute_gradients(self, grads, variables):
        """Adds ``grads`` to the local sums; on every n-th call returns the
        reduced sums (and restarts), otherwise the local sums so far."""
        grads, variables = [self._dense(g) for g in grads], list(variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        # identity: the value after this addition (eagerly, assign_add's
        # result would read the variable later, after a restart)
        sums = [tf.identity(self._sum_variable(i, grads[i], variables[i]).assign_add(grads[i]))
                for i in present]
        count = _after(sums, lambda: tf.identity(self.counter.assign_add(1)))
        n = self.backward_passes_per_step

        def reduce_and_restart():
            reduced = self.reducer(sums, [variables[i] for i in present])
            if self.average_aggregated_gradients:
                reduced = [g / tf.cast(n, g.dtype) for g in reduced]
            restart = _after(reduced, self._restart)
            return _after(restart, lambda: [tf.identity(g) for g in reduced])

        def restart_only():
            return _after(self._restart(), lambda: tf.constant(True))

        if not present:
            tf.cond(tf.equal(count, n), restart_only, lambda: tf.constant(False))
            return list(grads)
        result = tf.cond(tf.equal(count, n), reduce_and_restart, lambda: list(sums))
        if not isinstance(result, (list, tuple)):
            result = [result]
        out = [None] * len(grads)
        for i, g in zip(present, result):
            out[i] = g
        return out

    def apply_gradients(self, apply, skip, grads):
        """Runs ``apply()`` on the steps whose gradients were reduced (counter
        back at 0); on the others ``skip()``, which returns the ops to run
        instead (e.g. advancing the optimizer's ``iterations``).
        ``grads`` (from compute_gradients) are waited for first."""
        def run_apply():
            result = apply()
            ops = [r for r in tf.nest.flatten(result) if isinstance(r, (tf.Tensor, tf.Operation))]
            return _after(ops, lambda: tf.constant(True))

        def skip_step():
            return _after(skip(), lambda: tf.constant(False))

        ready = [g for g in grads if isinstance(g, tf.Tensor)]
        pred = _after(ready, lambda: tf.equal(self.counter.read_value(), 0))
        return tf.cond(pred, run_apply, skip_step)
