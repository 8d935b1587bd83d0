"""Gradient reduction shared by DistributedGradientTape and the Keras
DistributedOptimizer: one group (one engine submission, one graph node) per
call, stable names so the engine's response cache and error-feedback
residuals see the same tensor every step."""
import tensorflow as tf

from .. import request
from ..compression import Compression
from ..ops import Average
from ..process_sets import global_process_set, process_set_id
from . import functions, mpi_ops


class ReduceSettings:
    """How gradients are reduced. Validated once, when the wrapper is made,
    by the request layer's rules (hvdlite.request)."""

    def __init__(self, op=Average, compression=Compression.none, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=global_process_set, postscale=1.0,
                 what="DistributedGradientTape"):
        self.op = request.gradient_op(op, what)
        _, self.python_compressor = request.split_compression(compression, what)
        # A user's compress()/decompress() runs here, around an uncompressed reduction.
        self.compression = Compression.none if self.python_compressor else compression
        self.predivide = request.predivide_factor(gradient_predivide_factor, self.op, what)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self.pset = process_set_id(process_set)
        self.postscale = float(postscale)
        self.what = what

    def engine_op(self):
        """(reduce op, prescale, postscale) for dense tensors."""
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


def reduce_gradients(grads, sources, settings, prefix):
    """Reduces the non-None entries of ``grads`` across ranks as one group.

    ``sources`` (same length) name the gradients: the name of the i-th
    gradient is ``prefix.i.<variable path>``, identical on every rank and every
    step. A rank outside ``settings.process_set`` gets ``grads`` back as they are. None stays None; tf.IndexedSlices are gathered from all ranks
    (values averaged or summed), or densified and reduced with
    ``sparse_as_dense``. Returns a list like ``grads``."""
    grads = list(grads)
    if not grads:
        return grads
    if settings.pset != 0 and request.set_rank(settings.process_set) < 0:
        return grads  # a rank outside the process set keeps its own gradients (as in Horovod)
    op, prescale, postscale = settings.engine_op()
    items, positions, signature, contexts = [], [], [], {}
    for i, (g, s) in enumerate(zip(grads, sources)):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and settings.sparse_as_dense:
            g = tf.convert_to_tensor(g)
        if not isinstance(g, (tf.Tensor, tf.IndexedSlices)):
            g = mpi_ops._as_tensor(g, settings.what)
        if settings.python_compressor is not None and isinstance(g, tf.Tensor):
            g, contexts[i] = settings.python_compressor.compress(g)
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
        out[pos] = settings.python_compressor.decompress(r, contexts[pos]) if pos in contexts else r
    return out
