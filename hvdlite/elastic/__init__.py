"""Elastic training: state objects and ``run``, shared by the framework
adapters (``hvdlite.torch.elastic``, ``hvdlite.tensorflow.elastic``,
``hvdlite.tensorflow.keras.elastic``); see :mod:`hvdlite.elastic.state` and
docs/elastic.md.

``run(func)`` wraps a training function ``func(state, ...)``.  In a plain
job it syncs the state from rank 0 and calls ``func`` once.  Under elastic
hvdrun (``--min-np``/``--max-np``/``--host-discovery-script``) it first
resumes from the newest commit any host holds, and when the hosts change or
a peer is lost, the rank leaves for hvdrun to start the job again on the
hosts it has (:mod:`hvdlite.elastic.worker`).
"""
import functools

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
        try:
            worker.resume(state, ctx)
            result = func(state, *args, **kwargs)
            worker.finish(ctx)
            return result
        except HostsUpdatedInterrupt:
            worker.leave("the hosts changed; the state is committed")
        except (HvdliteShutdownError, MPIError) as e:
            worker.leave("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
    return wrapper


__all__ = ["State", "ObjectState", "HostsUpdatedInterrupt", "run"]
