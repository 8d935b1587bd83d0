"""Elastic state for torch (Horovod's ``hvd.elastic``).

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.sync()                          # rank 0's parameters, optimizer state, epoch, batch
    ...
    state.commit()                        # a copy in host memory
    state.restore()                       # back to the last commit

Models (``torch.nn.Module``), optimizers (``torch.optim.Optimizer``, also
DistributedOptimizer) and LocalSGD/DiLoCo wrappers (DiLoCo's anchor and
outer optimizer) given as keyword arguments are kept through their
``state_dict``; other values are Python attributes. Under elastic hvdrun a
commit also goes to the host's memory, where the job finds it when it
starts again on other hosts (:mod:`hvdlite.elastic`, docs/elastic.md).
"""
import collections
import copy
import threading

import torch

from hvdlite import basics
from hvdlite.elastic import HostsUpdatedInterrupt, ObjectState as _ObjectState, run

from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .local_sgd import DiLoCo, LocalSGD


def _broadcast_object(obj):
    return broadcast_object(obj, root_rank=0, name="elastic.state")


# ---- copies of state dicts into buffers allocated once ---------------------------------

_SCALARS = frozenset((int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device))
_copy_all = getattr(torch, "_foreach_copy_", None)


class _Leaf:
    """Where the i-th tensor of a state dict was."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _rebuild(obj, leaf, on_leaf):
    """``obj`` with each part for which ``leaf(part)`` holds replaced by
    ``on_leaf(part)``; containers are new, Python scalars kept, other objects
    deep-copied."""
    kind = type(obj)
    if kind in _SCALARS:
        return obj
    if leaf(obj):
        return on_leaf(obj)
    if kind is dict:
        return {k: _rebuild(v, leaf, on_leaf) for k, v in obj.items()}
    if kind is list:
        return [_rebuild(v, leaf, on_leaf) for v in obj]
    if kind is tuple:
        return tuple(_rebuild(v, leaf, on_leaf) for v in obj)
    if kind is collections.OrderedDict:
        out = collections.OrderedDict((k, _rebuild(v, leaf, on_leaf)) for k, v in obj.items())
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:
            out._metadata = metadata        # a module's state_dict(): a new one at each call
        return out
    return copy.deepcopy(obj)


def _strip(obj, leaves):
    """``obj`` with every tensor replaced by a _Leaf (the tensors go to
    ``leaves``, in order)."""
    def to_leaf(tensor):
        leaves.append(tensor)
        return _Leaf(len(leaves) - 1)
    return _rebuild(obj, lambda o: isinstance(o, torch.Tensor), to_leaf)


def _fill(skeleton, tensors):
    """The state dict ``skeleton`` stands for, with ``tensors`` in its _Leaf places."""
    return _rebuild(skeleton, lambda o: type(o) is _Leaf, lambda o: tensors[o.index])


def _leaf_paths(skeleton, path=(), out=None):
    """The places of the tensors of ``skeleton``, in _Leaf order."""
    out = [] if out is None else out
    kind = type(skeleton)
    if kind is _Leaf:
        out.append(path)
    elif kind in (dict, collections.OrderedDict):
        for k, v in skeleton.items():
            _leaf_paths(v, path + (k,), out)
    elif kind in (list, tuple):
        for i, v in enumerate(skeleton):
            _leaf_paths(v, path + (i,), out)
    return out


def _signature(tensors):
    return [(t.shape, t.dtype, t.device) for t in tensors]


def _copy_tensors(destinations, sources):
    if not destinations:
        return
    with torch.no_grad():
        if _copy_all is not None:
            _copy_all(destinations, sources)
        else:
            for d, s in zip(destinations, sources):
                d.copy_(s)


class _Saved:
    """One saved state dict: its skeleton and the buffers holding its tensors."""
    __slots__ = ("skeleton", "buffers", "signature")

    def __init__(self, skeleton, buffers, signature):
        self.skeleton, self.buffers, self.signature = skeleton, buffers, signature


class StateHandler:
    """Keeps one framework object of a TorchState: save, restore, sync.

    ``save(slot)`` copies the object's ``state_dict()`` into buffers
    allocated at the first save (again when the tensors' shapes, dtypes,
    devices or number change, e.g. when an optimizer creates its state at its
    first step); the rest of the state dict (Python numbers, param_groups)
    is copied as it is. A TorchState keeps two slots under elastic hvdrun,
    so that the commit being written to host memory is not overwritten by
    the next save. ``restore(slot)`` loads the saved copy back, bitwise."""

    # True where state_dict() returns the object's own tensors (a module's
    # parameters and buffers, an optimizer's state): restore copies into them.
    restores_in_place = False

    def __init__(self, value):
        self.value = value
        self._slots = [None, None]
        self.save(0)

    def set_value(self, value, slot=0):
        self.value = value
        self._slots = [None, None]
        self.save(slot)

    def save(self, slot=0):
        leaves = []
        skeleton = _strip(self.value.state_dict(), leaves)
        signature = _signature(leaves)
        saved = self._slots[slot]
        if saved is None or saved.signature != signature:
            saved = _Saved(None, [torch.empty_like(t) for t in leaves], signature)
            self._slots[slot] = saved
        _copy_tensors(saved.buffers, leaves)
        saved.skeleton = skeleton

    def saved(self, slot=0):
        """The saved state dict of ``slot`` (its tensors are the buffers)."""
        saved = self._slots[slot]
        return None if saved is None else _fill(saved.skeleton, saved.buffers)

    def load_saved(self, state_dict, slot=0):
        """Makes ``state_dict`` (e.g. read from a commit file) the saved copy of ``slot``."""
        leaves = []
        skeleton = _strip(state_dict, leaves)
        self._slots[slot] = _Saved(skeleton, leaves, _signature(leaves))

    def restore(self, slot=0):
        saved = self._slots[slot]
        if self.restores_in_place:
            leaves = []
            live = _strip(self.value.state_dict(), leaves)
            if _signature(leaves) == saved.signature and \
                    _leaf_paths(live) == _leaf_paths(saved.skeleton):
                _copy_tensors(leaves, saved.buffers)
                self._load_rest(saved, leaves)
                return
        # load_state_dict may keep the tensors it is given (an optimizer's
        # state does): it gets copies, the buffers stay the commit's.
        self.value.load_state_dict(_fill(saved.skeleton, [b.clone() for b in saved.buffers]))

    def _load_rest(self, saved, live_tensors):
        """After the tensors were copied in place: what else the state dict holds."""
        self.value.load_state_dict(_fill(saved.skeleton, live_tensors))

    def sync(self):
        raise NotImplementedError


class ModelStateHandler(StateHandler):
    restores_in_place = True

    def _load_rest(self, saved, live_tensors):
        pass                        # a module's state dict is all tensors

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    # The tensors are copied into the optimizer's own; load_state_dict then
    # brings back param_groups (lr, ...) and any non-tensor state.
    restores_in_place = True

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset among the ranks and remembers which samples of the
    current epoch were processed, so that after a reset (a restore, or
    another number of ranks) the rest of the epoch is split among the ranks
    there are then: the processed samples are not repeated.

        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
        loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
        for batch_idx, (x, y) in enumerate(loader):
            ...
            sampler.record_batch(batch_idx, 32)   # this batch is done, on every rank

    Every rank shuffles the whole epoch the same way (``seed + epoch``), drops
    what was processed, and takes every ``size()``-th of the rest from its
    rank on. As torch's DistributedSampler, each rank gets the same number
    of samples: when the rest does not divide evenly, up to size() - 1
    samples are repeated at the end of the split, so that every rank runs
    the same number of steps. TorchState(sampler=...) saves, restores and
    syncs it (sync joins the processed samples of every rank)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """A new epoch: nothing of it is processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def get_indices(self, batch_idx, batch_size):
        """The dataset indices of this rank's batch ``batch_idx`` of the current split."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def record_batch(self, batch_idx, batch_size):
        """The next batch is done on every rank: records the next
        ``batch_size`` samples of every rank's split (the split is the same
        computation on each rank), so each rank's record is the whole job's
        and any one rank's commit can resume the epoch. Batches count in
        order from the last reset, as in Horovod (``batch_idx`` is not used):
        after a restore, the loader starts over on what is left."""
        start = self._recorded
        stop = min(start + batch_size, self.num_samples)
        self._recorded = stop
        n = self.num_replicas
        self.processed_indices.update(int(self._split_order[r + j * n])
                                      for j in range(start, stop) for r in range(n))

    @property
    def processed_num(self):
        """How many samples of the epoch are recorded as processed (Horovod's name)."""
        return len(self.processed_indices)

    def record_indices(self, indices):
        """This rank processed ``indices`` (its own only: ``sync()`` joins the
        records of all ranks)."""
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Splits what is left of the epoch among the ranks there are now."""
        self.num_replicas, self.rank = basics.size(), basics.rank()
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        else:
            order = list(range(len(self.dataset)))
        remaining = [i for i in order if i not in self.processed_indices]
        self.num_samples = -(-len(remaining) // self.num_replicas)  # ceil
        total = self.num_samples * self.num_replicas
        if remaining:
            remaining += (remaining * (total // len(remaining) + 1))[:total - len(remaining)]
        self._split_order = remaining
        self._recorded = 0          # samples of each rank's split recorded since the split
        self.indices = remaining[self.rank:total:self.num_replicas]

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self):
        return self.num_samples


class SamplerStateHandler(StateHandler):
    """An ElasticSampler in a TorchState: sync makes every rank's record the
    union of all ranks' processed samples (each rank only records its own)."""

    def save(self, slot=0):
        self._slots[slot] = self.value.state_dict()      # a copy (a new set)

    def saved(self, slot=0):
        return self._slots[slot]

    def load_saved(self, state_dict, slot=0):
        self._slots[slot] = state_dict

    def restore(self, slot=0):
        self.value.load_state_dict(self._slots[slot])

    def sync(self):
        processed = set().union(*allgather_object(self.value.processed_indices, name="elastic.sampler"))
        state = self.value.state_dict()
        state["processed_indices"] = processed
        self.value.load_state_dict(broadcast_object(state, root_rank=0, name="elastic.sampler.state"))


class PeriodicSyncStateHandler(StateHandler):
    """A LocalSGD or DiLoCo wrapper in a TorchState: its state_dict (DiLoCo:
    anchor, outer and inner optimizer states, step count) is saved and
    restored, and sync makes it rank 0's, so a restart resumes from the
    last outer step."""

    def sync(self):
        self.value.broadcast_state(root_rank=0)


# (type, handler class): the first match handles a TorchState keyword argument.
handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
    (LocalSGD, PeriodicSyncStateHandler),
    (DiLoCo, PeriodicSyncStateHandler),
]


def _handler_for(value):
    for kind, handler_cls in handler_registry:
        if isinstance(value, kind):
            return handler_cls(value)
    return None


class ObjectState(_ObjectState):
    """Python attributes kept in sync across ranks (``ObjectState(epoch=0)``)."""

    def __init__(self, bcast_object=_broadcast_object, get_rank=basics.rank, **kwargs):
        super().__init__(bcast_object, get_rank, **kwargs)


class TorchState(_ObjectState):
    """State of models, optimizers and Python attributes.

    ``model`` and ``optimizer`` (and any other keyword argument that is a
    module, an optimizer, a LocalSGD/DiLoCo wrapper or an ElasticSampler)
    are saved through ``state_dict``: its tensors are copied into buffers
    allocated at the first save (``torch._foreach_copy_``), the rest copied
    as it is; they are synced with ``broadcast_parameters`` /
    ``broadcast_optimizer_state``. Everything else is a Python attribute.
    Assigning a new model or optimizer to the attribute (``state.model =
    other``) tracks the new one and saves it.

    Under elastic hvdrun, where a background thread writes commits to host
    memory, the saved copy is double-buffered: a save never writes into the
    copy being written out (twice the state's size in host memory)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, attributes = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value) if value is not None else None
            if handler is None:
                attributes[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        self._lock = threading.Lock()
        self._current = 0           # the slot holding the last save
        self._pinned = None         # the slot a background write reads
        self._writing = None        # the slot a save writes into
        self._double = False        # two slots (once commits are written out)
        self._slot_seq = [0, 0]
        self._slot_attributes = [None, None]
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=_broadcast_object, get_rank=basics.rank, **attributes)
        self._slot_attributes[0] = self._saved_state

    def _mark(self, slot):
        self._slot_seq[slot] = self._commit_seq
        self._slot_attributes[slot] = self._saved_state

    def save(self):
        self._save(attributes=True)

    def _save(self, attributes):
        with self._lock:
            other = 1 - self._current
            target = other if self._double and self._pinned != other else self._current
            self._writing = target
        try:
            for handler in self._handlers.values():
                handler.save(target)
            if attributes:
                super().save()
            self._mark(target)
            with self._lock:
                self._current = target
        finally:
            with self._lock:
                self._writing = None

    def restore(self):
        for handler in self._handlers.values():
            handler.restore(self._current)
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        self._save(attributes=False)
        super().sync()
        self._mark(self._current)

    def _commit_payload(self, slot=None):
        slot = self._current if slot is None else slot
        return {"attributes": dict(self._slot_attributes[slot]),
                "handlers": {name: h.saved(slot) for name, h in self._handlers.items()}}

    def _load_commit_payload(self, payload):
        super()._load_commit_payload(payload)
        with self._lock:
            slot = self._current if self._pinned != self._current else 1 - self._current
            for name, saved in payload["handlers"].items():
                if name in self._handlers:
                    self._handlers[name].load_saved(saved, slot)
            self._mark(slot)
            self._current = slot

    def _persist_ticket(self):
        self._double = True
        return _SlotTicket(self)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            with self._lock:
                handlers[name].set_value(value, self._current)
        super().__setattr__(name, value)


class _SlotTicket:
    """What the background writer of commits (hvdlite.elastic.worker) asks
    for: the newest saved slot, pinned (no save writes into it) until released."""

    def __init__(self, state):
        self.state = state

    def acquire(self):
        state = self.state
        with state._lock:
            if state._writing == state._current:
                return None                     # being saved again: ask later
            slot = state._current
            state._pinned = slot
            return state._slot_seq[slot], state._commit_payload(slot)

    def release(self):
        with self.state._lock:
            self.state._pinned = None


__all__ = ["TorchState", "ObjectState", "HostsUpdatedInterrupt", "ElasticSampler", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler", "PeriodicSyncStateHandler", "handler_registry",
           "run"]
