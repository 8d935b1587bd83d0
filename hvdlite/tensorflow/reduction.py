"""Gradient reduction shared by DistributedGradientTape and the Keras
DistributedOptimizer: one group (one engine submission, one graph node) per
call, stable names so the engine's response cache and error-feedback
residuals see the same tensor every step."""
import tensorflow as tf

from .. import exceptions
from ..compression import Compression, as_spec
from ..ops import Average, Sum
from ..process_sets import global_process_set, process_set_id
from . import functions, mpi_ops


class ReduceSettings:
    """How gradients are reduced. Validated once, when the wrapper is made."""

    def __init__(self, op=Average, compression=Compression.none, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=global_process_set, postscale=1.0,
                 what="DistributedGradientTape"):
        if op not in (Average, Sum):
            raise exceptions.InvalidArgumentError(
                f"{what}: op must be hvdlite.tensorflow.Average or Sum for gradients (got {op!r})")
        as_spec(compression)  # raises clearly on a bad compression object
        try:
            f = float(gradient_predivide_factor)
        except (TypeError, ValueError):
            raise exceptions.InvalidArgumentError(
                f"{what}: gradient_predivide_factor must be a number, not "
                f"{gradient_predivide_factor!r}") from None
        if f <= 0:
            raise exceptions.InvalidArgumentError(f"{what}: gradient_predivide_factor must be > 0, got {f}")
        if f != 1.0 and op != Average:
            raise exceptions.InvalidArgumentError(
                f"{what}: gradient_predivide_factor only applies with op=Average")
        self.op = op
        self.compression = compression
        self.predivide = f
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.pset = process_set_id(process_set)
        self.postscale = float(postscale)
        self.what = what

    def engine_op(self):
        """(reduce op, prescale, postscale) for dense tensors.

        With a predivide factor f the engine sums x / f and multiplies the sum
        by f / n: the same average, with smaller intermediate values."""
        if self.op == Average and self.predivide != 1.0:
            n = mpi_ops._set_size(self.pset)
            return Sum, 1.0 / self.predivide, self.predivide / n * self.postscale
        return self.op, 1.0, self.postscale


def source_name(source):
    """The stable name of a tf.Variable or Keras Variable; "" for tensors."""
    kv = mpi_ops._keras_variable_class()
    if kv is not None and isinstance(source, kv):
        return str(source.path)
    if isinstance(source, tf.Variable):
        n = source.name
        return n[:-2] if n.endswith(":0") else n
    return ""


def reduce_gradients(grads, sources, settings, prefix):
    """Reduces the non-None entries of ``grads`` across ranks as one group.

    ``sources`` (same length) name the gradients: the name of the i-th
    gradient is ``prefix.i.<variable path>``, identical on every rank and every
    step. None stays None; tf.IndexedSlices are gathered from all ranks
    (values averaged or summed), or densified and reduced with
    ``sparse_as_dense``. Returns a list like ``grads``."""
    grads = list(grads)
    if not grads:
        return grads
    op, prescale, postscale = settings.engine_op()
    items, positions, signature = [], [], []
    for i, (g, s) in enumerate(zip(grads, sources)):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and settings.sparse_as_dense:
            g = tf.convert_to_tensor(g)
        if not isinstance(g, (tf.Tensor, tf.IndexedSlices)):
            g = mpi_ops._as_tensor(g, settings.what)
        name = f"{prefix}.{i}"
        sname = source_name(s)
        if sname:
            name += f".{sname}"
        if isinstance(g, tf.IndexedSlices):
            # The sparse path reduces with the logical op; predivide does not apply.
            item = mpi_ops._reduce_jobs(g, name, settings.op, 1.0, settings.postscale,
                                        settings.compression, settings.pset, settings.what)
            shape = ["sparse"] + (g.values.shape.as_list()[1:] if g.values.shape.rank else [])
        else:
            item = mpi_ops._reduce_jobs(g, name, op, prescale, postscale, settings.compression,
                                        settings.pset, settings.what)
            shape = g.shape.as_list() if g.shape.rank is not None else None
        items.append(item)
        positions.append(i)
        dtype = g.dtype.name if isinstance(g, tf.Tensor) else g.values.dtype.name
        signature.append((name, shape, dtype))
    if not items:
        return grads
    mpi_ops._require_init(settings.what)
    if not tf.executing_eagerly():
        mpi_ops._check_not_xla(settings.what)
    # Once per signature and process: the ranks must reduce the same list;
    # otherwise the engine would wait for tensors some ranks never send.
    functions.check_same_on_all_ranks(signature, settings.what, settings.pset,
                                      once_key=("gradients", prefix))
    reduced = mpi_ops._run_reductions(items, settings.what)
    out = list(grads)
    for pos, r in zip(positions, reduced):
        out[pos] = r
    return out
