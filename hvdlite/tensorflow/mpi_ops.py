"""Collectives on tf.Tensor / tf.Variable, eagerly and inside tf.function.

Every public call builds a *group* of engine jobs and runs it in one of two
ways:

- eagerly: the inputs are handed to the engine as NumPy views of the tensors'
  own buffers (no copy), and the results come back to TF through DLPack from
  64-byte aligned buffers (no copy either);
- inside a graph (tf.function, compiled Keras): the whole group becomes one
  ``tf.numpy_function(..., stateful=True)`` node. Stateful, so TF neither
  prunes nor reorders it (auto control dependencies run hvdlite nodes in
  program order on every rank), and the static shapes are restored with
  ``set_shape``.

Allreduce and broadcast write into separate, freshly allocated output buffers,
never into the input: TF may let several tensors share one buffer.
"""
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as _tf_framework_ops
from tensorflow.python.ops import control_flow_util as _control_flow_util

from .. import _binding, exceptions
from ..compression import Compression, NoneCompressor, as_spec
from ..ops import Average, Max, Min, Product, Sum
from ..process_sets import global_process_set, process_set_id, set_root_rank

_ALIGN = 64
# Public entry points are not converted by autograph when called from a
# user's tf.function: they contain no tensor-dependent Python control flow,
# and unconverted code lets hvdlite's own exceptions reach the user unchanged.
_not_converted = tf.autograph.experimental.do_not_convert
_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product"}
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_NONE_SPEC = NoneCompressor().spec()


# --------------------------------------------------------------------------
# Input checks and conversions
# --------------------------------------------------------------------------

def _keras_variable_class():
    import sys
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    return getattr(keras, "Variable", None)


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
    if isinstance(x, np.ndarray):
        hint = f"for NumPy arrays use hvdlite.{what}, or pass tf.convert_to_tensor(array)"
    else:
        hint = "wrap the value with tf.constant(...) first"
    raise exceptions.InvalidArgumentError(
        f"hvdlite.tensorflow.{what} takes a tf.Tensor or tf.Variable, not "
        f"{type(x).__module__}.{type(x).__name__}; {hint}")


def _dtype_code(dtype, what):
    code = _binding.DTYPE_CODES.get(dtype.name)
    if code is None:
        supported = ", ".join(_binding.DTYPE_CODES)
        raise exceptions.UnsupportedDTypeError(
            f"hvdlite.tensorflow.{what}: dtype {dtype.name} is not supported; use one of: {supported}")
    return code


def _check_op(op, what):
    if op not in _OP_NAMES:
        raise exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.{what}: op must be one of hvdlite.tensorflow.Average, Sum, Min, "
            f"Max, Product (got {op!r}); Adasum is not available in hvdlite")
    return op


def _resolve_op(op, average, what, default=Average):
    if average is not None:
        if op is not None:
            raise exceptions.InvalidArgumentError(
                f"hvdlite.tensorflow.{what}: pass either op= or the older average=, not both")
        return Average if average else Sum
    return _check_op(default if op is None else op, what)


def _set_size(process_set):
    pid = process_set_id(process_set)
    if pid == 0:
        return _binding.check(_binding.lib.hvd_size())
    return _binding.check(_binding.lib.hvd_process_set_size(pid))


def set_root(root_rank, pset, what):
    """Horovod's root_rank is a global rank; the engine wants the position in
    the process set (validated, with a clear error for non-members)."""
    return set_root_rank(root_rank, pset, f"hvdlite.tensorflow.{what}")


def _require_init(what):
    if not _binding.lib.hvd_is_initialized():
        raise exceptions.NotInitializedError(
            f"hvdlite.tensorflow.{what}: hvdlite is not initialised; call hvdlite.tensorflow.init() first")


def _compression_for(dtype_name, compression):
    """Compression applies to floating-point data only; other dtypes go plain."""
    spec = as_spec(compression)
    return spec if dtype_name in _FLOAT_DTYPES else _NONE_SPEC


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
            "(jit_compile=True): hvdlite calls its engine through tf.numpy_function, which XLA "
            "cannot compile. Use jit_compile=False for the function that communicates; with Keras, "
            "model.compile(..., jit_compile=False), or add "
            "hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback, which turns it "
            "off with a warning.")


# --------------------------------------------------------------------------
# Buffers
# --------------------------------------------------------------------------

def aligned_empty(shape, dtype):
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _engine_array(handle_id, dtype):
    """The engine-allocated result of a handle as a NumPy array (no copy; the
    array keeps the engine buffer alive)."""
    owned, nbytes, shape = _binding.take_output(handle_id)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if nbytes == 0 or count == 0:
        return np.empty(shape, dtype=dtype)
    buf = _binding.ffi.buffer(owned, nbytes)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


def _eager_view(t):
    """A NumPy view of an eager tensor's buffer (no copy on CPU)."""
    return t._numpy()


def to_tf(arr, dtype):
    """An eager tf.Tensor over ``arr``'s buffer when it is 64-byte aligned
    (DLPack, no copy); a copy otherwise."""
    if arr.size and arr.flags.c_contiguous and arr.flags.writeable and arr.ctypes.data % _ALIGN == 0:
        try:
            if dtype == tf.bfloat16:
                # DLPack has no bfloat16 in NumPy: move the bits as uint16.
                bits = tf.experimental.dlpack.from_dlpack(arr.view(np.uint16).__dlpack__())
                return tf.bitcast(bits, tf.bfloat16)
            return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
        except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
            pass
    return tf.convert_to_tensor(arr, dtype=dtype)


# --------------------------------------------------------------------------
# Jobs: one engine collective each, on NumPy arrays
# --------------------------------------------------------------------------

class _Job:
    """One collective. ``n_in`` arrays go in; ``submit`` returns a Handle
    whose result is a tuple of output arrays matching ``out_dtypes``."""

    n_in = 1

    def __init__(self, name, dtype, shape):
        self.name = name
        self.dtype = dtype              # tf.DType of the data input
        self.np_dtype = dtype.as_numpy_dtype
        self.code = _binding.DTYPE_CODES[dtype.name]
        self.shape = shape              # tf.TensorShape (static) of the data input

    def out_dtypes(self):
        return [self.dtype]

    def out_shapes(self):
        return [self.shape]


class _Allreduce(_Job):
    def __init__(self, name, dtype, shape, op, prescale, postscale, compression, pset):
        super().__init__(name, dtype, shape)
        self.op, self.prescale, self.postscale = op, float(prescale), float(postscale)
        self.compression, self.pset = compression, pset

    def submit(self, arr):
        out = aligned_empty(arr.shape, arr.dtype)
        return _binding.enqueue(
            _binding.ALLREDUCE, name=self.name, dtype_code=self.code, shape=arr.shape,
            input_ptr=arr.ctypes.data, output_ptr=out.ctypes.data, reduce_op=self.op,
            prescale=self.prescale, postscale=self.postscale, compression=self.compression,
            process_set=self.pset, keep=(arr, out), finish=lambda _h: (out,))


class _Broadcast(_Job):
    def __init__(self, name, dtype, shape, root_rank, pset):
        super().__init__(name, dtype, shape)
        self.root_rank, self.pset = int(root_rank), pset

    def submit(self, arr):
        out = aligned_empty(arr.shape, arr.dtype)
        return _binding.enqueue(
            _binding.BROADCAST, name=self.name, dtype_code=self.code, shape=arr.shape,
            input_ptr=arr.ctypes.data, output_ptr=out.ctypes.data, root_rank=self.root_rank,
            process_set=self.pset, keep=(arr, out), finish=lambda _h: (out,))


class _Allgather(_Job):
    def __init__(self, name, dtype, shape, pset):
        super().__init__(name, dtype, shape)
        self.pset = pset

    def out_shapes(self):
        dims = self.shape.as_list() if self.shape.rank is not None else None
        if dims is None:
            return [tf.TensorShape(None)]
        return [tf.TensorShape([None] + dims[1:] if dims else [None])]

    def submit(self, arr):
        if arr.ndim == 0:
            arr = arr.reshape(1)
        np_dtype = self.np_dtype
        return _binding.enqueue(
            _binding.ALLGATHER, name=self.name, dtype_code=self.code, shape=arr.shape,
            input_ptr=arr.ctypes.data, process_set=self.pset, keep=arr,
            finish=lambda h: (_engine_array(h, np_dtype),))


class _Reducescatter(_Allgather):
    def __init__(self, name, dtype, shape, op, prescale, postscale, compression, pset):
        super().__init__(name, dtype, shape, pset)
        self.op, self.prescale, self.postscale = op, float(prescale), float(postscale)
        self.compression = compression

    def submit(self, arr):
        np_dtype = self.np_dtype
        return _binding.enqueue(
            _binding.REDUCESCATTER, name=self.name, dtype_code=self.code, shape=arr.shape,
            input_ptr=arr.ctypes.data, reduce_op=self.op, prescale=self.prescale,
            postscale=self.postscale, compression=self.compression, process_set=self.pset,
            keep=arr, finish=lambda h: (_engine_array(h, np_dtype),))


class _Alltoall(_Allgather):
    def __init__(self, name, dtype, shape, pset, with_splits):
        super().__init__(name, dtype, shape, pset)
        self.n_in = 2 if with_splits else 1

    def out_dtypes(self):
        return [self.dtype, tf.int32]

    def out_shapes(self):
        return [super().out_shapes()[0], tf.TensorShape([None])]

    def submit(self, arr, splits=None):
        if splits is not None:
            splits = [int(s) for s in np.asarray(splits).reshape(-1)]
        np_dtype, pset = self.np_dtype, self.pset

        def finish(h):
            data = _engine_array(h, np_dtype)
            n = _binding.lib.hvd_process_set_size(pset)
            received = np.asarray(_binding.received_splits(h, n), dtype=np.int32)
            return data, received

        return _binding.enqueue(
            _binding.ALLTOALL, name=self.name, dtype_code=self.code, shape=arr.shape,
            input_ptr=arr.ctypes.data, splits=splits, process_set=pset, keep=arr, finish=finish)


class _Barrier(_Job):
    n_in = 0

    def __init__(self, pset):
        self.name = None
        self.dtype = tf.int32
        self.shape = tf.TensorShape([])
        self.pset = pset

    def submit(self):
        return _binding.enqueue(_binding.BARRIER, dtype_code=0, shape=[], process_set=self.pset,
                                finish=lambda _h: (np.zeros((), np.int32),))


class _Join(_Barrier):
    def submit(self):
        result = _core_join()()
        return _Done((np.asarray(-1 if result is None else result, dtype=np.int32),))


class _Done:
    """An already-finished result in Handle's shape."""

    def __init__(self, result):
        self._result = result

    def wait(self):
        return self._result


def _execute(jobs, arrays):
    """Submits every job, then waits for all; returns the flat output list.

    All jobs are enqueued before the first wait so the engine can negotiate
    and fuse them together. Runs on any thread (TF calls it from its own)."""
    handles = []
    # 0-d tensors come as NumPy scalars; everything else is a view already.
    it = iter(a if isinstance(a, np.ndarray) else np.asarray(a) for a in arrays)
    try:
        for job in jobs:
            handles.append(job.submit(*[next(it) for _ in range(job.n_in)]))
    except BaseException:
        for h in handles:  # let already-submitted work finish before unwinding
            try:
                h.wait()
            except Exception:
                pass
        raise
    outputs = []
    error = None
    for h in handles:
        try:
            outputs.extend(h.wait())
        except Exception as e:  # wait for the rest so no buffer is freed early
            error = error or e
    if error is not None:
        raise error
    return outputs


# --------------------------------------------------------------------------
# Running a group eagerly or as one graph node
# --------------------------------------------------------------------------

_graph_counter_lock = threading.Lock()


def _outermost_graph():
    graph = _tf_framework_ops.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def graph_name(kind):
    """A name for an unnamed collective built inside a graph.

    Eager calls leave naming to the engine (ranks making the same sequence of
    calls get matching names). Inside a graph the run order of nodes is not
    the trace order, so names are fixed at trace time: the outermost
    function's name plus a counter of hvdlite nodes in that function. Both
    are the same on every rank, and the same again after a retrace."""
    graph = _outermost_graph()
    with _graph_counter_lock:
        count = getattr(graph, "_hvdlite_node_count", 0)
        graph._hvdlite_node_count = count + 1
    return f"tf.{getattr(graph, 'name', 'graph')}.{kind}.{count}"


def run_group(jobs, inputs, what):
    """Runs ``jobs`` over the flat tensor list ``inputs``; returns the flat
    list of output tensors (static shapes restored in graphs)."""
    if not jobs:
        return []
    _require_init(what)
    out_dtypes = [d for job in jobs for d in job.out_dtypes()]
    if tf.executing_eagerly():
        arrays = [_eager_view(t) for t in inputs]
        outputs = _execute(jobs, arrays)
        return [to_tf(a, d) for a, d in zip(outputs, out_dtypes)]
    _check_not_xla(what)

    def body(*arrays):
        return _execute(jobs, arrays)

    outputs = tf.numpy_function(body, list(inputs), out_dtypes, stateful=True,
                                name=f"Hvdlite{what.title().replace('_', '')}")
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    shapes = [s for job in jobs for s in job.out_shapes()]
    for out, shape in zip(outputs, shapes):
        out.set_shape(shape)
    return outputs


def _name_for(name, kind):
    if name is not None:
        return str(name)
    if tf.executing_eagerly():
        return None
    return graph_name(kind)


# --------------------------------------------------------------------------
# Public collectives
# --------------------------------------------------------------------------

def _reduce_jobs(tensor, name, op, prescale, postscale, compression, pset, what):
    """Jobs and input tensors reducing one dense tensor or IndexedSlices.

    Returns (jobs, inputs, rebuild) where rebuild(outputs) gives the result."""
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Average, Sum):
            raise exceptions.InvalidArgumentError(
                f"hvdlite.tensorflow.{what}: tf.IndexedSlices can only be averaged or summed "
                f"(got op={_OP_NAMES.get(op, op)}); densify with tf.convert_to_tensor first")
        values = _as_tensor(tensor.values, what)
        indices = tf.cast(tensor.indices, tf.int64)
        _dtype_code(values.dtype, what)
        jobs = [_Allgather(None if name is None else f"{name}.values", values.dtype, values.shape, pset),
                _Allgather(None if name is None else f"{name}.indices", tf.int64, indices.shape, pset)]
        n = _set_size(pset)
        dense_shape = tensor.dense_shape
        scale = float(prescale) * float(postscale) / (n if op == Average else 1)

        def rebuild(outs):
            vals, idx = outs
            if scale != 1.0:
                vals = vals * tf.cast(scale, vals.dtype)
            return tf.IndexedSlices(vals, tf.cast(idx, tensor.indices.dtype), dense_shape)

        return jobs, [values, indices], rebuild
    t = _as_tensor(tensor, what)
    _dtype_code(t.dtype, what)
    job = _Allreduce(name, t.dtype, t.shape, op, prescale, postscale,
                     _compression_for(t.dtype.name, compression), pset)
    return [job], [t], lambda outs: outs[0]


def _run_reductions(items, what):
    """items: list of (jobs, inputs, rebuild); one group for all."""
    jobs = [j for it in items for j in it[0]]
    inputs = [t for it in items for t in it[1]]
    outputs = run_group(jobs, inputs, what)
    results, pos = [], 0
    for its_jobs, _, rebuild in items:
        n = sum(len(j.out_dtypes()) for j in its_jobs)
        results.append(rebuild(outputs[pos:pos + n]))
        pos += n
    return results


@_not_converted
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces ``tensor`` over the ranks of ``process_set`` (default: average).

    ``tensor`` is a tf.Tensor, tf.Variable or tf.IndexedSlices (gathered from
    all ranks, values averaged or summed). Works eagerly and in tf.function.
    ``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for
    Horovod compatibility and ignored."""
    op = _resolve_op(op, average, "allreduce")
    pset = process_set_id(process_set)
    item = _reduce_jobs(tensor, _name_for(name, "allreduce"), op, prescale_factor,
                        postscale_factor, compression, pset, "allreduce")
    return _run_reductions([item], "allreduce")[0]


@_not_converted
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, name=None, process_set=global_process_set):
    """Reduces a list of tensors as one group (one graph node, submitted to
    the engine together so they can be fused). Returns a list."""
    if not isinstance(tensors, (list, tuple)):
        raise exceptions.InvalidArgumentError(
            f"hvdlite.tensorflow.grouped_allreduce takes a list of tensors, not {type(tensors).__name__}")
    op = _resolve_op(op, average, "grouped_allreduce")
    pset = process_set_id(process_set)
    base = _name_for(name, "grouped_allreduce")
    items = [_reduce_jobs(t, None if base is None else f"{base}.{i}", op, prescale_factor,
                          postscale_factor, compression, pset, "grouped_allreduce")
             for i, t in enumerate(tensors)]
    return _run_reductions(items, "grouped_allreduce")


@_not_converted
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension (which
    may differ by rank; the others must agree)."""
    t = _as_tensor(tensor, "allgather")
    _dtype_code(t.dtype, "allgather")
    job = _Allgather(_name_for(name, "allgather"), t.dtype, t.shape, process_set_id(process_set))
    return run_group([job], [t], "allgather")[0]


@_not_converted
def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather for a list of tensors as one group; returns a list."""
    ts = [_as_tensor(t, "grouped_allgather") for t in tensors]
    base = _name_for(name, "grouped_allgather")
    pset = process_set_id(process_set)
    jobs = []
    for i, t in enumerate(ts):
        _dtype_code(t.dtype, "grouped_allgather")
        jobs.append(_Allgather(None if base is None else f"{base}.{i}", t.dtype, t.shape, pset))
    return run_group(jobs, ts, "grouped_allgather")


@_not_converted
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns ``root_rank``'s ``tensor`` on every rank of the set
    (``root_rank`` is a global rank, as in Horovod)."""
    t = _as_tensor(tensor, "broadcast")
    _dtype_code(t.dtype, "broadcast")
    pset = process_set_id(process_set)
    job = _Broadcast(_name_for(name, "broadcast"), t.dtype, t.shape,
                     set_root(root_rank, pset, "broadcast"), pset)
    return run_group([job], [t], "broadcast")[0]


@_not_converted
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends ``splits[i]`` rows of ``tensor`` (in order) to rank i. Returns
    ``(received rows concatenated in rank order, int32 rows received from each
    rank)``. Without ``splits`` the first dimension is divided equally."""
    t = _as_tensor(tensor, "alltoall")
    _dtype_code(t.dtype, "alltoall")
    inputs = [t]
    if splits is not None:
        if is_tf_value(splits):
            splits = tf.cast(_as_tensor(splits, "alltoall"), tf.int64)
        else:
            splits = tf.constant(np.asarray(splits, dtype=np.int64).reshape(-1))
        inputs.append(splits)
    job = _Alltoall(_name_for(name, "alltoall"), t.dtype, t.shape, process_set_id(process_set),
                    splits is not None)
    data, received = run_group([job], inputs, "alltoall")
    return data, received


@_not_converted
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0,
                  ignore_name_scope=False):
    """Reduces ``tensor`` over ranks and returns this rank's block of rows
    (rows split as evenly as possible, earlier ranks taking one more)."""
    _check_op(op, "reducescatter")
    t = _as_tensor(tensor, "reducescatter")
    _dtype_code(t.dtype, "reducescatter")
    job = _Reducescatter(_name_for(name, "reducescatter"), t.dtype, t.shape, op, prescale_factor,
                         postscale_factor, _compression_for(t.dtype.name, compression),
                         process_set_id(process_set))
    return run_group([job], [t], "reducescatter")[0]


@_not_converted
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          name=None, process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter for a list of tensors as one group; returns a list."""
    _check_op(op, "grouped_reducescatter")
    ts = [_as_tensor(t, "grouped_reducescatter") for t in tensors]
    base = _name_for(name, "grouped_reducescatter")
    pset = process_set_id(process_set)
    jobs = []
    for i, t in enumerate(ts):
        _dtype_code(t.dtype, "grouped_reducescatter")
        jobs.append(_Reducescatter(None if base is None else f"{base}.{i}", t.dtype, t.shape, op,
                                   prescale_factor, postscale_factor,
                                   _compression_for(t.dtype.name, compression), pset))
    return run_group(jobs, ts, "grouped_reducescatter")


@_not_converted
def barrier(process_set=global_process_set):
    """Returns once every rank of the set has reached it (eager: None; in a
    graph: an int32 tensor the graph keeps because the node is stateful)."""
    out = run_group([_Barrier(process_set_id(process_set))], [], "barrier")[0]
    return None if tf.executing_eagerly() else out


def _core_join():
    import hvdlite
    core = getattr(hvdlite, "join", None)
    if core is None:
        raise exceptions.HvdliteError(
            "hvdlite.tensorflow.join() needs hvdlite.join() from the engine, which this build "
            "does not provide yet")
    return core


@_not_converted
def join(device=""):
    """Marks this rank as done with its data (uneven inputs): it takes part in
    the other ranks' collectives with neutral values until every rank has
    joined. Returns the rank that joined last, as an int32 tensor."""
    _core_join()
    return run_group([_Join(0)], [], "join")[0]


def size_op(process_set_id=0):
    """The number of ranks, as an int32 tensor."""
    return tf.constant(_set_size(process_set_id), dtype=tf.int32)


def rank_op():
    return tf.constant(_binding.check(_binding.lib.hvd_rank()), dtype=tf.int32)


def local_rank_op():
    return tf.constant(_binding.check(_binding.lib.hvd_local_rank()), dtype=tf.int32)


def local_size_op():
    return tf.constant(_binding.check(_binding.lib.hvd_local_size()), dtype=tf.int32)


def process_set_included_op(process_set_id=0):
    pid = process_set_id
    rank_in_set = _binding.lib.hvd_process_set_rank(pid)
    return tf.constant(1 if rank_in_set >= 0 else 0, dtype=tf.int32)


__all__ = [
    "Average", "Sum", "Min", "Max", "Product", "allreduce", "grouped_allreduce", "allgather",
    "grouped_allgather", "broadcast", "alltoall", "reducescatter", "grouped_reducescatter",
    "barrier", "join", "size_op", "rank_op", "local_rank_op", "local_size_op",
    "process_set_included_op", "is_tf_value", "in_xla_context", "aligned_empty", "to_tf",
]
