"""Gradient reduction shared by DistributedGradientTape and the Keras
DistributedOptimizer: one op per call (every dense gradient submitted to the
engine together, tf.IndexedSlices gathered in one more), stable names so the
engine's response cache and error-feedback residuals see the same tensor every
step."""
import tensorflow as tf

from .. import request
from ..compression import Compression
from ..ops import Average
from ..process_sets import global_process_set, process_set_id
from . import functions, mpi_ops

# Ops a gradient may be reduced with (Adasum runs in the engine).
_GRADIENT_OPS = (request.Average, request.Sum, request.Adasum)


class ReduceSettings:
    """How gradients are reduced. Validated once, when the wrapper is made,
    by the request layer's rules (hvdlite.request)."""

    def __init__(self, op=Average, compression=Compression.none, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=global_process_set, postscale=1.0,
                 what="DistributedGradientTape"):
        self.op = request.gradient_op(op, what, allowed=_GRADIENT_OPS)
        request.split_compression(compression, what)  # raises clearly on a bad compression object
        # A user's compress()/decompress() runs in the reduction, around an
        # uncompressed op (mpi_ops._reduce); engine compressors run in the engine.
        self.compression = compression
        self.predivide = request.predivide_factor(gradient_predivide_factor, self.op, what)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.pset = process_set_id(process_set)
        self.postscale = request.factor(postscale, "postscale", what)
        self.what = what

    def engine_op(self):
        """(reduce op, prescale, postscale) for dense tensors: with a predivide
        factor f, x / f is averaged and the average multiplied by f (the same
        average, with smaller partial sums)."""
        return request.gradient_scales(self.op, self.predivide, self.postscale)


def source_name(source):
    """The stable name of a tf.Variable or Keras Variable; "" for tensors."""
    kv = mpi_ops._keras_variable_class()
    if kv is not None and isinstance(source, kv):
        return str(source.path)
    if isinstance(source, tf.Variable):
        n = source.name
        return n[:-2] if n.endswith(":0") else n
    return ""


def _reduce_sparse(slices, names, settings):
    """tf.IndexedSlices: every rank's values and indices gathered (the
    predivide factor does not apply), values averaged and scaled here."""
    request.sparse_rule(settings.op, 1.0, 1.0, settings.what)
    values, indices = mpi_ops._gather_slices(slices, names, settings.pset)
    size = request.set_size(settings.pset)
    out = []
    for s, v, i in zip(slices, values, indices):
        if settings.op == Average:
            v = mpi_ops._average_values(v, size)
        if settings.postscale != 1.0:
            v = v * tf.cast(settings.postscale, v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


def reduce_gradients(grads, sources, settings, prefix, generic_names=False):
    """Reduces the non-None entries of ``grads`` across ranks as one group.

    ``sources`` (same length) name the gradients: the name of the i-th
    gradient is ``prefix.i.<variable path>``, identical on every rank and every
    step; with ``generic_names`` it is ``prefix.i`` (for ranks whose variables
    are named differently, e.g. Keras layers built in another order). A rank outside ``settings.process_set`` gets ``grads`` back as they are. None stays None; tf.IndexedSlices are gathered from all ranks
    (values averaged or summed), or densified and reduced with
    ``sparse_as_dense``. Returns a list like ``grads``."""
    grads = list(grads)
    if not grads:
        return grads
    if settings.pset != 0 and request.set_rank(settings.process_set) < 0:
        return grads  # a rank outside the process set keeps its own gradients (as in Horovod)
    dense, sparse, signature = [], [], []
    for i, (g, s) in enumerate(zip(grads, sources)):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and settings.sparse_as_dense:
            g = tf.convert_to_tensor(g)
        if not isinstance(g, (tf.Tensor, tf.IndexedSlices)):
            g = mpi_ops._as_tensor(g, settings.what)
        name = f"{prefix}.{i}"
        sname = None if generic_names else source_name(s)
        if sname:
            name += f".{sname}"
        if isinstance(g, tf.IndexedSlices):
            sparse.append((i, g, name))
            shape = ["sparse"] + (g.values.shape.as_list()[1:] if g.values.shape.rank else [])
            dtype = g.values.dtype.name
        else:
            dense.append((i, g, name))
            shape = g.shape.as_list() if g.shape.rank is not None else None
            dtype = g.dtype.name
        signature.append((name, shape, dtype))
    if not signature:
        return grads
    mpi_ops._start(settings.what)
    # Once per signature and process: the ranks must reduce the same list;
    # otherwise the engine would wait for tensors some ranks never send.
    functions.check_same_on_all_ranks(signature, settings.what, settings.pset,
                                      once_key=("gradients", prefix))
    out = list(grads)
    if dense:
        op, prescale, postscale = settings.engine_op()
        tensors = mpi_ops._tensors([g for _, g, _ in dense], settings.what)

        def build(xs, names, op_, pre, post, spec, grouped):
            return mpi_ops._allreduce_op(xs, names, op_, pre, post, spec, settings.pset, grouped)
        reduced = mpi_ops._reduce(build, tensors, [n for _, _, n in dense], op, prescale,
                                  postscale, settings.compression, settings.what, grouped=True)
        for (i, _, _), r in zip(dense, reduced):
            out[i] = r
    if sparse:
        reduced = _reduce_sparse([g for _, g, _ in sparse], [n for _, _, n in sparse], settings)
        for (i, _, _), r in zip(sparse, reduced):
            out[i] = r
    return out
