"""State objects for resumable training, shared by the framework adapters
(``hvdlite.torch.elastic``, ``hvdlite.tensorflow.elastic``,
``hvdlite.tensorflow.keras.elastic``); see :mod:`hvdlite.elastic.state`.

``run(func)`` wraps a training function ``func(state, ...)``: it syncs the
state from rank 0, then calls ``func``. What it does not do yet: hvdlite has
no elastic driver, so ranks are never added or removed while a job runs,
and a failed rank ends the job (as in any hvdlite run) instead of the
others restoring the last commit and continuing.
"""
import functools

from .state import HostsUpdatedInterrupt, ObjectState, State


def run(func):
    """Decorator for a training function ``func(state, *args, **kwargs)``:
    the wrapper syncs ``state`` from rank 0, then runs ``func`` once and
    returns its result (see the module doc for what is missing)."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError("an elastic training function takes a state object (e.g. "
                            f"hvd.elastic.TorchState) as its first argument, not {state!r}")
        state.sync()
        return func(state, *args, **kwargs)
    return wrapper


__all__ = ["State", "ObjectState", "HostsUpdatedInterrupt", "run"]
