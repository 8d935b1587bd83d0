"""Elastic training: state objects and ``run``, shared by the framework
adapters (``hvdlite.torch.elastic``, ``hvdlite.tensorflow.elastic``,
``hvdlite.tensorflow.keras.elastic``); see :mod:`hvdlite.elastic.state` and
docs/elastic.md.

``run(func)`` wraps a training function ``func(state, ...)``.  In a plain
job it syncs the state from rank 0 and calls ``func`` once.  Under elastic
hvdrun (``--min-np``/``--max-np``/``--host-discovery-script``) with restart
recovery it first resumes from the newest commit any host holds, and when the
hosts change or a peer is lost, the rank leaves for hvdrun to start the job
again on the hosts it has (:mod:`hvdlite.elastic.worker`). With in-place
recovery the rank stays: it restores its last commit, joins the next
generation and goes on (:mod:`hvdlite.elastic.in_place`).
"""
import functools
import re

from ..exceptions import HvdliteShutdownError, MPIError
from . import worker
from .state import HostsUpdatedInterrupt, ObjectState, State


def run(func):
    """Decorator for a training function ``func(state, *args, **kwargs)``."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError("an elastic training function takes a state object (e.g. "
                            f"hvd.elastic.TorchState) as its first argument, not {state!r}")
        ctx = worker.context()
        if ctx is None:
            state.sync()
            return func(state, *args, **kwargs)
        if ctx.in_place:
            from . import in_place
            return in_place.run(func, state, ctx, peer_lost, args, kwargs)
        try:
            worker.resume(state, ctx)
            result = func(state, *args, **kwargs)
            worker.finish(ctx)
            return result
        except HostsUpdatedInterrupt:
            worker.leave("the hosts changed; the state is committed")
        except Exception as e:  # noqa: BLE001 - re-raised unless a peer was lost
            lost = peer_lost(e)
            if lost is None:
                raise
            worker.leave(lost)
    return wrapper


# The engine errors that mean "a peer is gone": the job restarts without it.
_PEER_ERRORS = (HvdliteShutdownError, MPIError)
_PEER_ERROR_TEXT = re.compile(r"\b(HvdliteShutdownError|HvdliteTimeoutError|MPIError): .*")


def peer_lost(error):
    """What ``error`` says about a lost peer ("HvdliteShutdownError: ..."), or
    None when it is not about one. The engine's error may come wrapped:
    chained (``raise ... from``), or as text only, where torch ran the code
    that raised it (a torch.distributed backend's future: DDP's backward
    raises a RuntimeError whose message carries the engine error), or in a
    TensorFlow op's error (its text names the class, a line or more down
    in a graph's error)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        first = text.splitlines()[0] if text else ""
        if isinstance(error, _PEER_ERRORS):
            return "%s: %s" % (type(error).__name__, first)
        if isinstance(error, RuntimeError) or type(error).__module__.startswith("tensorflow"):
            found = _PEER_ERROR_TEXT.search(first if isinstance(error, RuntimeError) else text)
            if found:
                return found.group(0)
        error = error.__cause__ or error.__context__
    return None


__all__ = ["State", "ObjectState", "HostsUpdatedInterrupt", "run"]
