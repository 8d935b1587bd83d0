"""Engine-wide controls: counters, compression state, timeline."""
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
