"""Variables and Python objects across ranks: broadcast_variables,
broadcast_global_variables (and BroadcastGlobalVariablesHook, its form for
MonitoredTrainingSession), broadcast_object(_fn), allgather_object, and the
cross-rank consistency check the gradient reducers run once per gradient
signature."""
import hashlib
import io
import pickle
import threading

import numpy as np
import tensorflow as tf

from .. import exceptions
from .. import ops as np_ops
from ..process_sets import global_process_set, process_set_id
from . import mpi_ops


def _pickler():
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        return pickle


def _dumps(obj):
    buf = io.BytesIO()
    _pickler().dump(obj, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


# Python objects have no graph form, so the object collectives run at once
# through hvdlite's NumPy API in every mode: eagerly, while a tf.compat.v1
# graph is built (Horovod runs them in the default session and returns the
# object too) and while a tf.function is traced (once per trace).

@tf.autograph.experimental.do_not_convert
def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s picklable ``obj`` on every rank (``root_rank``
    is a global rank). ``session`` is accepted for Horovod compatibility."""
    mpi_ops._require_init("broadcast_object")
    pset = process_set_id(process_set)
    prefix = f"{name}." if name else None
    mpi_ops.set_root(root_rank, pset, "broadcast_object")  # validates: a member of the set
    root = int(root_rank)  # the NumPy API takes the global rank, as Horovod does
    from .. import basics
    is_root = basics.rank() == root
    payload = _dumps(obj) if is_root else np.zeros(0, np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    length = np_ops.broadcast(length, root, name=prefix and prefix + "len", process_set=pset)
    if not is_root:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    data = np_ops.broadcast(payload, root, name=prefix and prefix + "data", process_set=pset)
    if is_root:
        return obj
    return pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper: returns a function ``f(obj)`` that broadcasts
    ``obj`` from ``root_rank`` (see :func:`broadcast_object`)."""
    mpi_ops.set_root(root_rank, process_set_id(process_set), "broadcast_object_fn")

    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, session=session, name=name, process_set=process_set)
    return broadcast_fn


@tf.autograph.experimental.do_not_convert
def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    mpi_ops._require_init("allgather_object")
    pset = process_set_id(process_set)
    prefix = f"{name}." if name else None
    payload = _dumps(obj)
    sizes = np_ops.allgather(np.array([payload.size], dtype=np.int64),
                             name=prefix and prefix + "len", process_set=pset)
    data = np_ops.allgather(payload, name=prefix and prefix + "data", process_set=pset)
    out, pos = [], 0
    for n in sizes:
        out.append(pickle.loads(data[pos:pos + int(n)].tobytes()))
        pos += int(n)
    return out


# --------------------------------------------------------------------------
# Cross-rank consistency of tensor lists
# --------------------------------------------------------------------------

_checked = set()
_checked_lock = threading.Lock()


def _describe(entries, limit=6):
    shown = ", ".join(f"{n} {s} {d}" for n, s, d in entries[:limit])
    more = f", ... ({len(entries)} in all)" if len(entries) > limit else ""
    return f"[{shown}{more}]"


def _in_a_generation_formed_in_place():
    """After in-place recovery the survivors' functions are traced already
    (their once-per-signature checks ran in the first generation) while new
    ranks trace theirs: a check at tracing time would be a collective that
    only the new ranks reach."""
    from .. import rendezvous
    generation = rendezvous.current() if rendezvous.in_place() else None
    return generation is not None and generation.number > 0


def check_same_on_all_ranks(entries, what, pset=0, once_key=None):
    """Raises InvalidArgumentError on every rank when ``entries`` (a list of
    (name, shape, dtype) tuples) differ across the ranks of ``pset``.

    With ``once_key``, a given signature is checked only the first time this
    process sees it (the check is a collective: ranks running the same program
    reach it at the same point). Works eagerly and while tracing."""
    entries = [(str(n), tuple(s) if s is not None else None, str(d)) for n, s, d in entries]
    if once_key is not None and _in_a_generation_formed_in_place():
        return
    if once_key is not None:
        digest = hashlib.sha1(repr((once_key, entries)).encode()).hexdigest()
        with _checked_lock:
            if digest in _checked:
                return
            _checked.add(digest)
    payload = _dumps(entries)
    sizes = np_ops.allgather(np.array([payload.size], dtype=np.int64), process_set=pset)
    data = np_ops.allgather(payload, process_set=pset)
    lists, pos = [], 0
    for n in sizes:
        lists.append(pickle.loads(data[pos:pos + int(n)].tobytes()))
        pos += int(n)
    reference = lists[0]
    for r, other in enumerate(lists[1:], start=1):
        if other == reference:
            continue
        detail = ""
        if len(other) != len(reference):
            detail = f"rank 0 has {len(reference)}, rank {r} has {len(other)}; "
        for i, (a, b) in enumerate(zip(reference, other)):
            if a != b:
                detail += f"first difference at position {i}: rank 0 {a}, rank {r} {b}; "
                break
        raise exceptions.InvalidArgumentError(
            f"{what}: the ranks do not pass the same variables/tensors ({detail}"
            f"rank 0: {_describe(reference)}; rank {r}: {_describe(other)}). Every rank must "
            "build the same model and pass the same list in the same order.")


def _variable_name(v, i):
    for attr in ("path", "name"):
        n = getattr(v, attr, None)
        if isinstance(n, str) and n:
            return n[:-2] if n.endswith(":0") else n
    return f"#{i}"


@tf.autograph.experimental.do_not_convert
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False,
                        name=None):
    """Assigns ``root_rank``'s values to ``variables`` on every rank.

    Takes tf.Variable or Keras Variable objects (a list, or any nest). Eagerly
    the ranks first check that they pass the same list (names, shapes,
    dtypes) and raise a clear error when they do not. The broadcast is one op
    for all variables, followed by the assignments; in a graph the returned
    group op runs them. ``inplace`` is accepted for Horovod compatibility (the
    values are always assigned in place)."""
    flat = tf.nest.flatten(variables)
    for v in flat:
        if not (isinstance(v, tf.Variable) or (mpi_ops._keras_variable_class() is not None
                                               and isinstance(v, mpi_ops._keras_variable_class()))):
            raise exceptions.InvalidArgumentError(
                "hvdlite.tensorflow.broadcast_variables takes tf.Variable or keras.Variable "
                f"objects, not {type(v).__module__}.{type(v).__name__}")
    if not flat and not tf.executing_eagerly():
        return tf.no_op()  # e.g. broadcast_global_variables() of a graph without variables
    mpi_ops._start("broadcast_variables")
    pset = process_set_id(process_set)
    if tf.executing_eagerly():
        check_same_on_all_ranks(
            [(_variable_name(v, i), v.shape.as_list() if hasattr(v.shape, "as_list") else list(v.shape),
              _dtype_name(v)) for i, v in enumerate(flat)],
            "hvdlite.tensorflow.broadcast_variables", pset)
    if not flat:
        return None if tf.executing_eagerly() else tf.no_op()
    base = name or ("broadcast_variables" if tf.executing_eagerly()
                    else mpi_ops.graph_name("broadcast_variables"))
    values = mpi_ops._tensors([tf.convert_to_tensor(v) for v in flat], "broadcast_variables")
    names = [f"{base}.{i}.{_variable_name(v, i)}" for i, v in enumerate(flat)]
    results = mpi_ops._broadcast_op(values, names, root_rank, pset, grouped=True,
                                    what="broadcast_variables")
    assigns = [v.assign(r) for v, r in zip(flat, results)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_global_variables(root_rank):
    """Broadcasts every global variable of the current tf.compat.v1 graph from
    ``root_rank``; returns the op to run. TF2 code (eager) has no global
    variables: use broadcast_variables(model.variables, root_rank) there."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvdlite.tensorflow.broadcast_global_variables() needs a tf.compat.v1 graph; eagerly "
            "there are no global variables. Use "
            "hvdlite.tensorflow.broadcast_variables(<model/optimizer variables>, root_rank) instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """For tf.compat.v1.train.MonitoredTrainingSession: once the session has
    initialized (or restored) the variables, every global variable takes
    ``root_rank``'s value, so all ranks start from the same model.
    ``device`` is accepted for Horovod compatibility."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        # Built while the session's graph is still open; again for a new graph.
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def _dtype_name(v):
    d = v.dtype
    return d.name if hasattr(d, "name") else str(d)
