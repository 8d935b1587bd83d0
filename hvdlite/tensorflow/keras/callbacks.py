"""Keras 3 callbacks for data-parallel training (Horovod's names)."""
import warnings

import keras
import numpy as np

from ... import exceptions
from ...process_sets import global_process_set
from .. import functions
from . import optimizer as _optimizer


def prepare_model_for_training(model, verbose=True):
    """What must happen before the first training step, for hvdlite:

    - jit_compile: the reduction cannot run inside XLA, so it is turned off
      (with a warning) and the train function rebuilt;
    - a LossScaleOptimizer that compile() put around a distributed optimizer
      becomes the distributed one (see hvdlite.tensorflow.keras.optimizer);
    - the optimizer is built, so its variables exist and can be broadcast.
    """
    if getattr(model, "_jit_compile", None) and not model.run_eagerly:
        if verbose:
            warnings.warn("hvdlite: jit_compile=True cannot run hvdlite's collectives (XLA cannot "
                          "compile them); training with jit_compile=False", RuntimeWarning,
                          stacklevel=3)
        model.jit_compile = False
        model.make_train_function(force=True)
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return
    _optimizer.move_to_loss_scale(opt)
    if not opt.built:
        with keras.name_scope(opt.name, caller=opt):
            opt.build(model.trainable_variables)
        opt.built = True


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, sets every rank's model and optimizer
    variables to ``root_rank``'s, so all ranks start from the same state
    (random initialisation or a checkpoint restored on one rank).

    Also turns off jit_compile (with a warning) and builds the optimizer
    first, so its slots are broadcast too. Runs once, on the first fit()."""

    def __init__(self, root_rank=0, device="", process_set=global_process_set):
        super().__init__()
        self.root_rank = int(root_rank)
        self.process_set = process_set
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        prepare_model_for_training(self.model)
        variables = list(self.model.weights)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            variables += list(opt.variables)
        functions.broadcast_variables(variables, self.root_rank, process_set=self.process_set,
                                      name="BroadcastGlobalVariablesCallback")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each numeric metric in ``logs``
    (training and validation) with its average over all ranks. Keras' History
    and progress bar, which run after user callbacks, then show the averages.
    Put it before callbacks that read metrics (checkpoints, schedulers)."""

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        local = {}
        for key in sorted(logs):
            value = logs[key]
            try:
                local[key] = float(np.asarray(value, dtype=np.float64))
            except (TypeError, ValueError):
                continue
        everyone = functions.allgather_object(local, name=f"MetricAverageCallback.{epoch}",
                                              process_set=self.process_set)
        keys = list(local)
        for r, theirs in enumerate(everyone):
            if list(theirs) != keys:
                raise exceptions.InvalidArgumentError(
                    f"MetricAverageCallback: ranks log different metrics at epoch {epoch} "
                    f"(this rank: {keys}; rank {r}: {list(theirs)})")
        for key in keys:
            logs[key] = float(np.mean([theirs[key] for theirs in everyone]))


def _set_lr(model, value):
    opt = model.optimizer
    try:
        opt.learning_rate = value
    except (TypeError, ValueError, AttributeError) as e:
        raise exceptions.InvalidArgumentError(
            "hvdlite learning-rate callbacks need an optimizer whose learning_rate is a number, "
            f"not a LearningRateSchedule ({e})") from None


def _get_lr(model):
    return float(np.asarray(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets ``lr = initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``.

    ``multiplier`` is a number or a function of the epoch. With
    ``staircase=True`` the rate changes at epoch starts (integer epochs);
    with False on every batch, using the fractional epoch
    ``epoch + batch / steps_per_epoch`` (steps per epoch from fit() unless
    given). ``initial_lr`` defaults to the optimizer's rate when training
    starts. ``momentum_correction`` is accepted for Horovod compatibility:
    Keras 3 compiles the momentum into the train function as a constant, so
    it is not rescaled."""

    def __init__(self, initial_lr=None, multiplier=1.0, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        if not callable(multiplier):
            constant = float(multiplier)
            multiplier = lambda _epoch: constant  # noqa: E731
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(self.model, lr)
        return lr

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model)
        if not self.staircase and self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise exceptions.InvalidArgumentError(
                    f"{type(self).__name__}(staircase=False) needs steps_per_epoch: fit() did not "
                    "report it (an unsized dataset?); pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            lr = self._adjust(epoch)
            if self.verbose and _is_root():
                print(f"\nEpoch {epoch + 1}: {type(self).__name__} sets learning rate to {lr:.6g}.")

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._in_range(epoch):
            self._adjust(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = _get_lr(self.model)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up ("Accurate, Large Minibatch SGD", Goyal et al. 2017):
    over ``warmup_epochs`` the rate rises linearly, batch by batch, from
    ``initial_lr / size`` to ``initial_lr`` (the rate already scaled for the
    number of ranks); afterwards it stays at ``initial_lr``."""

    def __init__(self, initial_lr=None, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        from ... import basics

        def multiplier(epoch):
            n = basics.size()
            progress = min(epoch / warmup_epochs, 1.0) if warmup_epochs > 0 else 1.0
            return (1.0 + progress * (n - 1)) / n

        super().__init__(initial_lr=initial_lr, multiplier=multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
                         verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            _set_lr(self.model, self.initial_lr)
            if self.verbose and _is_root():
                print(f"\nEpoch {epoch + 1}: finished learning-rate warm-up to {self.initial_lr:.6g}.")
        super().on_epoch_end(epoch, logs)


def _is_root():
    from ... import basics
    return basics.rank() == 0

