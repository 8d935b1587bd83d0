"""Communicate less often: local SGD and DiLoCo.

Both wrap an ordinary torch optimizer that steps on each rank's own batches
with no reduction at all; every ``sync_every`` steps the ranks meet through
the engine (one fused, averaged grouped allreduce):

- :class:`LocalSGD` averages the parameters themselves (Stich, 2019).
- :class:`DiLoCo` averages how far each rank moved from a shared anchor (the
  "outer gradient") and applies it to the anchor with an outer optimizer,
  SGD with Nesterov momentum by default (Douillard et al., 2023). With
  ``fragments=F`` (Streaming DiLoCo, Douillard et al., 2025) the parameters
  are split into F fragments that sync on staggered steps, each reduction
  overlapping ``overlap_steps`` inner steps, so a sync sends ~1/F of the
  model and hides behind compute.

See docs/compression.md ("Communicate less often").
"""
import torch

from hvdlite.compression import Compression
from hvdlite.local_sgd import bad as _bad
from hvdlite.local_sgd import check_compression as _check_compression
from hvdlite.local_sgd import check_process_set as _check_process_set
from hvdlite.local_sgd import check_sync_every as _check_sync_every
from hvdlite.local_sgd import OUTER_LR, OUTER_MOMENTUM
from hvdlite.local_sgd import FragmentSyncs, check_fragments_fit, split_fragments
from hvdlite.process_sets import global_process_set

from . import mpi_ops
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import Average


def _check_optimizer(optimizer, what):
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise _bad(f"{what} wraps a torch.optim.Optimizer, not "
                   f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    # A DistributedOptimizer would average gradients at every step, which is
    # what these wrappers exist to avoid.
    from .optimizer import _DistributedOptimizer
    if isinstance(optimizer, _DistributedOptimizer):
        raise _bad(f"{what}: pass the plain torch optimizer, not a DistributedOptimizer "
                   "(it would reduce gradients at every step); the wrapper does the syncing")


def _float_buffers(model):
    # Integer buffers (BatchNorm's num_batches_tracked) count the same steps on
    # every rank; averaging applies to floating-point statistics.
    return [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]


class _Periodic:
    """What LocalSGD and DiLoCo share: the wrapped optimizer's surface."""

    def __init__(self, optimizer, sync_every, process_set, compression, name, what):
        _check_optimizer(optimizer, what)
        self.optimizer = optimizer
        self.sync_every = _check_sync_every(sync_every, what)
        self.process_set = _check_process_set(process_set, what)
        self.compression = _check_compression(compression, what)
        if not isinstance(name, str) or not name:
            raise _bad(f"{what}: name must be a non-empty string (it prefixes the reductions' "
                       "names, which must be the same on every rank)")
        self.name = name
        self.local_step = 0       # optimizer steps taken so far

    # The wrapped optimizer's attributes, so training loops read them as usual.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none=True):
        return self.optimizer.zero_grad(set_to_none=set_to_none)

    def _reduce_async(self, tensors, suffix):
        """Averages ``tensors`` in place across the process set; one grouped
        request, which the engine fuses."""
        return mpi_ops.grouped_allreduce_async_(tensors, name=f"{self.name}.{suffix}", op=Average,
                                                process_set=self.process_set,
                                                compression=self.compression)


class LocalSGD(_Periodic):
    """Local SGD: ``optimizer`` steps on each rank alone, and every
    ``sync_every`` steps the parameters are averaged across the ranks of
    ``process_set``.

        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        opt = hvd.LocalSGD(opt, sync_every=8, model=model, sync_buffers=True)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for x, y in loader:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.synchronize()         # equal parameters everywhere at the end

    Arguments:
        optimizer: a plain ``torch.optim.Optimizer`` (its state, e.g. momentum,
            stays local). LR schedulers attach to it, not to this wrapper.
        sync_every: H, the number of ``step()`` calls between two averages.
        model: the module, for stable reduction names and for ``sync_buffers``
            (optional without sync_buffers).
        sync_buffers: also average the model's floating-point buffers
            (BatchNorm running statistics) at each sync.
        compression: hvdlite Compression for the parameter average
            (``Compression.fp16`` halves the bytes; the average is then rounded).
        process_set: average only over these ranks (every rank of it wraps).
        name: prefix of the reductions' names (unique per wrapper).
    """

    def __init__(self, optimizer, sync_every, model=None, sync_buffers=False,
                 compression=Compression.none, process_set=global_process_set, name="local_sgd"):
        super().__init__(optimizer, sync_every, process_set, compression, name, "LocalSGD")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise _bad(f"LocalSGD: model must be a torch.nn.Module, not {type(model).__name__}")
        if sync_buffers and model is None:
            raise _bad("LocalSGD: sync_buffers=True needs model= (the module whose buffers to "
                       "average)")
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        if not self.params:
            raise _bad("LocalSGD: the optimizer has no parameters")
        self.buffers = [b for _, b in _float_buffers(model)] if sync_buffers else []

    def step(self, closure=None):
        """One local step; every ``sync_every``-th also averages the parameters."""
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.local_step += 1
        if self.local_step % self.sync_every == 0:
            self.synchronize()
        return loss

    def synchronize(self):
        """Averages the parameters (and buffers if asked) now; every rank calls it."""
        tensors = [p.detach() for p in self.params] + [b for b in self.buffers]
        mpi_ops.synchronize(self._reduce_async(tensors, "params"))

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "local_step": self.local_step}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.local_step = int(state_dict["local_step"])

    def broadcast_state(self, root_rank=0):
        """Makes the optimizer state and step count ``root_rank``'s."""
        broadcast_optimizer_state(self.optimizer, root_rank, process_set=self.process_set)
        self.local_step = broadcast_object(self.local_step, root_rank, name=f"{self.name}.step",
                                           process_set=self.process_set)


def default_outer_optimizer(params):
    """DiLoCo's default outer optimizer: SGD, lr 1.0, Nesterov momentum 0.5
    (hvdlite.local_sgd.OUTER_LR / OUTER_MOMENTUM, shared with Keras)."""
    return torch.optim.SGD(params, lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)


def _piece(tensor, first, end):
    """Elements [first, end) of ``tensor`` flattened, as a view; the tensor itself when that
    is all of it."""
    return tensor if first == 0 and end == tensor.numel() else tensor.view(-1)[first:end]


class DiLoCo(_Periodic, FragmentSyncs):
    """DiLoCo: ``inner_optimizer`` steps on each rank alone; every
    ``sync_every`` (H) steps, each rank's outer gradient ``anchor - params``
    is averaged through the engine, the outer optimizer steps on the anchor
    with it, and every rank's parameters become the new anchor.

        inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        diloco = hvd.DiLoCo(model, inner, sync_every=50, fragments=4)
        for x, y in loader:
            diloco.zero_grad(); loss_fn(model(x), y).backward(); diloco.step()
        diloco.synchronize()      # equal parameters everywhere at the end

    With ``fragments=F`` > 1 the trainable parameters' elements are split, in
    model order, into F runs of equal size (a tensor may be cut between two);
    fragment f syncs after the steps t > f*H//F where ``(t - f*H//F) % H ==
    0``, so a sync moves 1/F of the model. Its
    reduction starts after step t and is finished ``overlap_steps`` steps
    later (the outer step is applied then, and that fragment's parameters
    are set to its new anchor, dropping the local progress made meanwhile).

    Arguments:
        model: the ``torch.nn.Module`` being trained (its trainable
            parameters are synced; broadcast them before the first step: the
            anchor is taken then).
        inner_optimizer: a plain ``torch.optim.Optimizer`` over the model's
            parameters; its state stays local.
        outer_optimizer: ``None`` for SGD(lr=1.0, momentum=0.5,
            nesterov=True), or a callable that builds a torch optimizer from
            a list of tensors (the fragment's pieces of the anchor: whole
            tensors, or flat views of a cut one), e.g.
            ``lambda params: torch.optim.SGD(params, lr=0.7)``; called once
            per fragment.
        sync_every: H, inner steps between two syncs of a fragment.
        fragments: F, the number of fragments (1: plain DiLoCo).
        overlap_steps: inner steps a fragment's reduction overlaps; default
            1 with fragments > 1, else 0. Must be < H.
        compression: hvdlite Compression of the outer gradients
            (``Compression.fp16``/``.bf16`` halve the bytes;
            ``Compression.quantize()`` sends 4 bits, as Streaming DiLoCo).
        sync_buffers: average the model's floating-point buffers at each
            sync of fragment 0.
        process_set: sync only over these ranks.
        name: prefix of the reductions' names (unique per wrapper).
    """

    def __init__(self, model, inner_optimizer, outer_optimizer=None, sync_every=100, fragments=1,
                 overlap_steps=None, compression=Compression.none, sync_buffers=False,
                 process_set=global_process_set, name="diloco"):
        super().__init__(inner_optimizer, sync_every, process_set, compression, name, "DiLoCo")
        if not isinstance(model, torch.nn.Module):
            raise _bad(f"DiLoCo: model must be a torch.nn.Module, not {type(model).__name__}")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise _bad("DiLoCo: the model has no trainable parameters")
        optimized = {id(p) for g in inner_optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in named if id(p) not in optimized]
        if missing:
            raise _bad("DiLoCo: the inner optimizer does not optimize the model parameter(s) "
                       f"{', '.join(missing[:5])}; build it over model.parameters() (or freeze "
                       "them with requires_grad_(False) first)")
        if isinstance(fragments, bool) or not isinstance(fragments, int) or fragments < 1:
            raise _bad(f"DiLoCo: fragments must be an int >= 1, not {fragments!r}")
        check_fragments_fit(fragments, sum(p.numel() for _, p in named), "DiLoCo")
        if fragments > self.sync_every:
            raise _bad(f"DiLoCo: fragments={fragments} > sync_every={self.sync_every}: the "
                       "fragments' staggered sync steps would collide; use fragments <= "
                       "sync_every")
        if overlap_steps is None:
            overlap_steps = 1 if fragments > 1 else 0
        if isinstance(overlap_steps, bool) or not isinstance(overlap_steps, int) or \
                not 0 <= overlap_steps < self.sync_every:
            raise _bad(f"DiLoCo: overlap_steps must be an int in [0, sync_every) = "
                       f"[0, {self.sync_every}) (a fragment's sync must finish before its next "
                       f"one starts), not {overlap_steps!r}")
        if outer_optimizer is None:
            outer_optimizer = default_outer_optimizer
        if isinstance(outer_optimizer, torch.optim.Optimizer) or not callable(outer_optimizer):
            raise _bad("DiLoCo: outer_optimizer must be None or a callable that builds the "
                       "optimizer from the anchor tensors, e.g. "
                       "`lambda params: torch.optim.SGD(params, lr=1.0, momentum=0.5, "
                       "nesterov=True)` (the anchor is DiLoCo's own copy, so an optimizer "
                       "built beforehand cannot hold it)")
        self.model = model
        self.fragments = fragments
        self.overlap_steps = overlap_steps
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        # Pieces (parameter, first, end element): each fragment 1/F of the elements.
        self.fragment_pieces = split_fragments([p.numel() for p in self.params], fragments)
        cut = [self.names[i] for pieces in self.fragment_pieces for i, a, b in pieces
               if (a, b) != (0, self.params[i].numel()) and not self.params[i].is_contiguous()]
        if cut:
            raise _bad(f"DiLoCo: fragments={fragments} cuts the non-contiguous parameter(s) "
                       f"{', '.join(sorted(set(cut))[:5])}; make them contiguous "
                       "(`p.data = p.data.contiguous()`) before building DiLoCo")
        self.offsets = [f * self.sync_every // fragments for f in range(fragments)]
        self.buffers = [b for _, b in _float_buffers(model)] if sync_buffers else []
        self._make_outer = outer_optimizer
        self.anchor = None           # taken at the first step (after the user's broadcast)
        self.outer_optimizers = None
        self._outer_state = None     # loaded before the anchor exists
        self._init_syncs()           # _pending: fragment -> (finish after step, handle, deltas, buffers)

    # ---------------------------------------------------------------- anchor
    def _ensure_anchor(self):
        if self.anchor is not None:
            return
        self.anchor = [p.detach().clone() for p in self.params]
        # The outer optimizers step on views of the anchor, one per piece.
        self.anchor_pieces = [[_piece(self.anchor[i], a, b) for i, a, b in pieces]
                              for pieces in self.fragment_pieces]
        self.outer_optimizers = []
        for views in self.anchor_pieces:
            opt = self._make_outer(views)
            if not isinstance(opt, torch.optim.Optimizer):
                raise _bad("DiLoCo: outer_optimizer(params) must return a torch.optim.Optimizer, "
                           f"not {type(opt).__name__}")
            self.outer_optimizers.append(opt)
        if self._outer_state is not None:
            for opt, sd in zip(self.outer_optimizers, self._outer_state):
                opt.load_state_dict(sd)
            self._outer_state = None

    # ---------------------------------------------------------------- stepping
    def step(self, closure=None):
        """One inner step, then the syncs due after it."""
        self._ensure_anchor()
        loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        self.local_step += 1
        self._syncs_after_step()
        return loss

    def _start(self, f):
        with torch.no_grad():
            # The outer gradient is taken now; the reduction runs while the
            # inner optimizer goes on.
            deltas = [a - _piece(self.params[i].detach(), first, end)
                      for a, (i, first, end) in zip(self.anchor_pieces[f], self.fragment_pieces[f])]
            buffers = [b.detach().clone() for b in self.buffers] if f == 0 else []
        handle = self._reduce_async(deltas + buffers, f"fragment{f}")
        self._keep_pending(f, (self.local_step + self.overlap_steps, handle, deltas, buffers))

    def _finish(self, f):
        _, handle, deltas, buffers = self._pending.pop(f)
        mpi_ops.synchronize(handle)
        views = self.anchor_pieces[f]
        for a, d in zip(views, deltas):
            a.grad = d
        self.outer_optimizers[f].step()
        with torch.no_grad():
            for a, (i, first, end) in zip(views, self.fragment_pieces[f]):
                a.grad = None
                _piece(self.params[i].detach(), first, end).copy_(a)
            for b, avg in zip(self.buffers, buffers):
                b.copy_(avg)

    def _await_reduction(self, entry):
        mpi_ops.synchronize(entry[1])

    def wait_reductions(self):
        """Waits until the reductions of the syncs in flight have completed,
        without applying their outer steps (those stay on schedule, after
        their ``overlap_steps``): e.g. before timing an evaluation, so that the
        network time and bytes of a sync in flight are not the evaluation's."""
        for pending in self._pending.values():
            mpi_ops.synchronize(pending[1])   # the result is kept for _finish

    # ---------------------------------------------------------------- state
    def state_dict(self):
        """Anchor, outer and inner optimizer states and the step count: what
        a restart needs to resume from the last outer step. Syncs in flight
        are not part of it (their fragments' progress is carried to the next
        sync)."""
        self._ensure_anchor()
        return {"local_step": self.local_step,
                "anchor": [a.clone() for a in self.anchor],
                "outer": [opt.state_dict() for opt in self.outer_optimizers],
                "inner": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict):
        self._drop_pending()
        anchor = state_dict["anchor"]
        if len(anchor) != len(self.params) or any(
                a.shape != p.shape for a, p in zip(anchor, self.params)):
            raise _bad("DiLoCo.load_state_dict: the saved anchor does not match this model's "
                       "trainable parameters; load a state saved from the same model")
        self._ensure_anchor()
        with torch.no_grad():
            for a, saved in zip(self.anchor, anchor):
                a.copy_(saved)
        for opt, sd in zip(self.outer_optimizers, state_dict["outer"]):
            opt.load_state_dict(sd)
        self.optimizer.load_state_dict(state_dict["inner"])
        self.local_step = int(state_dict["local_step"])

    def broadcast_state(self, root_rank=0):
        """Makes the anchor, the outer and inner optimizer states and the step
        count ``root_rank``'s (syncs in flight are dropped first)."""
        self._drop_pending()
        self._ensure_anchor()
        broadcast_parameters([(f"{self.name}.anchor.{n}", a) for n, a in zip(self.names, self.anchor)],
                             root_rank, process_set=self.process_set)
        for opt in self.outer_optimizers:
            broadcast_optimizer_state(opt, root_rank, process_set=self.process_set)
        broadcast_optimizer_state(self.optimizer, root_rank, process_set=self.process_set)
        self.local_step = broadcast_object(self.local_step, root_rank, name=f"{self.name}.step",
                                           process_set=self.process_set)


__all__ = ["LocalSGD", "DiLoCo", "default_outer_optimizer"]
