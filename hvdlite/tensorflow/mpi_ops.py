"""Collectives on tf.Tensor / tf.Variable: eagerly, in tf.function and in
tf.compat.v1 graphs.

Every collective is an op of hvdlite's TensorFlow op library
(hvdlite/tensorflow/ops/, built and loaded by :mod:`.op_library`). Its kernels
are asynchronous: they hand the tensors to the engine and return, and the
engine's completion fills the outputs. So any number of independent
collectives may run in one ``session.run`` or function, in any order, and
errors reach TensorFlow with Horovod's classes (``tf.errors.InvalidArgumentError``
for bad input, ``FailedPreconditionError`` when ranks disagree, ``AbortedError``
once the engine has stopped). Argument rules come from :mod:`hvdlite.request`,
shared with the other front ends; gradients follow Horovod's rules as
:mod:`hvdlite.collectives` describes them.

Engine names: an explicit ``name=`` is used as given. Otherwise eager calls
let the engine number them (ranks make the same calls in the same order), and
ops built into a graph get a name fixed when the graph is built (see
:func:`graph_name`), since graph nodes may run in any order.
"""
import sys
import threading

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_framework_ops
from tensorflow.python.ops import control_flow_util as _control_flow_util

from .. import _binding, collectives, exceptions, request
from ..compression import Compression, as_spec
from ..process_sets import global_process_set
from ..request import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from . import op_library
from .util import _executing_eagerly

_ops = op_library.load()

# Public entry points are not converted by autograph when called from a
# user's tf.function: they contain no tensor-dependent Python control flow,
# and unconverted code lets hvdlite's own exceptions reach the user unchanged.
_not_converted = tf.autograph.experimental.do_not_convert
_NO_COMPRESSION = as_spec(None)


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

def _keras_variable_class():
    keras = sys.modules.get("keras")
    return None if keras is None else getattr(keras, "Variable", None)


def is_tf_value(x):
    """True for what the collectives accept: tf.Tensor, tf.Variable, a Keras
    Variable (TF backend) or tf.IndexedSlices."""
    if isinstance(x, (tf.Tensor, tf.Variable, tf.IndexedSlices)):
        return True
    kv = _keras_variable_class()
    return kv is not None and isinstance(x, kv)


def _as_tensor(x, what):
    if isinstance(x, tf.Tensor):
        return x
    if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):
        raise exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.{what}: {type(x).__name__} is not supported; convert it to a "
            "dense tf.Tensor first (tf.sparse.to_dense / RaggedTensor.to_tensor)")
    if is_tf_value(x):
        return tf.convert_to_tensor(x)
    if type(x).__module__ == "numpy":
        hint = f"for NumPy arrays use hvdlite.{what}, or pass tf.convert_to_tensor(array)"
    else:
        hint = "wrap the value with tf.constant(...) first"
    raise exceptions.InvalidArgumentError(
        f"hvdlite.tensorflow.{what} takes a tf.Tensor or tf.Variable, not "
        f"{type(x).__module__}.{type(x).__name__}; {hint}")


def _tensors(xs, what):
    """Tensors of a collective, with dtypes the engine takes."""
    out = [_as_tensor(x, what) for x in xs]
    for t in out:
        request.dtype_code(t.dtype.name, f"hvdlite.tensorflow.{what}")
    return out


def _set_size(process_set):
    return request.set_size(process_set)


def set_root(root_rank, process_set, what):
    """Horovod's root_rank is a global rank; the op wants the position in the
    process set (validated, with a clear error for non-members)."""
    return request.root_in_set(root_rank, process_set, f"hvdlite.tensorflow.{what}")


def _require_init(what):
    if not _binding.lib.hvd_is_initialized():
        raise exceptions.NotInitializedError(
            f"hvdlite.tensorflow.{what}: hvdlite is not initialised; call hvdlite.tensorflow.init() first")


def in_xla_context():
    """True while tracing a function that XLA will compile (jit_compile=True)."""
    if tf.executing_eagerly():
        return False
    graph = _tf_framework_ops.get_default_graph()
    return bool(_control_flow_util.GraphOrParentsInXlaContext(graph))


def _check_not_xla(what):
    if in_xla_context():
        raise exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.{what} cannot run inside an XLA-compiled function "
            "(jit_compile=True): hvdlite's collectives are TensorFlow ops with CPU kernels only, "
            "which XLA cannot compile. Use jit_compile=False for the function that communicates; "
            "with Keras, model.compile(..., jit_compile=False), or add "
            "hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback, which turns it "
            "off with a warning.")


def _start(what):
    _require_init(what)
    if not tf.executing_eagerly():
        _check_not_xla(what)


# --------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------

_graph_counter_lock = threading.Lock()


def _outermost_graph():
    graph = _tf_framework_ops.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def graph_name(kind):
    """A name for an unnamed collective built into a graph.

    Graph nodes run in any order, so the engine cannot number them as they
    arrive; the name is fixed when the graph is built instead: the outermost
    graph's name plus a counter of hvdlite ops built into it. Both are the
    same on every rank building the same graph, and again after a retrace."""
    graph = _outermost_graph()
    with _graph_counter_lock:
        count = getattr(graph, "_hvdlite_node_count", 0)
        graph._hvdlite_node_count = count + 1
    return f"tf.{getattr(graph, 'name', 'graph')}.{kind}.{count}"


def _names(name, n, kind, grouped):
    """Engine names of an op's ``n`` tensors ([] lets the engine name them)."""
    if name is None:
        if tf.executing_eagerly():
            return []
        name = graph_name(kind)
    name = str(name)
    return [f"{name}.{i}" for i in range(n)] if grouped else [name] * n


def _suffixed(names, suffix):
    return [f"{n}.{suffix}" for n in names]


# --------------------------------------------------------------------------
# Op builders (also used by the gradients): tensors -> op outputs
# --------------------------------------------------------------------------

# The op (single tensor, grouped) of each engine collective.
_OP_OF = {
    _binding.ALLREDUCE: (_ops.hvdlite_allreduce, _ops.hvdlite_grouped_allreduce),
    _binding.ALLGATHER: (_ops.hvdlite_allgather, _ops.hvdlite_grouped_allgather),
    _binding.BROADCAST: (_ops.hvdlite_broadcast, _ops.hvdlite_grouped_broadcast),
    _binding.REDUCESCATTER: (_ops.hvdlite_reducescatter, _ops.hvdlite_grouped_reducescatter),
    _binding.ALLTOALL: (_ops.hvdlite_alltoall, None),
}

# Request fields that travel as op attributes (named as Horovod's ops name
# them); the kernel copies them into each tensor's engine request.
_ATTR_OF = {"reduce_op": "reduce_op", "prescale": "prescale_factor",
            "postscale": "postscale_factor", "root_rank": "root_rank",
            "process_set": "process_set_id"}


def _request_attrs(req):
    """The op attributes of a request from :mod:`hvdlite.collectives` (dtype,
    shape and name are the tensors' own, filled by the kernel)."""
    attrs = {_ATTR_OF[k]: v for k, v in req.items() if k in _ATTR_OF}
    if "compression" in req:
        code, ratio, error_feedback, config = req["compression"]
        attrs.update(compression=int(code), topk_ratio=float(ratio),
                     error_feedback=bool(error_feedback), compression_config=int(config))
    return attrs


def _run(req, tensors, names, grouped, *more_inputs):
    """The op of request ``req`` over ``tensors``; a list of its outputs."""
    single, group = _OP_OF[req["op"]]
    attrs = _request_attrs(req)
    if grouped:
        return list(group(tensors, tensor_names=names, **attrs))
    out = single(tensors[0], *more_inputs, tensor_names=names, **attrs)
    return [out] if isinstance(out, tf.Tensor) else list(out)


# The request layer's requests of a TensorFlow op: the kernel describes each
# tensor itself, so dtype code, shape and name are left out here.
_NO_TENSOR = (None, (), None)


def _allreduce_op(tensors, names, op, prescale, postscale, spec, pset, grouped):
    req = collectives.allreduce_request(*_NO_TENSOR, op, prescale, postscale, spec, pset,
                                        "hvdlite.tensorflow.allreduce")
    return _run(req, tensors, names, grouped)


def _allgather_op(tensors, names, pset, grouped):
    return _run(collectives.allgather_request(*_NO_TENSOR, pset), tensors, names, grouped)


def _broadcast_op(tensors, names, root_rank, pset, grouped, what="broadcast"):
    """``root_rank`` is a global rank, as in Horovod."""
    req = collectives.broadcast_request(*_NO_TENSOR, root_rank, pset, f"hvdlite.tensorflow.{what}")
    return _run(req, tensors, names, grouped)


def _reducescatter_op(tensors, names, op, prescale, postscale, spec, pset, grouped):
    req = collectives.reducescatter_request(*_NO_TENSOR, op, prescale, postscale, spec, pset,
                                            "hvdlite.tensorflow.reducescatter")
    return _run(req, tensors, names, grouped)


def _alltoall_op(tensor, splits, names, pset):
    """(rows received, rows received from each rank); ``splits`` is a tensor
    (the kernel reads it when it runs)."""
    req = collectives.alltoall_request(*_NO_TENSOR, None, pset, "hvdlite.tensorflow.alltoall")
    return tuple(_run(req, [tensor], names, False, splits))


# --------------------------------------------------------------------------
# Reductions with compression
# --------------------------------------------------------------------------

def _reduce(build, tensors, names, op, prescale, postscale, compression, what, grouped):
    """Runs ``build`` (an allreduce or reducescatter builder) over dense
    tensors with ``compression``: an engine compressor as the op's attribute
    (one op per kind of tensor, compressible or not), or a user's compressor
    applied here around an uncompressed op."""
    for t in tensors:
        request.check_reduction(op, t.dtype.name, f"hvdlite.tensorflow.{what}")
    prescale = request.factor(prescale, "prescale_factor", what)
    postscale = request.factor(postscale, "postscale_factor", what)
    spec, python_compressor = request.split_compression(compression, what)
    contexts = None
    if python_compressor is not None:
        pairs = [python_compressor.compress(t) for t in tensors]
        tensors, contexts = [p[0] for p in pairs], [p[1] for p in pairs]
    parts = [[i for i, t in enumerate(tensors) if request.compresses(spec, t.dtype.name) == flag]
             for flag in (True, False)]
    outs = [None] * len(tensors)
    for indices, part_spec in zip(parts, (spec, _NO_COMPRESSION)):
        if not indices:
            continue
        part_names = [names[i] for i in indices] if names else []
        results = build([tensors[i] for i in indices], part_names, op, prescale, postscale,
                        part_spec, grouped)
        for i, r in zip(indices, results):
            outs[i] = r
    if contexts is not None:
        outs = [python_compressor.decompress(o, c) for o, c in zip(outs, contexts)]
    return outs


def _gather_slices(slices, names, pset):
    """Every rank's (values, indices) of each tf.IndexedSlices, in one op."""
    values = _tensors([s.values for s in slices], "allreduce")
    indices = _tensors([s.indices for s in slices], "allreduce")
    gathered = _allgather_op(values + indices,
                             _suffixed(names, "values") + _suffixed(names, "indices")
                             if names else [], pset, grouped=True)
    n = len(slices)
    return gathered[:n], gathered[n:]


def _average_values(values, size):
    """Horovod's Average of sparse values: divided by the set size with
    TensorFlow's true division (integer values become floating point)."""
    return tf.math.truediv(values, tf.cast(size, values.dtype))


def _sparse_allreduce(slices, names, op, prescale, postscale, pset, what):
    request.sparse_rule(op, prescale, postscale, f"hvdlite.tensorflow.{what}")
    values, indices = _gather_slices(slices, names, pset)
    size = request.set_size(pset)
    out = []
    for s, v, i in zip(slices, values, indices):
        if op == Average:
            v = _average_values(v, size)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


def _reduce_mixed(tensors, name, op, prescale, postscale, compression, pset, what, grouped):
    """Dense tensors in one reducing op, tf.IndexedSlices gathered; results in order."""
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    names = _names(name, len(tensors), "allreduce", grouped)
    outs = [None] * len(tensors)
    if sparse:
        for i, r in zip(sparse, _sparse_allreduce([tensors[i] for i in sparse],
                                                  [names[i] for i in sparse] if names else [],
                                                  op, prescale, postscale, pset, what)):
            outs[i] = r
    if dense:
        ts = _tensors([tensors[i] for i in dense], what)

        def build(xs, ns, op_, pre, post, spec, grouped_):
            return _allreduce_op(xs, ns, op_, pre, post, spec, pset, grouped_)
        results = _reduce(build, ts, [names[i] for i in dense] if names else [], op, prescale,
                          postscale, compression, what, grouped)
        for i, r in zip(dense, results):
            outs[i] = r
    return outs


# --------------------------------------------------------------------------
# Public collectives
# --------------------------------------------------------------------------

@_not_converted
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces ``tensor`` over the ranks of ``process_set`` (default: average).

    ``tensor`` is a tf.Tensor, tf.Variable or tf.IndexedSlices (every rank's
    values and indices are gathered; Sum or Average only, without pre/postscale,
    as in Horovod). ``device_dense``/``device_sparse``/``ignore_name_scope`` are
    accepted for Horovod compatibility and ignored."""
    what = "allreduce"
    op = request.resolve_op(op, average, f"hvdlite.tensorflow.{what}")
    _start(what)
    return _reduce_mixed([tensor], name, op, prescale_factor, postscale_factor, compression,
                         request.set_id(process_set), what, grouped=False)[0]


@_not_converted
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces a list of tensors (dense and tf.IndexedSlices may mix) as one
    op, submitted to the engine together so it can fuse them. Returns a list."""
    what = "grouped_allreduce"
    if not isinstance(tensors, (list, tuple)):
        raise exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.{what} takes a list of tensors, not {type(tensors).__name__}")
    op = request.resolve_op(op, average, f"hvdlite.tensorflow.{what}")
    if not tensors:
        return list(tensors)
    _start(what)
    return _reduce_mixed(list(tensors), name, op, prescale_factor, postscale_factor, compression,
                         request.set_id(process_set), what, grouped=True)


@_not_converted
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension (which
    may differ by rank; the others must agree). A scalar counts as one row."""
    _start("allgather")
    t = _tensors([tensor], "allgather")
    return _allgather_op(t, _names(name, 1, "allgather", False), request.set_id(process_set),
                         grouped=False)[0]


@_not_converted
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """allgather of each tensor of a list, as one op; returns a list."""
    _start("grouped_allgather")
    ts = _tensors(tensors, "grouped_allgather")
    if not ts:
        return []
    return _allgather_op(ts, _names(name, len(ts), "grouped_allgather", True),
                         request.set_id(process_set), grouped=True)


@_not_converted
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns ``root_rank``'s ``tensor`` on every rank of the set
    (``root_rank`` is a global rank, as in Horovod)."""
    _start("broadcast")
    t = _tensors([tensor], "broadcast")
    pset = request.set_id(process_set)
    return _broadcast_op(t, _names(name, 1, "broadcast", False), root_rank, pset,
                         grouped=False)[0]


def _is_resource_variable(v):
    from tensorflow.python.ops import resource_variable_ops
    return resource_variable_ops.is_resource_variable(v)


@_not_converted
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns ``root_rank``'s values to ``variables`` (tf.Variable, resource
    or tf.compat.v1 reference variables) on every rank; returns their new
    values. One op for the whole list."""
    what = "broadcast_"
    variables = list(variables)
    for v in variables:
        if not isinstance(v, tf.Variable):
            raise exceptions.InvalidArgumentError(
                f"hvdlite.tensorflow.{what} takes tf.Variable objects, not "
                f"{type(v).__module__}.{type(v).__name__}; use broadcast() for tensors")
    _start(what)
    if not variables:
        return []
    pset = request.set_id(process_set)
    values = _tensors([v.value() for v in variables], what)
    results = _broadcast_op(values, _names(name, len(values), what, True), root_rank, pset,
                            grouped=True, what=what)
    if tf.executing_eagerly():
        for v, r in zip(variables, results):
            v.assign(r)
        return [v.read_value() for v in variables]
    assigns = [v.assign(r, read_value=False) for v, r in zip(variables, results)]
    with tf.control_dependencies(assigns):
        return [v.read_value() if _is_resource_variable(v) else tf.identity(v) for v in variables]


def _splits_tensor(splits, what):
    """Alltoall splits as an int32/int64 tensor (empty: equal parts)."""
    if splits is None:
        return tf.constant([], dtype=tf.int32)
    if isinstance(splits, (tf.Tensor, tf.Variable)):
        if splits.dtype not in (tf.int32, tf.int64):
            raise exceptions.UnsupportedDTypeError(
                f"hvdlite.tensorflow.{what}: splits must be an int32 or int64 tensor, not "
                f"{splits.dtype.name}")
        return tf.convert_to_tensor(splits)
    return tf.constant(request.splits_list(splits, f"hvdlite.tensorflow.{what}"), dtype=tf.int64)


@_not_converted
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends ``splits[i]`` rows of ``tensor`` (in order) to rank i and returns
    the rows received, concatenated in rank order. Without ``splits`` the first
    dimension is divided equally (it must divide by the set size). With
    ``splits``, returns ``(rows, received_splits)`` as Horovod does: int32 rows
    received from each rank."""
    what = "alltoall"
    _start(what)
    t = _tensors([tensor], what)[0]
    out, received = _alltoall_op(t, _splits_tensor(splits, what), _names(name, 1, what, False),
                                 request.set_id(process_set))
    return out if splits is None else (out, received)


def _reducescatter_builder(pset):
    def build(xs, names, op, pre, post, spec, grouped):
        return _reducescatter_op(xs, names, op, pre, post, spec, pset, grouped)
    return build


@_not_converted
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over ranks and returns this rank's block of rows
    (rows split as evenly as possible, earlier ranks taking one more)."""
    what = "reducescatter"
    op = request.resolve_op(op, None, f"hvdlite.tensorflow.{what}")
    _start(what)
    t = _tensors([tensor], what)
    pset = request.set_id(process_set)
    return _reduce(_reducescatter_builder(pset), t, _names(name, 1, what, False), op,
                   prescale_factor, postscale_factor, compression, what, grouped=False)[0]


@_not_converted
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None, ignore_name_scope=False):
    """reducescatter of each tensor of a list, as one op; returns a list."""
    what = "grouped_reducescatter"
    op = request.resolve_op(op, None, f"hvdlite.tensorflow.{what}")
    _start(what)
    ts = _tensors(tensors, what)
    if not ts:
        return []
    pset = request.set_id(process_set)
    return _reduce(_reducescatter_builder(pset), ts, _names(name, len(ts), what, True), op,
                   prescale_factor, postscale_factor, compression, what, grouped=True)


@_not_converted
def barrier(process_set=global_process_set):
    """Returns once every rank of the set has reached it (eagerly: None; in a
    graph: the op to run)."""
    _start("barrier")
    result = _ops.hvdlite_barrier(process_set_id=request.set_id(process_set))
    return None if tf.executing_eagerly() else result


@_not_converted
def join(device=""):
    """Marks this rank as done with its data (uneven inputs): while other
    ranks go on, it takes part in their allreduces with zeros. Completes once
    every rank has joined and returns the rank that joined last, as an int32
    scalar tensor."""
    _start("join")
    return _ops.hvdlite_join(process_set_id=0)


def size_op(process_set_id=0, name=None):
    """The number of ranks of the process set, as an int32 tensor."""
    return tf.constant(_set_size(process_set_id), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(_binding.check(_binding.lib.hvd_rank()), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(_binding.check(_binding.lib.hvd_local_rank()), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(_binding.check(_binding.lib.hvd_local_size()), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    rank_in_set = _binding.lib.hvd_process_set_rank(process_set_id)
    return tf.constant(1 if rank_in_set >= 0 else 0, dtype=tf.int32, name=name)


# --------------------------------------------------------------------------
# Gradients (Horovod's rules)
# --------------------------------------------------------------------------

def _grad_names(kind, n, grouped):
    return _names(None, n, f"grad.{kind}", grouped)


def _dense(grads, op):
    """Incoming gradients as dense tensors; zeros for outputs without one
    (every rank must still take part in the gradient's collective)."""
    out = []
    for i, g in enumerate(grads):
        if g is None:
            g = tf.zeros_like(op.outputs[i])
        elif isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        out.append(g)
    return out


def _reduce_attrs_of(op):
    return (op.get_attr("reduce_op"), op.get_attr("prescale_factor"),
            op.get_attr("postscale_factor"))


class _Gradients(collectives.GradientOps):
    """The gradient rules' collectives (:mod:`hvdlite.collectives`) as ops
    built into the graph of the forward op ``op``, named after ``kind``."""

    def __init__(self, op, kind, grouped_type):
        self.op = op
        self.kind = kind
        self.pset = op.get_attr("process_set_id")
        self.grouped = op.type == grouped_type

    def allreduce(self, grads, reduce_op, prescale, postscale):
        return _allreduce_op(grads, _grad_names(self.kind, len(grads), self.grouped), reduce_op,
                             prescale, postscale, _NO_COMPRESSION, self.pset, self.grouped)

    def allgather(self, grads):
        return _allgather_op(grads, _grad_names(self.kind, len(grads), self.grouped), self.pset,
                             self.grouped)

    def alltoall(self, grad, splits):
        return _alltoall_op(grad, splits, _grad_names(self.kind, 1, False), self.pset)[0]

    def own_rows(self, reduced):
        inputs = self.op.inputs
        rows = [tf.reshape(tf.shape(x)[0], [1]) if x.shape.rank != 0 else tf.ones([1], tf.int32)
                for x in inputs]
        counts = _allgather_op(rows, _grad_names(self.kind + ".rows", len(rows), self.grouped),
                               self.pset, self.grouped)
        size, me = request.set_size(self.pset), request.set_rank(self.pset)
        out = []
        for x, g, c in zip(inputs, reduced, counts):
            mine = tf.split(g, tf.reshape(c, [size]), num=size, axis=0)[me]
            out.append(tf.reshape(mine, tf.shape(x)) if x.shape.rank == 0 else mine)
        return out

    def times(self, grads, factor):
        return [g * tf.cast(factor, g.dtype) for g in grads]


def _allreduce_grad(op, *grads):
    reduce_op, pre, post = _reduce_attrs_of(op)
    return collectives.allreduce_grad(_Gradients(op, "allreduce", "HvdliteGroupedAllreduce"),
                                      _dense(grads, op), reduce_op, pre, post)


def _allgather_grad(op, *grads):
    return collectives.allgather_grad(_Gradients(op, "allgather", "HvdliteGroupedAllgather"),
                                      _dense(grads, op))


def _broadcast_grad(op, *grads):
    g = _Gradients(op, "broadcast", "HvdliteGroupedBroadcast")
    return collectives.broadcast_grad(g, _dense(grads, op),
                                      request.set_rank(g.pset) == op.get_attr("root_rank"))


def _alltoall_grad(op, grad, _received_splits_grad):
    back = collectives.alltoall_grad(_Gradients(op, "alltoall", None), _dense([grad], op)[0],
                                     op.outputs[1])
    return [back, None]


def _reducescatter_grad(op, *grads):
    g = _Gradients(op, "reducescatter", "HvdliteGroupedReducescatter")
    reduce_op, pre, post = _reduce_attrs_of(op)
    return collectives.reducescatter_grad(g, _dense(grads, op), reduce_op, pre, post,
                                          request.set_size(g.pset))


for _type, _fn in (("HvdliteAllreduce", _allreduce_grad),
                   ("HvdliteGroupedAllreduce", _allreduce_grad),
                   ("HvdliteAllgather", _allgather_grad),
                   ("HvdliteGroupedAllgather", _allgather_grad),
                   ("HvdliteBroadcast", _broadcast_grad),
                   ("HvdliteGroupedBroadcast", _broadcast_grad),
                   ("HvdliteAlltoall", _alltoall_grad),
                   ("HvdliteReducescatter", _reducescatter_grad),
                   ("HvdliteGroupedReducescatter", _reducescatter_grad)):
    tf.RegisterGradient(_type)(_fn)
for _type in ("HvdliteBarrier", "HvdliteJoin"):
    tf.no_gradient(_type)


__all__ = [
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "allreduce", "grouped_allreduce",
    "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
    "grouped_reducescatter", "barrier", "join", "size_op", "rank_op", "local_rank_op",
    "local_size_op", "process_set_included_op", "is_tf_value", "in_xla_context", "graph_name",
    "_executing_eagerly",
]
