"""Python objects between ranks: any picklable object travels as bytes
through the engine's broadcast and allgather (NumPy arrays of uint8), so
every front end (and the torch device executor's rendezvous) shares them."""
import io
import pickle

import numpy as np

from . import ops
from ._binding import check, lib
from .process_sets import global_process_set, set_root_rank

try:  # cloudpickle also moves lambdas and classes defined in __main__
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle ships with most stacks
    _pickler = pickle


def dumps(obj):
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def loads(data):
    return pickle.loads(data)


def _named(name, suffix):
    return f"{name}.{suffix}" if name else None


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank; the
    root gets its own object back. Other ranks' ``obj`` is ignored."""
    name = name or "broadcast_object"  # not a counter: it must match across ranks
    set_root_rank(root_rank, process_set, "broadcast_object")
    is_root = check(lib.hvd_rank()) == int(root_rank)
    payload = dumps(obj) if is_root else b""
    size = ops.broadcast(np.array([len(payload)], dtype=np.int64), root_rank,
                         name=_named(name, "size"), process_set=process_set)
    data = np.frombuffer(payload, dtype=np.uint8) if is_root else \
        np.empty(int(size[0]), dtype=np.uint8)
    data = ops.broadcast(data, root_rank, name=_named(name, "data"), process_set=process_set)
    if is_root:
        return obj
    return loads(data.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (any picklable object), in rank
    order of the process set."""
    # A fixed name, not a counter: ranks whose unnamed collectives diverged
    # (one failed on some ranks only) still meet here.
    name = name or "allgather_object"
    payload = dumps(obj)
    sizes_h = ops.allgather_async(np.array([len(payload)], dtype=np.int64),
                                  name=_named(name, "sizes"), process_set=process_set)
    data_h = ops.allgather_async(np.frombuffer(payload, dtype=np.uint8),
                                 name=_named(name, "data"), process_set=process_set)
    sizes = ops.synchronize(sizes_h).tolist()
    gathered = ops.synchronize(data_h).tobytes()
    out, offset = [], 0
    for n in sizes:
        out.append(loads(gathered[offset:offset + n]))
        offset += n
    return out
