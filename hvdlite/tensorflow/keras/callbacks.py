"""Keras callbacks for data-parallel training (Horovod's names and semantics),
for Keras 3 and Keras 2 (tf_keras) models alike.

Each callback is a subclass of :class:`callback_base.Callback`, which
serves a model of either Keras. ``LocalSGDCallback`` and ``DiLoCoCallback``
(communicate less often) are :mod:`.local_sgd`'s.
"""
import warnings

import numpy as np

from ... import basics, exceptions
from ...process_sets import global_process_set
from .. import functions
from .. import keras_flavor as flavor
from .callback_base import Callback  # noqa: F401  (the base, public here)


def prepare_model_for_training(model, verbose=True):
    """What must happen before the first training step, for hvdlite:

    - jit_compile: the reduction cannot run inside XLA, so it is turned off
      (with a warning) and the train function rebuilt;
    - Keras 3: a LossScaleOptimizer that compile() put around a distributed
      optimizer becomes the distributed one (see keras3_optimizer);
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
    if opt is None or not flavor.is_optimizer(opt):
        return
    if flavor.of(opt) == flavor.KERAS3:
        from . import keras3_optimizer
        keras3_optimizer.move_to_loss_scale(opt)
    flavor.build_optimizer(opt, model.trainable_variables)


def _variable_list(variables, what):
    if variables is None:
        return []
    if flavor.is_variable(variables):
        return [variables]
    variables = list(variables)
    for v in variables:
        if not flavor.is_variable(v):
            raise exceptions.InvalidArgumentError(
                f"{what}: local_variables must be tf.Variable or Keras Variable objects, not "
                f"{type(v).__module__}.{type(v).__name__}")
    return variables


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of training, sets every rank's model and optimizer
    variables to ``root_rank``'s, so all ranks start from the same state
    (random initialisation or a checkpoint restored on one rank).

    ``local_variables`` (a variable or a list; more with
    ``register_local_var``) keep each rank's own value. Also turns off
    jit_compile (with a warning) and builds the optimizer first, so its slots
    are broadcast too. Runs once, on the first fit()."""

    def __init__(self, root_rank=0, device="", local_variables=None,
                 process_set=global_process_set):
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.process_set = process_set
        self.broadcast_done = False
        self._local_vars = {}
        for var in _variable_list(local_variables, "BroadcastGlobalVariablesCallback"):
            self.register_local_var(var)

    def register_local_var(self, var):
        """``var`` is not broadcast: every rank keeps its own value."""
        self._local_vars[id(var)] = var

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        prepare_model_for_training(self.model)
        variables = [v for v in self.model.weights if id(v) not in self._local_vars]
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and flavor.is_optimizer(opt):
            variables += flavor.optimizer_variables(opt)
        op = functions.broadcast_variables(variables, self.root_rank, process_set=self.process_set,
                                           name="BroadcastGlobalVariablesCallback")
        if op is not None:  # a TF1 graph (tf_keras without eager execution): run it now
            flavor.graph_session().run(op)
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """At the end of every epoch, replaces each numeric metric in ``logs``
    (training and validation) with its average over all ranks. Keras' History
    and progress bar, which run after user callbacks, then show the averages.
    Put it before callbacks that read metrics (checkpoints, schedulers)."""

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.device = device
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        local = {}
        for key in sorted(logs):
            try:
                local[key] = float(np.asarray(logs[key], dtype=np.float64))
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


def _get_lr(model):
    return flavor.get_value(model.optimizer.learning_rate)


def _set_lr(model, value):
    opt = model.optimizer
    try:
        opt.learning_rate = value
    except (TypeError, ValueError, AttributeError) as e:
        raise exceptions.InvalidArgumentError(
            "hvdlite learning-rate callbacks need an optimizer whose learning_rate is a number, "
            f"not a LearningRateSchedule ({e})") from None


class LearningRateScheduleCallback(Callback):
    """Sets ``lr = initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``.

    ``multiplier`` is a function of the epoch, or a number m meaning
    ``m ** (epoch - start_epoch)`` (exponential decay), as in Horovod. With
    ``staircase=True`` the rate changes when an epoch starts (integer
    epochs); with False on every batch, using the fractional epoch
    ``epoch + batch / steps_per_epoch`` (from fit() unless given).
    ``initial_lr`` defaults to the optimizer's rate when training starts.
    ``momentum_correction``: when the rate changes, an optimizer whose
    ``momentum`` is a variable (tf_keras legacy optimizers) gets its momentum
    scaled by new/old rate for that batch (Goyal et al. 2017); Keras 3 and
    tf_keras optimizers hold momentum as a Python number, which is left alone.
    The epoch's rate is logged as ``lr`` (tf_keras) or ``learning_rate``
    (Keras 3)."""

    def __init__(self, initial_lr=None, multiplier=1.0, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        if not callable(multiplier):
            base = float(multiplier)
            multiplier = lambda epoch: base ** (epoch - start_epoch)  # noqa: E731
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self.restore_momentum = None

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        old_lr = _get_lr(self.model)
        lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(self.model, lr)
        momentum = getattr(self.model.optimizer, "momentum", None)
        if self.momentum_correction and flavor.is_variable(momentum) and old_lr and lr != old_lr:
            if self.restore_momentum is None:
                self.restore_momentum = flavor.get_value(momentum)
            momentum.assign(self.restore_momentum * lr / old_lr)
        return lr

    def _steps_per_epoch(self):
        params = self.params or {}
        if params.get("steps"):
            return params["steps"]
        if params.get("samples") and params.get("batch_size"):
            return params["samples"] // params["batch_size"]
        raise exceptions.InvalidArgumentError(
            f"{type(self).__name__}(staircase=False) needs steps_per_epoch: fit() did not report "
            "it (an unsized dataset?); pass steps_per_epoch=")

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            lr = self._adjust(epoch)
            if self.verbose and basics.rank() == 0:
                print(f"\nEpoch {epoch + 1}: {type(self).__name__} sets learning rate to {lr:.6g}.")

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._in_range(epoch):
            self._adjust(epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self.model.optimizer.momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            key = "lr" if flavor.of(self.model) == flavor.KERAS2 else "learning_rate"
            logs[key] = _get_lr(self.model)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up ("Accurate, Large Minibatch SGD", Goyal et al. 2017):
    over ``warmup_epochs`` the rate rises linearly, batch by batch, from
    ``initial_lr / size`` to ``initial_lr`` (the rate already scaled for the
    number of ranks), reaching it on the last batch of the warm-up; later
    epochs keep it. At batch b of epoch e the rate is
    ``initial_lr / size * (t * (size - 1) / warmup_epochs + 1)`` with
    ``t = e + (b + 1) / steps_per_epoch``, as in Horovod."""

    def __init__(self, initial_lr=None, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            n = basics.size()
            t = epoch + 1.0 / self.steps_per_epoch
            return (t * (n - 1) / warmup_epochs + 1.0) / n if warmup_epochs > 0 else 1.0

        super().__init__(initial_lr=initial_lr, multiplier=multiplier, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
                         verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            _set_lr(self.model, self.initial_lr)
            if self.verbose and basics.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished learning-rate warm-up to "
                      f"{self.initial_lr:.6g}.")
        super().on_epoch_end(epoch, logs)


class BestModelCheckpoint(flavor.module().callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps only the best model (``save_best_only``),
    Horovod's callback. ``filepath`` may be given here or set as an attribute
    before training (Horovod's Spark estimator sets it)."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        # Keras 3 checks the file extension when constructed: build with a
        # placeholder of the right kind, then keep what was given.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath = filepath

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise exceptions.InvalidArgumentError(
                "BestModelCheckpoint: set filepath (BestModelCheckpoint(filepath=...) or "
                "callback.filepath = ...) before training")
        super().on_train_begin(logs)


from .local_sgd import DiLoCoCallback, LocalSGDCallback  # noqa: E402,F401
