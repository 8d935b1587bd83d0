"""Loads the compiled engine and turns its handles and errors into Python.

Everything here is framework-neutral: callers pass raw addresses, a dtype
code and a shape; the adapters (NumPy, torch, TF) translate their tensors.
"""
import threading

from . import exceptions

# What to do without an MPI (launcher/mpi_detect.py says the same to hvdrun's users).
NO_MPI_HELP = ("hvdlite needs an MPI. Either install the MPICH wheel into this Python "
               "environment (pip install mpich) or use a system MPI (Debian/Ubuntu: "
               "apt-get install mpich libmpich-dev, or openmpi-bin libopenmpi-dev), then "
               "rebuild hvdlite against it: pip install --no-build-isolation -e . (with a "
               "system MPI: MPICXX=/usr/bin/mpicxx before it; see docs/install.md)")


def _built_for():
    """' It was built against the MPI of <mpicxx>.' from the build's record, or ''."""
    try:
        from . import _build_info
        return f" It was built against the MPI of {_build_info.MPICXX}."
    except Exception:
        return ""


try:
    from ._engine import ffi, lib
except ImportError as e:  # pragma: no cover - only on a broken install
    if "libmpi" in str(e):   # the MPI it was built against is gone
        raise ImportError(f"hvdlite's engine cannot load its MPI library ({e}).{_built_for()} "
                          f"{NO_MPI_HELP}.") from None
    raise ImportError(
        "hvdlite's compiled engine (hvdlite._engine) could not be loaded: "
        f"{e}. Build it with: pip install --no-build-isolation -e . (after "
        "'pip install cffi setuptools wheel numpy mpi4py mpich', or with your own MPI as "
        "docs/install.md shows)") from e


def _codes(enum, prefix):
    """A C API enum (csrc/api/c_api.h) as {lower-case name: code}, in code order."""
    elements = ffi.typeof(f"enum {enum}").elements  # {code: "PREFIX_NAME"}
    return {elements[code][len(prefix):].lower(): code for code in sorted(elements)}


# The engine's codes, from its C API.
OP_CODES = _codes("hvd_op_type", "HVD_OP_")
DTYPE_CODES = _codes("hvd_data_type", "HVD_DTYPE_")
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
REDUCE_OP_CODES = _codes("hvd_reduce_op", "HVD_REDUCE_")
COMPRESSION_CODES = _codes("hvd_compression_type", "HVD_COMPRESSION_")
ERROR_KINDS = _codes("hvd_error_kind", "HVD_ERROR_")

ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER = (
    lib.HVD_OP_ALLREDUCE, lib.HVD_OP_ALLGATHER, lib.HVD_OP_BROADCAST, lib.HVD_OP_ALLTOALL,
    lib.HVD_OP_REDUCESCATTER, lib.HVD_OP_BARRIER)
ADD_PROCESS_SET, REMOVE_PROCESS_SET, JOIN = (
    lib.HVD_OP_ADD_PROCESS_SET, lib.HVD_OP_REMOVE_PROCESS_SET, lib.HVD_OP_JOIN)

# Engine ErrorKind -> exception class.
_ERROR_CLASSES = {
    lib.HVD_ERROR_INVALID_ARGUMENT: exceptions.InvalidArgumentError,
    lib.HVD_ERROR_MISMATCH: exceptions.TensorMismatchError,
    lib.HVD_ERROR_SHUTDOWN: exceptions.HvdliteShutdownError,
    lib.HVD_ERROR_MPI: exceptions.MPIError,
    lib.HVD_ERROR_STALL: exceptions.StallError,
    lib.HVD_ERROR_INTERNAL: exceptions.HvdliteError,
    lib.HVD_ERROR_NOT_INITIALIZED: exceptions.NotInitializedError,
    lib.HVD_ERROR_TIMEOUT: exceptions.HvdliteTimeoutError,
}
# Kinds after which this rank's MPI_Finalize would wait for a lost peer.
PEER_LOST_KINDS = (lib.HVD_ERROR_MPI, lib.HVD_ERROR_TIMEOUT)


def error(kind, message):
    """The exception for an engine ErrorKind."""
    return _ERROR_CLASSES.get(kind, exceptions.HvdliteError)(message)


# How often a waiting Python thread comes back from C so Ctrl-C works.
_WAIT_SLICE_SECONDS = 0.2
_MAX_DIMS = 32


def last_error():
    return error(lib.hvd_last_error_kind(), ffi.string(lib.hvd_last_error()).decode(errors="replace"))


def check(rc):
    if rc < 0:
        raise last_error()
    return rc


class Handle:
    """An in-flight collective. ``synchronize(handle)`` returns its result.

    The handle keeps the input and output buffers alive until the engine is
    done with them, so a caller may drop its own references. ``result`` is
    what a successful wait returns when there is no ``finish`` callback (an
    output the caller supplied).
    """

    __slots__ = ("_id", "_keep", "_finish", "_result", "_error", "__weakref__")

    def __init__(self, handle_id, keep, finish, result=None):
        self._id = handle_id
        self._keep = keep
        self._finish = finish
        self._result = result
        self._error = None

    def engine_id(self):
        """The engine's id of this handle (for hvd_on_completion), or None
        once its outcome has been collected."""
        return self._id

    def poll(self):
        """True once the collective has completed (successfully or not)."""
        handle_id = self._id
        if handle_id is None:
            return True
        rc = lib.hvd_poll(handle_id)
        if rc < 0:
            if self._id is None:  # collected by another thread meanwhile
                return True
            raise last_error()
        return rc == 1

    def wait(self):
        """Blocks until completion; returns the result or raises its error.
        Several threads may wait on one handle: the engine's wait is
        thread-safe, and one of them collects the outcome under a lock."""
        handle_id = self._id
        if handle_id is not None:
            if self._finish is None:
                # Common path (the result is the caller's own output): wait
                # and release in one call.
                rc = lib.hvd_wait_release(handle_id, _WAIT_SLICE_SECONDS)
                while rc == 0:
                    rc = lib.hvd_wait_release(handle_id, _WAIT_SLICE_SECONDS)
                with _collect_lock:
                    if self._id is not None:
                        if rc == 1:
                            self._id = self._keep = None
                        elif rc == 2:
                            self._collect()
                        else:
                            raise last_error()
            else:
                while lib.hvd_wait(handle_id, _WAIT_SLICE_SECONDS) == 0:
                    pass
                with _collect_lock:
                    if self._id is not None:
                        self._collect()
        if self._error is not None:
            raise self._error
        return self._result

    def _collect(self):
        kind = lib.hvd_handle_error(self._id, ffi.NULL, 0)
        try:
            if kind < 0:
                self._error = last_error()
            elif kind != 0:
                msg = ffi.new("char[]", 8192)
                lib.hvd_handle_error(self._id, msg, 8192)
                self._error = error(kind, ffi.string(msg).decode(errors="replace"))
            elif self._finish is not None:
                self._result = self._finish(self._id)
        finally:
            lib.hvd_release(self._id)
            self._id = None
            self._keep = None
            self._finish = None

    def __del__(self):
        # A handle dropped before completion must not free buffers the engine
        # still writes to. Waiting here would hang whenever the collective
        # never completes (an exception unwinding past pending handles, while
        # the other ranks wait for this one's next tensors), so the buffers
        # are parked until the engine is done with them instead.
        if self._id is not None:
            _orphans[self._id] = self._keep
            self._id = None


_collect_lock = threading.Lock()


# Buffers of dropped, still pending handles: {handle id: buffers}. Swept on
# every enqueue; plain dict operations, since __del__ may run in any thread
# at any point (a lock could be held by the very thread the GC interrupts).
_orphans = {}


def _sweep_orphans():
    for handle_id in list(_orphans):
        if lib.hvd_poll(handle_id) != 0:  # done, failed, or unknown after a re-init
            _orphans.pop(handle_id, None)
            lib.hvd_release(handle_id)


_local = threading.local()

# Encoded names and shapes, reused: a training loop submits the same gradient
# names and shapes every step, and building cdata is most of a call's cost.
# Bounded so that automatic or per-step names cannot grow them without end.
_CDATA_CACHE_LIMIT = 8192
_names = {}
_shapes = {}


def _pointer(p):
    # Adapters pass integer addresses (torch's data_ptr()); NumPy callers may
    # pass cdata from ffi.from_buffer, which needs no conversion.
    return ffi.cast("void *", p) if p.__class__ is int else p


def _name_cdata(name):
    buf = _names.get(name)
    if buf is None:
        if name.__class__ is not str:
            raise exceptions.InvalidArgumentError(
                f"name must be a str (or None for an automatic name), not {type(name).__name__}")
        if len(_names) >= _CDATA_CACHE_LIMIT:
            _names.clear()
        buf = _names[name] = ffi.new("char[]", name.encode())
    return buf


def _shape_cdata(shape):
    if not isinstance(shape, tuple):  # lists (TF, process sets) are not cached
        return ffi.new("int64_t[]", shape)
    buf = _shapes.get(shape)
    if buf is None:
        if len(_shapes) >= _CDATA_CACHE_LIMIT:
            _shapes.clear()
        buf = _shapes[shape] = ffi.new("int64_t[]", shape)
    return buf


def _request():
    req = getattr(_local, "request", None)
    if req is None:
        req = _local.request = ffi.new("hvd_tensor_request *")
    return req


# (compressor code, top-k ratio, error feedback, config id): compression.as_spec().
_NO_COMPRESSION = (0, 0.0, 0, 0)


def _int64s(values):
    return ffi.new("int64_t[]", list(values)) if values else ffi.NULL


def enqueue(op, *, name=None, dtype_code, shape, input_ptr=0, output_ptr=0, reduce_op=1,
            prescale=1.0, postscale=1.0, root_rank=0, splits=None, set_ranks=None, target_set=0,
            compression=_NO_COMPRESSION, process_set=0, keep=None, finish=None, result=None,
            device=0, members_only=0, output_bytes=0):
    """Submits one tensor to the engine; returns a :class:`Handle` at once.

    The request struct is reused per thread: the engine copies what it needs
    before hvd_enqueue returns, and this path runs once per gradient."""
    if _orphans:
        _sweep_orphans()
    req = _request()
    # Held in locals while the engine copies them: a cdata referenced only
    # from a struct field would be freed at once (found by ASan).
    name_buf = _name_cdata(name) if name else ffi.NULL
    shape_buf = _shape_cdata(shape) if len(shape) else ffi.NULL
    splits_buf = _int64s(splits)
    ranks_buf = ffi.new("int32_t[]", list(set_ranks)) if set_ranks else ffi.NULL
    req.op = op
    req.name = name_buf
    req.dtype = dtype_code
    req.ndim = len(shape)
    req.shape = shape_buf
    req.input = _pointer(input_ptr)
    req.output = _pointer(output_ptr)
    req.reduce_op = reduce_op
    req.prescale = prescale
    req.postscale = postscale
    req.root_rank = root_rank
    req.splits = splits_buf
    req.nsplits = len(splits) if splits else 0
    req.set_ranks = ranks_buf
    req.nset_ranks = len(set_ranks) if set_ranks else 0
    req.target_set = target_set
    req.compression, req.topk_ratio, req.error_feedback, req.compression_config = compression
    req.process_set = process_set
    req.device = device
    req.members_only = members_only
    req.output_bytes = output_bytes
    handle_id = lib.hvd_enqueue(req)
    if handle_id < 0:
        raise last_error()
    return Handle(handle_id, keep, finish, result)


def enqueue_allreduce(name, dtype_code, shape, input_ptr, output_ptr, reduce_op, prescale,
                      postscale, compression, process_set, keep, result, finish=None):
    """:func:`enqueue` of an allreduce into a caller-owned output, with
    positional arguments and one C call: this runs once per gradient per step."""
    if _orphans:
        _sweep_orphans()
    name_buf = _name_cdata(name) if name else ffi.NULL
    shape_buf = _shape_cdata(shape) if shape else ffi.NULL
    kind, ratio, error_feedback, config = compression
    handle_id = lib.hvd_enqueue_allreduce(
        name_buf, dtype_code, len(shape), shape_buf, _pointer(input_ptr), _pointer(output_ptr),
        reduce_op, prescale, postscale, kind, ratio, error_feedback, config, process_set)
    if handle_id < 0:
        raise last_error()
    return Handle(handle_id, keep, finish, result)


def take_output(handle_id):
    """Takes the engine-allocated result: (cdata that frees itself, nbytes, shape);
    (None, 0, shape) where the engine wrote it into the caller's output."""
    data = ffi.new("void **")
    nbytes = ffi.new("int64_t *")
    shape = ffi.new("int64_t[]", _MAX_DIMS)
    ndim = check(lib.hvd_handle_take_output(handle_id, data, nbytes, shape, _MAX_DIMS))
    owned = None if data[0] == ffi.NULL else ffi.gc(data[0], lib.hvd_free_output)
    return owned, nbytes[0], tuple(shape[i] for i in range(ndim))


def received_splits(handle_id, size):
    buf = ffi.new("int64_t[]", max(size, 1))
    n = check(lib.hvd_handle_received_splits(handle_id, buf, size))
    return [buf[i] for i in range(min(n, size))]
