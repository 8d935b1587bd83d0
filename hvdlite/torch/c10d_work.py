"""What the "hvdlite" torch.distributed backend's Work objects share
(c10d.py's collectives over engine handles, c10d_p2p.py's sends and
receives over MPI requests): an outcome set once, by whichever thread
finishes the work first, the future that completes with it, and wait()'s
default timeout, the group's.

The future c10d sees is a ``then()`` of a future of the work's own: setting
the outcome settles that one, whose ``then()`` callback returns the value or
raises the error. Only a raising ``then()`` callback marks a torch future
failed where C++ sees it: ``Future.set_exception`` stores the exception as the
future's value, which DDP's reducer would take for its gradients. torch keeps
the text of such an error, not its class: ``future.wait()`` and DDP's
backward raise a RuntimeError whose message carries the hvdlite error
("... HvdliteShutdownError: hvdlite has shut down: rank 1 ..."); ``wait()``
on the work raises the hvdlite error itself.
"""
import threading
from datetime import timedelta

import torch
from torch._C._distributed_c10d import Work

from hvdlite import exceptions


def seconds(timeout):
    """A c10d timeout (timedelta, seconds, None) in seconds; 0 for none."""
    if timeout is None:
        return 0.0
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


class OutcomeWork(Work):
    """A c10d Work whose outcome is set once by :meth:`_settle_with`.

    ``timeout``: the group's timeout (``init_process_group(timeout=)``,
    ``new_group(timeout=)``), what ``wait()`` without one waits at most.
    ``devices``: the CUDA devices of the work's tensors, for a CUDA future
    (c10d.HvdliteWork)."""

    def __init__(self, what, timeout=None, devices=()):
        super().__init__()
        self._what = what
        self._timeout = timeout
        self._outcome_lock = threading.RLock()
        self._outcome = None        # (value, exception) once finished
        self._done = threading.Event()
        self._settle = torch.futures.Future(devices=list(devices)) if devices else torch.futures.Future()
        self._future = self._settle.then(self._value)

    def _settle_with(self, compute):
        """Sets the outcome to ``compute()``'s value or exception, unless it
        is set already; then completes the future (its then() callbacks run
        here)."""
        with self._outcome_lock:
            if self._outcome is not None:
                return
            try:
                self._outcome = (compute(), None)
            except BaseException as e:  # noqa: BLE001 - it belongs to the waiters
                self._outcome = (None, e)
        try:
            self._settle.set_result(None)
        finally:
            self._done.set()

    def _value(self, _settled):
        value, error = self._outcome
        if error is not None:
            # A copy without the traceback of where it was first raised,
            # which torch would print after the message ("At: ...").
            try:
                error = type(error)(*error.args)
            except Exception:  # noqa: BLE001 - an exception type of other arguments
                pass
            raise error
        return value

    def _wait_limit(self, timeout):
        """(seconds, words for the error) wait() waits at most: its own
        timeout, else the group's; (0, None) for no limit."""
        own = seconds(timeout)
        if own > 0:
            return own, f"within {timeout}"
        group = seconds(self._timeout)
        if group > 0:
            return group, (f"within the group's timeout of {self._timeout} "
                           "(init_process_group(timeout=...) or new_group(timeout=...))")
        return 0.0, None

    def _timed_out(self, words):
        return exceptions.HvdliteTimeoutError(f"{self._what} did not complete {words}")

    def _raise_outcome(self):
        error = self._outcome[1]
        if error is not None:
            raise error
        return True

    def is_completed(self):
        return self._outcome is not None

    def is_success(self):
        return self._outcome is not None and self._outcome[1] is None

    def exception(self):
        return None if self._outcome is None else self._outcome[1]

    def result(self):
        self.wait()
        value = self._outcome[0]
        return value if isinstance(value, list) else []

    def synchronize(self):
        self.wait()
