"""Engine-wide controls: counters, compression state, timeline, flight recorder."""
import json

from . import _binding
from ._binding import ffi, lib


def engine_stats():
    """Counters since init(): negotiation rounds, cache hits/misses, tensors,
    fused tensors, MPI collectives issued, bytes put on the wire per compressor."""
    names = [n for n in ffi.string(lib.hvd_engine_stats_names()).decode().split(",") if n]
    values = ffi.new("int64_t[]", len(names))
    _binding.check(lib.hvd_engine_stats(values, len(names)))
    return {name: int(values[i]) for i, name in enumerate(names)}


def set_compute_threads(threads):
    """Tells the engine how many compute (intra-op) threads this rank runs.
    The torch and TensorFlow adapters call it when the engine starts; with
    ``HVDLITE_ENGINE_PRIORITY=auto`` (the default) the engine thread then runs
    at idle priority where the whole job is on one host and ranks x threads
    fill its cores (docs/engine.md, "Engine thread priority")."""
    _binding.check(lib.hvd_set_compute_threads(max(0, int(threads))))


# Residuals kept outside the engine (the torch device executor's top-k).
reset_hooks = []


def reset_compression_state():
    """Drops the error-feedback residuals of every compressor (e.g. after
    loading a checkpoint or changing the model)."""
    _binding.check(lib.hvd_reset_compression_state())
    for hook in reset_hooks:
        hook()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome trace of the engine's work to ``file_path``.
    ``%r`` in the path becomes the rank (every rank writes its own file; join
    them with ``python -m hvdlite.timeline merge``); without it only rank 0
    writes, as in Horovod."""
    _binding.check(lib.hvd_start_timeline(str(file_path).encode(), int(bool(mark_cycles))))


def stop_timeline():
    _binding.check(lib.hvd_stop_timeline())


def flight_recorder(summary=False):
    """The engine's flight recorder: its most recent events, oldest first, as
    dicts (``kind``: ``enqueued``, ``decided``, ``collective_start``,
    ``collective_end``, ``error``, ``peer_lost``, ``stopped``, ``dump``,
    ``abandoned``; with
    ``seq``, ``t_ns`` on the steady clock, and ``name``, ``op``, ``dtype``,
    ``bytes``, ... where they apply). Works after the engine stopped too, which
    is when it is most useful. ``summary=True`` returns the dump's header
    instead: where this rank is (``in``), the ranks it lost (``lost``) and its
    last negotiation decisions. Size: ``HVDLITE_FLIGHT_RECORDER_EVENTS``
    (docs/reliability.md, "Flight recorder")."""
    size = 1 << 16
    while True:
        buf = ffi.new("char[]", size)
        n = lib.hvd_flight_recorder_json(buf, size)
        _binding.check(n)
        if n < size:
            break
        size = n + 4096     # events recorded meanwhile
    lines = ffi.string(buf).decode("utf-8", "replace").splitlines()
    header = json.loads(lines[0])
    if summary:
        return header
    return [json.loads(line) for line in lines[1:] if line]
