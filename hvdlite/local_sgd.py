"""What local SGD and DiLoCo share across front ends, without torch or
TensorFlow: argument checks, Streaming DiLoCo's fragments and their
staggered schedule, and the outer optimizer's update on NumPy arrays.
:mod:`hvdlite.torch.local_sgd` and
:mod:`hvdlite.tensorflow.keras.local_sgd` build on it, so a model synced
by either follows the same schedule (docs/compression.md, "Communicate less
often")."""
import numpy as np

from . import exceptions
from .compression import Compressor


def bad(message):
    return exceptions.InvalidArgumentError(message)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_sync_every(sync_every, what):
    if not _is_int(sync_every) or sync_every < 1:
        raise bad(f"{what}: sync_every must be an int >= 1 (the number of local optimizer "
                  f"steps between two syncs), not {sync_every!r}")
    return int(sync_every)


def check_compression(compression, what):
    if not isinstance(compression, Compressor) and not (
            isinstance(compression, type) and issubclass(compression, Compressor)):
        raise bad(f"{what}: compression must be one of hvdlite's Compression "
                  f"(Compression.none, .fp16, .bf16, .topk(...), .powersgd(...), "
                  f".quantize(...)), "
                  f"not {compression!r}")
    return compression


def check_process_set(process_set, what):
    """The process set to sync over (None: every rank); this rank must be in it."""
    from .process_sets import global_process_set
    if process_set is None:
        process_set = global_process_set
    if not process_set.included():
        raise bad(f"{what}: this rank is not in {process_set!r}; build it only on the ranks "
                  "of the process set")
    return process_set


def check_name(name, what):
    if not isinstance(name, str) or not name:
        raise bad(f"{what}: name must be a non-empty string (it prefixes the reductions' "
                  "names, which must be the same on every rank)")
    return name


def check_fragments(fragments, sync_every, what):
    if not _is_int(fragments) or fragments < 1:
        raise bad(f"{what}: fragments must be an int >= 1, not {fragments!r}")
    if fragments > sync_every:
        raise bad(f"{what}: fragments={fragments} > sync_every={sync_every}: the "
                  "fragments' staggered sync steps would collide; use fragments <= "
                  "sync_every")
    return int(fragments)


def check_fragments_fit(fragments, n_elements, what):
    if fragments > n_elements:
        raise bad(f"{what}: fragments={fragments} but the model has only {n_elements} "
                  f"trainable elements; use fragments <= {n_elements}")


def check_overlap(overlap_steps, fragments, sync_every, what):
    if overlap_steps is None:
        overlap_steps = 1 if fragments > 1 else 0
    if not _is_int(overlap_steps) or not 0 <= overlap_steps < sync_every:
        raise bad(f"{what}: overlap_steps must be an int in [0, sync_every) = "
                  f"[0, {sync_every}) (a fragment's sync must finish before its next "
                  f"one starts), not {overlap_steps!r}")
    return int(overlap_steps)


def split_fragments(sizes, n):
    """Tensors of ``sizes`` elements, in model order, cut into ``n``
    contiguous runs of equal element counts (to one element), so that each
    sync moves 1/n of the model: per run, its pieces ``(tensor index, first
    element, end element)`` in the tensors' flattened (row-major) order. A
    tensor may be cut across two or more runs."""
    total = sum(sizes)
    ends = [total * (f + 1) // n for f in range(n)]
    out = [[] for _ in range(n)]
    f, start = 0, 0
    for i, size in enumerate(sizes):
        at, stop = start, start + size
        while at < stop:
            while ends[f] <= at:
                f += 1
            cut = min(stop, ends[f])
            out[f].append((i, at - start, cut - start))
            at = cut
        start = stop
    return out


def fragment_offsets(fragments, sync_every):
    """Fragment f syncs after the steps t > f*H//F with (t - f*H//F) % H == 0."""
    return [f * sync_every // fragments for f in range(fragments)]


def fragments_due(offsets, sync_every, step):
    """The fragments whose sync starts after inner step ``step``."""
    return [f for f, off in enumerate(offsets)
            if step > off and (step - off) % sync_every == 0]


class FragmentSyncs:
    """The sync schedule DiLoCo's front doors share. The front door keeps
    ``offsets``, ``sync_every``, ``overlap_steps``, ``fragments`` and
    ``local_step``, calls ``_init_syncs()`` when built, and gives
    ``_ensure_anchor()``, ``_start(f)`` (take fragment f's outer gradient
    and start its reduction), ``_finish(f)`` (wait for it, the outer step,
    weights := anchor) and ``_await_reduction(entry)``."""

    def _init_syncs(self):
        """No sync in flight; called by the front door's constructor."""
        self._pending = {}          # fragment -> (finish after this step, ...)
        self._pending_starts = {}   # fragment -> the engine start its reduction was issued in
        self._fresh = set()         # fragments whose sync finished since the last inner step

    def fragments_due(self, step):
        """The fragments whose sync starts after inner step ``step``."""
        return fragments_due(self.offsets, self.sync_every, step)

    def _syncs_after_step(self):
        """After inner step ``local_step``: the syncs whose overlap is over
        finish, the syncs due start (and finish at once without overlap)."""
        self._fresh = set()     # an inner step moved every fragment off its anchor
        for f in sorted(f for f, pend in self._pending.items() if pend[0] <= self.local_step):
            self._finish_fresh(f)
        for f in self.fragments_due(self.local_step):
            self._start(f)
            if self.overlap_steps == 0:
                self._finish_fresh(f)

    def _finish_fresh(self, f):
        self._finish(f)
        self._fresh.add(f)

    def synchronize(self):
        """Finishes the syncs in flight, then an outer step for every fragment
        that an inner step moved since its last sync: afterwards every rank's
        weights are the same new anchor. Every rank calls it, at the end of
        training. (A fragment synced after the last inner step has nothing to
        send; an outer step on its zero gradient would still move the anchor
        by the outer momentum.)"""
        self._ensure_anchor()
        self.wait()
        moved = [f for f in range(self.fragments) if f not in self._fresh]
        for f in moved:
            self._start(f)
        for f in moved:
            self._finish_fresh(f)

    def wait(self):
        """Finishes the syncs in flight (their outer steps are applied)."""
        for f in sorted(self._pending):
            self._finish_fresh(f)

    def _keep_pending(self, f, entry):
        """Fragment f's sync in flight: ``entry`` is (finish after this step,
        ...), with the engine start its reduction was issued in."""
        from . import basics
        self._pending[f] = entry
        self._pending_starts[f] = basics.engine_starts()

    def _drop_pending(self):
        """Forgets the syncs in flight (a state loaded or broadcast). Those
        issued on the running engine are waited for first, errors ignored:
        until they end the engine holds their names, which each fragment's
        next sync reuses. Those of an engine since stopped are only dropped
        (its handle ids mean nothing to the new one)."""
        from . import basics
        for f, entry in self._pending.items():
            if self._pending_starts.get(f) == basics.engine_starts():
                try:
                    self._await_reduction(entry)
                except Exception:  # noqa: BLE001 - the sync is dropped either way
                    pass
        self._pending.clear()
        self._pending_starts.clear()
        self._fresh = set()


# DiLoCo's default outer SGD, one place for torch and Keras. The DiLoCo paper's
# momentum 0.9 is for thousands of inner steps per outer step; over hvdlite's
# measured runs (H of 10 to 100) 0.5 lost less to synchronous training. An lr
# of 1.0 did better than the paper's 0.7 on every model measured with its inner
# lr tuned (the digits in torch and Keras, 1.9 M and 7.3 M LMs); 0.7 won only
# where the inner lr was too high. docs/compression.md.
OUTER_LR, OUTER_MOMENTUM = 1.0, 0.5


class OuterSGD:
    """torch.optim.SGD's update (dampening 0; Nesterov optional) on NumPy
    arrays, in their dtype: DiLoCo's outer optimizer where the anchor lives
    in host memory. ``momentum_buffers[i]`` is None until tensor i's first
    step, as in torch."""

    def __init__(self, n, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True, what="DiLoCo"):
        for label, value in (("outer_lr", lr), ("outer_momentum", momentum)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not np.isfinite(value) or value < 0:
                raise bad(f"{what}: {label} must be a finite number >= 0, not {value!r}")
        if nesterov and momentum <= 0:
            raise bad(f"{what}: Nesterov momentum needs outer_momentum > 0; pass "
                      "outer_nesterov=False for plain SGD")
        self.lr, self.momentum, self.nesterov = float(lr), float(momentum), bool(nesterov)
        self.momentum_buffers = [None] * n

    def step(self, params, grads, pieces):
        """``params[i][first:end] -= lr * update(grad)`` in place, in the
        flattened tensor, for each piece ``(i, first, end)`` and its grad.
        The momentum buffer of a tensor is one array; a piece updates its
        slice (the update is elementwise, so a tensor cut across fragments
        steps as if whole; zeros stand for torch's not-yet-stepped buffer)."""
        for (i, first, end), g in zip(pieces, grads):
            p = params[i].reshape(-1)[first:end]
            g = g.reshape(-1)
            if self.momentum:
                m = p.dtype.type(self.momentum)
                if self.momentum_buffers[i] is None:
                    self.momentum_buffers[i] = np.zeros_like(params[i])
                buf = self.momentum_buffers[i].reshape(-1)[first:end]
                buf *= m
                buf += g
                g = g + m * buf if self.nesterov else buf
            p -= p.dtype.type(self.lr) * g
