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
import copy

import torch

from hvdlite import basics
from hvdlite.elastic import HostsUpdatedInterrupt, ObjectState as _ObjectState, run

from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .local_sgd import DiLoCo, LocalSGD


def _broadcast_object(obj):
    return broadcast_object(obj, root_rank=0, name="elastic.state")


class StateHandler:
    """Keeps one framework object of a TorchState: save, restore, sync."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        raise NotImplementedError


class ModelStateHandler(StateHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
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

    def save(self):
        self._saved = self.value.state_dict()

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
    module or an optimizer) are saved through ``state_dict`` (a deep copy) and
    synced with ``broadcast_parameters`` / ``broadcast_optimizer_state``;
    everything else is a Python attribute. Assigning a new model or
    optimizer to the attribute (``state.model = other``) tracks the new one
    and saves it."""

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
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=_broadcast_object, get_rank=basics.rank, **attributes)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        for handler in self._handlers.values():
            handler.save()
        super().sync()

    def _commit_payload(self):
        payload = super()._commit_payload()
        payload["handlers"] = {name: h._saved for name, h in self._handlers.items()}
        return payload

    def _load_commit_payload(self, payload):
        super()._load_commit_payload(payload)
        for name, saved in payload["handlers"].items():
            if name in self._handlers:
                self._handlers[name]._saved = saved

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["TorchState", "ObjectState", "HostsUpdatedInterrupt", "ElasticSampler", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler", "PeriodicSyncStateHandler", "handler_registry",
           "run"]
