"""Communicate less often in ``model.fit``: local SGD and DiLoCo as Keras
callbacks, for Keras 3 and Keras 2 (tf_keras) models alike.

The model is compiled with a plain optimizer (not a DistributedOptimizer),
so every rank steps on its own batches with no reduction; after every
``sync_every`` batches the callback meets the other ranks through hvdlite's
engine (averaged allreduces of all tensors at once, which the engine fuses):

- :class:`LocalSGDCallback` averages the weights themselves;
- :class:`DiLoCoCallback` averages each rank's outer gradient ``anchor -
  weights``, takes an outer step (SGD with Nesterov momentum) on the anchor
  and sets the weights to it; with ``fragments=F`` (Streaming DiLoCo) the
  weights sync in F fragments on staggered steps, each reduction running
  in the engine while the next ``overlap_steps`` batches train.

Why callbacks and not an optimizer wrapper: the sync runs between two
batches, outside the compiled train step, so it is the same Python code for
Keras 3 and tf_keras, for compiled and eager models, and it can leave a
reduction in flight across batches (the engine's async handles; a train
step compiled by ``tf.function`` could not hold one open). The schedule and
the outer step are those of :mod:`hvdlite.torch.local_sgd` (shared in
:mod:`hvdlite.local_sgd`). See docs/compression.md ("Communicate less
often").
"""
import numpy as np
import tensorflow as tf

from ... import local_sgd as common, ops
from ...compression import Compression
from ...process_sets import global_process_set
from .. import functions
from .. import keras_flavor as flavor
from .callback_base import Callback


def _is_float(variable):
    return tf.as_dtype(variable.dtype).is_floating


def _piece(array, first, end):
    """Elements [first, end) of ``array`` flattened; the array itself when that is all of it."""
    return array if first == 0 and end == array.size else array.reshape(-1)[first:end]


def _value(variable):
    return np.array(variable.numpy(), copy=True, order="C")


class _PeriodicCallback(Callback):
    """What LocalSGDCallback and DiLoCoCallback share."""

    what = "?"

    def __init__(self, sync_every, sync_buffers, compression, process_set, name,
                 sync_on_train_end):
        super().__init__()
        self.sync_every = common.check_sync_every(sync_every, self.what)
        self.sync_buffers = bool(sync_buffers)
        self.compression = common.check_compression(compression, self.what)
        self.process_set = common.check_process_set(process_set, self.what)
        self.name = common.check_name(name, self.what)
        self.sync_on_train_end = bool(sync_on_train_end)
        self.local_step = 0          # train batches finished so far

    # ------------------------------------------------------------ the model
    def _the_model(self):
        model = getattr(self, "model", None)
        if model is None:
            raise common.bad(f"{self.what}: no model yet; pass the callback to model.fit (or "
                             "call set_model(model)) first")
        return model

    def _params(self):
        return list(self._the_model().trainable_variables)

    def _buffers(self):
        if not self.sync_buffers:
            return []
        return [v for v in self._the_model().non_trainable_variables if _is_float(v)]

    def _check_model(self):
        """Refuses what would make the schedule wrong, before the first batch."""
        model = self._the_model()
        if not tf.executing_eagerly():
            raise common.bad(f"{self.what} syncs between batches, eagerly: it does not run in a "
                             "TF1 graph (tf_keras with eager execution disabled); enable eager "
                             "execution")
        spe = getattr(model, "steps_per_execution", None)
        if spe is None:
            spe = getattr(model, "_steps_per_execution", None)
        if spe is not None and int(flavor.get_value(spe)) != 1:
            raise common.bad(f"{self.what} counts train batches; compile with "
                             "steps_per_execution=1 (Keras calls batch callbacks once per "
                             "execution)")
        opt = getattr(model, "optimizer", None)
        if opt is not None and flavor.is_optimizer(opt):
            from .optimizer import is_distributed
            if is_distributed(opt):
                raise common.bad(f"{self.what}: compile the model with the plain Keras "
                                 "optimizer, not a DistributedOptimizer (it would average the "
                                 "gradients at every step); the callback does the syncing")
        if not self._params():
            raise common.bad(f"{self.what}: the model has no trainable variables")

    def _reduce_async(self, arrays, suffix):
        """Starts averaging ``arrays`` across the process set: one request per
        array, all at once, so the engine fuses them; NumPy's async handles."""
        return ops.grouped_allreduce_async(arrays, op=ops.Average, name=f"{self.name}.{suffix}",
                                           process_set=self.process_set,
                                           compression=self.compression)

    @staticmethod
    def _wait(handles):
        return [ops.synchronize(h) for h in handles]

    def on_train_begin(self, logs=None):
        self._check_model()

    def on_train_batch_end(self, batch, logs=None):
        self.local_step += 1
        self._after_step()

    def on_train_end(self, logs=None):
        if self.sync_on_train_end:
            self.synchronize()


class LocalSGDCallback(_PeriodicCallback):
    """Local SGD in ``model.fit``: each rank steps alone, and after every
    ``sync_every`` train batches the model's trainable variables are
    averaged across the ranks of ``process_set``.

        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=...)
        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.LocalSGDCallback(sync_every=8)])

    Arguments:
        sync_every: H, the number of train batches between two averages.
        sync_buffers: also average the model's floating-point non-trainable
            variables (BatchNormalization's moving statistics).
        compression: hvdlite Compression of the average (``Compression.fp16``
            halves the bytes; the average is then rounded).
        process_set: average only over these ranks (each of them runs it).
        name: prefix of the reductions' names (unique per callback).
        sync_on_train_end: average once more when fit() ends (unless the last
            batch just did), so every rank ends with the same weights.

    The optimizer's own state (momentum) stays local. Compile with the plain
    optimizer and ``steps_per_execution=1``; runs eagerly between batches
    (compiled or eager models, Keras 3 or tf_keras).
    ``state_dict()``/``load_state_dict()`` keep the step count;
    ``hvd.elastic.KerasState(model, local_sgd=callback)`` commits it.
    """

    what = "LocalSGDCallback"

    def __init__(self, sync_every, sync_buffers=False, compression=Compression.none,
                 process_set=global_process_set, name="local_sgd", sync_on_train_end=True):
        super().__init__(sync_every, sync_buffers, compression, process_set, name,
                         sync_on_train_end)

    def _after_step(self):
        if self.local_step % self.sync_every == 0:
            self.synchronize()

    def on_train_end(self, logs=None):
        if self.sync_on_train_end and self.local_step % self.sync_every != 0:
            self.synchronize()

    def synchronize(self):
        """Averages the weights (and buffers if asked) now; every rank calls it."""
        variables = self._params() + self._buffers()
        averaged = self._wait(self._reduce_async([_value(v) for v in variables], "params"))
        for v, a in zip(variables, averaged):
            v.assign(a)

    def state_dict(self):
        return {"local_step": self.local_step}

    def load_state_dict(self, state_dict):
        self.local_step = int(state_dict["local_step"])

    def broadcast_state(self, root_rank=0):
        """Makes the step count ``root_rank``'s."""
        self.load_state_dict(functions.broadcast_object(
            self.state_dict(), root_rank, name=f"{self.name}.state", process_set=self.process_set))


class DiLoCoCallback(_PeriodicCallback, common.FragmentSyncs):
    """DiLoCo in ``model.fit``: each rank's optimizer (the inner one) steps
    alone; after every ``sync_every`` (H) train batches each rank's outer
    gradient ``anchor - weights`` is averaged through the engine, the outer
    optimizer (SGD, Nesterov momentum) steps on the anchor with it, and every
    rank's weights become the new anchor.

        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=...)
        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.DiLoCoCallback(sync_every=50, fragments=4)])

    The anchor is taken at the first train batch (after the broadcast) and
    kept in host memory; the outer step is torch.optim.SGD's update computed
    on it with NumPy (``outer_lr``, ``outer_momentum``, ``outer_nesterov``;
    defaults 1.0, 0.5, True as in hvdlite.torch.DiLoCo). With
    ``fragments=F`` > 1 the trainable variables' elements are split, in model
    order, into F runs of equal size (a variable may be cut between two; as
    torch's); fragment f syncs after the batches
    t > f*H//F where ``(t - f*H//F) % H == 0``. Its reduction starts then (an
    engine async handle) and is finished ``overlap_steps`` batches later,
    while those batches train; the outer step is applied then and that
    fragment's weights are set to its new anchor.

    Arguments:
        sync_every: H, train batches between two syncs of a fragment.
        fragments: F, the number of fragments (1: plain DiLoCo).
        overlap_steps: batches a fragment's reduction overlaps; default 1
            with fragments > 1, else 0. Must be < H.
        outer_lr, outer_momentum, outer_nesterov: the outer SGD.
        compression: hvdlite Compression of the outer gradients
            (``Compression.fp16``/``.bf16`` halve the bytes;
            ``Compression.quantize()`` sends 4 bits, as Streaming DiLoCo).
        sync_buffers: average the floating-point non-trainable variables
            (BatchNormalization's moving statistics) with fragment 0.
        process_set: sync only over these ranks.
        name: prefix of the reductions' names (unique per callback).
        sync_on_train_end: when fit() ends, finish the syncs in flight and
            take an outer step for every fragment (``synchronize()``), so
            every rank ends with the same weights.

    Compile with the plain optimizer and ``steps_per_execution=1``.
    ``state_dict()`` holds the anchor, the outer momentum and the step count
    (the inner optimizer's state is the optimizer's);
    ``hvd.elastic.KerasState(model, diloco=callback)`` commits them with the
    model, so a restart resumes from the last outer step.
    """

    what = "DiLoCoCallback"

    def __init__(self, sync_every=100, fragments=1, overlap_steps=None, outer_lr=common.OUTER_LR,
                 outer_momentum=common.OUTER_MOMENTUM, outer_nesterov=True, compression=Compression.none,
                 sync_buffers=False, process_set=global_process_set, name="diloco",
                 sync_on_train_end=True):
        super().__init__(sync_every, sync_buffers, compression, process_set, name,
                         sync_on_train_end)
        self.fragments = common.check_fragments(fragments, self.sync_every, self.what)
        self.overlap_steps = common.check_overlap(overlap_steps, self.fragments,
                                                  self.sync_every, self.what)
        self.outer = common.OuterSGD(0, outer_lr, outer_momentum, outer_nesterov, self.what)
        self.offsets = common.fragment_offsets(self.fragments, self.sync_every)
        self.fragment_pieces = None  # per fragment: (variable, first, end element) pieces
        self.anchor = None           # taken at the first batch (after the broadcast)
        self._init_syncs()           # _pending: fragment -> (finish after step, handles, n outer grads)

    # ---------------------------------------------------------------- anchor
    def _layout(self):
        params = self._params()
        if self.fragment_pieces is None:
            sizes = [int(np.prod(v.shape)) for v in params]
            common.check_fragments_fit(self.fragments, sum(sizes), self.what)
            self.fragment_pieces = common.split_fragments(sizes, self.fragments)
        return params

    def _check_model(self):
        super()._check_model()
        self._layout()

    def _ensure_anchor(self):
        params = self._layout()
        if self.anchor is None:
            self.anchor = [_value(v) for v in params]
            self.outer.momentum_buffers = [None] * len(params)
        return params

    # ---------------------------------------------------------------- stepping
    def on_train_batch_begin(self, batch, logs=None):
        if self.anchor is None:
            self._ensure_anchor()

    def _after_step(self):
        self._syncs_after_step()

    def _start(self, f):
        params = self._ensure_anchor()
        pieces = self.fragment_pieces[f]
        values = {i: _value(params[i]) for i in {i for i, _, _ in pieces}}
        # The outer gradient is taken now; the engine reduces it while the
        # next batches train.
        deltas = [_piece(self.anchor[i], a, b) - _piece(values[i], a, b) for i, a, b in pieces]
        buffers = [_value(b) for b in self._buffers()] if f == 0 else []
        handles = self._reduce_async(deltas + buffers, f"fragment{f}")
        self._keep_pending(f, (self.local_step + self.overlap_steps, handles, len(deltas)))

    def _await_reduction(self, entry):
        self._wait(entry[1])

    def _finish(self, f):
        _, handles, n = self._pending.pop(f)
        reduced = self._wait(handles)
        params = self._params()
        pieces = self.fragment_pieces[f]
        self.outer.step(self.anchor, reduced[:n], pieces)
        for i in {i for i, _, _ in pieces}:
            # A variable cut across fragments keeps its other pieces' local values.
            mine = [(a, b) for j, a, b in pieces if j == i]
            if mine == [(0, self.anchor[i].size)]:
                params[i].assign(self.anchor[i])
                continue
            value = _value(params[i])
            for a, b in mine:
                value.reshape(-1)[a:b] = self.anchor[i].reshape(-1)[a:b]
            params[i].assign(value)
        for b, avg in zip(self._buffers() if n < len(reduced) else [], reduced[n:]):
            b.assign(avg)

    # ---------------------------------------------------------------- state
    def state_dict(self):
        """Anchor (None before the first batch), outer momentum and step
        count, as NumPy arrays: what a restart needs to resume from the last
        outer step. Syncs in flight are not part of it (their fragments'
        progress goes into the next sync)."""
        copy = (lambda xs: None if xs is None else
                [None if x is None else x.copy() for x in xs])
        return {"local_step": self.local_step, "anchor": copy(self.anchor),
                "outer_momentum": copy(self.outer.momentum_buffers if self.anchor is not None
                                       else None)}

    def load_state_dict(self, state_dict):
        self._drop_pending()
        anchor = state_dict["anchor"]
        if anchor is not None and getattr(self, "model", None) is not None:
            params = self._layout()
            if len(anchor) != len(params) or any(
                    tuple(a.shape) != tuple(v.shape) for a, v in zip(anchor, params)):
                raise common.bad(f"{self.what}.load_state_dict: the saved anchor does not match "
                                 "this model's trainable variables; load a state saved from the "
                                 "same model")
        self.anchor = None if anchor is None else [np.array(a, copy=True) for a in anchor]
        bufs = state_dict["outer_momentum"]
        self.outer.momentum_buffers = (
            [None] * (0 if anchor is None else len(anchor)) if bufs is None else
            [None if b is None else np.array(b, copy=True) for b in bufs])
        self.local_step = int(state_dict["local_step"])

    def broadcast_state(self, root_rank=0):
        """Makes the anchor, outer momentum and step count ``root_rank``'s
        (syncs in flight are dropped: load_state_dict drops them)."""
        self.load_state_dict(functions.broadcast_object(
            self.state_dict(), root_rank, name=f"{self.name}.state", process_set=self.process_set))


__all__ = ["LocalSGDCallback", "DiLoCoCallback"]
