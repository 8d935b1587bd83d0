"""Elastic state for torch (Horovod's ``hvd.elastic``).

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.sync()                          # rank 0's parameters, optimizer state, epoch, batch
    ...
    state.commit()                        # a copy in host memory
    state.restore()                       # back to the last commit

Models (``torch.nn.Module``) and optimizers (``torch.optim.Optimizer``, also
DistributedOptimizer) given as keyword arguments are kept through their
``state_dict``; other values are Python attributes. See
:mod:`hvdlite.elastic` for what is not there yet (ranks joining or leaving a
running job).
"""
import copy

import torch

from hvdlite import basics
from hvdlite.elastic import HostsUpdatedInterrupt, ObjectState as _ObjectState, run

from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


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


# (type, handler class): the first match handles a TorchState keyword argument.
# A sampler handler joins here with elastic data loading.
handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
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

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["TorchState", "ObjectState", "HostsUpdatedInterrupt", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "handler_registry", "run"]
