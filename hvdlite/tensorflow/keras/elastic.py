"""Elastic state and its Keras callbacks (Horovod's ``hvd.elastic`` for Keras).

    state = hvd.elastic.KerasState(model, optimizer, batch=0, epoch=0)
    state.sync()                                   # everyone starts from rank 0's state
    model.fit(..., epochs=total_epochs - state.epoch,     # Keras counts from 0 again
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=10)])

The commit callback goes last, so a commit records the epoch and batch the
update callbacks just set.

Under elastic hvdrun, wrap the fit() call in a function decorated with
``hvd.elastic.run``: the job then resumes from the newest commit after a host
is lost or added (docs/elastic.md).
"""
from ...exceptions import InvalidArgumentError
from ..elastic import HostsUpdatedInterrupt, ObjectState, TensorFlowKerasState, run
from .callbacks import Callback
from .local_sgd import _PeriodicCallback


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer (default: the compiled one) and
    Python attributes (``batch=0, epoch=0``, ...).

    A LocalSGDCallback or DiLoCoCallback given as a keyword argument
    (``KerasState(model, diloco=callback, epoch=0)``) is kept through its
    ``state_dict`` (DiLoCo: anchor, outer momentum, step count): commit
    saves it with the model, restore puts it back, sync makes it rank 0's,
    so a restart resumes from the last outer step. It stays reachable as
    ``state.diloco``."""

    def __init__(self, model, optimizer=None, **kwargs):
        self._periodic = {k: v for k, v in kwargs.items() if isinstance(v, _PeriodicCallback)}
        for key, callback in self._periodic.items():
            del kwargs[key]
            if getattr(callback, "model", None) is None:
                callback.set_model(model)
            elif callback.model is not model:
                raise InvalidArgumentError(
                    f"KerasState: {key}= is a callback of another model; give the state the "
                    "model the callback trains")
        self._periodic_saved = {}
        self._save_periodic()
        super().__init__(model, optimizer=optimizer, **kwargs)
        for key, callback in self._periodic.items():
            setattr(self, key, callback)

    def _save_periodic(self):
        self._periodic_saved = {k: cb.state_dict() for k, cb in self._periodic.items()}

    def save(self):
        super().save()
        self._save_periodic()

    def restore(self):
        super().restore()
        for key, callback in self._periodic.items():
            if key in self._periodic_saved:
                callback.load_state_dict(self._periodic_saved[key])

    def sync(self):
        super().sync()
        for callback in self._periodic.values():
            callback.broadcast_state(root_rank=0)
        self._save_periodic()

    def _commit_payload(self):
        return dict(super()._commit_payload(), periodic=dict(self._periodic_saved))

    def _load_commit_payload(self, payload):
        super()._load_commit_payload(payload)
        self._periodic_saved = dict(payload.get("periodic", {}))


class CommitStateCallback(Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end
    of every epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int) \
                or batches_per_commit < 1:
            raise InvalidArgumentError(
                f"CommitStateCallback: batches_per_commit must be an int >= 1, got "
                f"{batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(Callback):
    """Keeps ``state.batch`` at the last finished batch of the epoch (0 when
    an epoch ends). With a known number of steps per epoch, the first epoch
    after a restore runs only the batches that were not done yet."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params and self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(Callback):
    """Keeps ``state.epoch`` at the number of finished epochs, counted across
    fit() calls that started from ``state.epoch``."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "TensorFlowKerasState", "ObjectState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "HostsUpdatedInterrupt", "run"]
