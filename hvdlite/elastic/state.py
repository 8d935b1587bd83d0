"""Training state that every rank can commit, restore and synchronize:
Horovod's elastic state objects, without TensorFlow or torch.

A state holds what a training loop needs to continue after an interruption
(model and optimizer handled by the framework subclasses, plus plain Python
attributes such as ``state.epoch`` and ``state.batch``):

- ``commit()`` saves a copy in host memory (``save()``); under elastic hvdrun
  the host's local rank 0 also has it written to the host's shared memory
  by a background thread, where the next generation of the job finds it;
  then it checks for host updates (a flag, see ``check_host_updates``);
- ``restore()`` puts the last committed copy back;
- ``sync()`` makes every rank's state equal to rank 0's and saves it;
- ``check_host_updates()`` raises HostsUpdatedInterrupt on every rank when
  hvdrun found other hosts;
- ``register_reset_callbacks(fns)``: called by ``on_reset()``, when a job
  starts again after its membership changed.

Subclasses say what a commit holds: ``_commit_payload()`` returns the saved
copy as picklable objects, ``_load_commit_payload(p)`` makes ``p`` the saved
copy (``restore()`` then applies it); ``_persist_ticket()`` hands the saved
copy to the background writer (by default the payload as it is now: states
whose save replaces its objects rather than writing into them need nothing
more).
"""

class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``check_host_updates()`` on every rank when hosts were added
    or removed; ``skip_sync`` is True when only removals happened (the
    remaining ranks already agree)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


class _PayloadTicket:
    def __init__(self, seq, payload):
        self.seq, self.payload = seq, payload

    def acquire(self):
        return self.seq, self.payload

    def release(self):
        pass


class State:
    """Base of every state object.

    ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank;
    ``get_rank()`` is this rank. Subclasses implement ``save``, ``restore`` and
    ``sync`` and may override ``reset``."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions (no arguments) to call after a reset, e.g. to rescale the
        learning rate for the new number of ranks."""
        callbacks = list(callbacks)
        for fn in callbacks:
            if not callable(fn):
                raise TypeError(f"register_reset_callbacks takes callables, not {fn!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """After the job's membership changed: ``reset()``, then the callbacks."""
        self.reset()
        for fn in self._reset_callbacks:
            fn()

    _commit_seq = 0

    def commit(self):
        """Saves the current state as the one ``restore()`` returns to (and,
        under elastic hvdrun, the one a restarted job resumes from), then
        checks for host updates. A copy in host memory; writing it to the
        host's shared memory (elastic hvdrun) happens in the background."""
        from . import worker
        self._commit_seq += 1
        self.save()
        worker.persist(self)
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when hvdrun's elastic
        driver found other hosts than the job runs on. Rank 0 learns it from
        a background thread; the ranks agree through a broadcast started at
        one check and read at the next, so every rank raises at the same
        check, one check after rank 0 saw the change. Outside an elastic job
        this returns at once and communicates nothing."""
        from . import worker
        if worker.hosts_changed():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _commit_payload(self):
        raise NotImplementedError

    def _persist_ticket(self):
        """The saved copy for the background writer: an object with
        ``acquire()`` -> (seq, payload) or None (not now, ask again) and
        ``release()``."""
        return _PayloadTicket(self._commit_seq, self._commit_payload())

    def _load_commit_payload(self, payload):
        raise NotImplementedError

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        """Subclass hook run by ``on_reset()`` before the reset callbacks."""


class ObjectState(State):
    """State made of Python objects given as keyword arguments; each becomes
    an attribute (``ObjectState(bcast, rank, epoch=0).epoch``).

    ``save()`` records the attributes' current values, ``restore()`` sets
    them back, ``sync()`` replaces them with rank 0's recorded values. Values
    are recorded as they are, not copied (as in Horovod): numbers, strings
    and tuples behave as snapshots; an object changed in place (a list, a
    dict) is the same object in the commit, so assign a new one instead."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def _commit_payload(self):
        return {"attributes": dict(self._saved_state)}

    def _load_commit_payload(self, payload):
        self._saved_state = dict(payload["attributes"])

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)
