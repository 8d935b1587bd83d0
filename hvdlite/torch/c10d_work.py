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
        self._devices = list(devices)
        self._settle = None         # the future's own, made by _future (below)
        self._then = None
        if self._devices:
            # A CUDA future records its events on the streams of the thread
            # that completes it: the finishing one, so it exists from the start.
            self._make_future()

    def _make_future(self):
        """Makes the future (under _outcome_lock); returns whether the outcome
        was already there, to be set by the caller."""
        settle = torch.futures.Future(devices=self._devices) if self._devices else torch.futures.Future()
        self._then = settle.then(self._value)
        self._settle = settle
        return self._outcome is not None

    @property
    def _future(self):
        """The future c10d sees. Made when first asked for (most works are
        only waited on; a future and its then() cost more than the rest of a
        small collective's call)."""
        settle = None
        with self._outcome_lock:
            if self._then is None and self._make_future():
                settle = self._settle
            future = self._then
        if settle is not None:
            settle.set_result(None)
        return future

    def _settle_with(self, compute):
        """Sets the outcome to ``compute()``'s value or exception, unless it
        is set already; then completes the future, if one was made (its
        then() callbacks run here)."""
        with self._outcome_lock:
            if self._outcome is not None:
                return
            try:
                self._outcome = (compute(), None)
            except BaseException as e:  # noqa: BLE001 - it belongs to the waiters
                self._outcome = (None, e)
            settle = self._settle
        if settle is not None:
            settle.set_result(None)

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
