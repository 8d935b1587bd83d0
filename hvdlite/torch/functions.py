"""Helpers that move model parameters, optimizer state and Python objects
between ranks (Horovod's ``broadcast_parameters`` & co.; the object
collectives are the common :mod:`hvdlite.objects`)."""
import collections

import torch

import hvdlite
from hvdlite import exceptions
from hvdlite.objects import allgather_object, broadcast_object
from hvdlite.process_sets import global_process_set

from .mpi_ops import _set_root, broadcast_async_, synchronize
from .optimizer import _DistributedOptimizer

def _named(name, suffix):
    return f"{name}.{suffix}" if name else None


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a ``model.state_dict()`` (broadcast in key order), or an
    iterable of ``(name, tensor)`` pairs such as ``model.named_parameters()``,
    or of plain tensors. Call it after building the model and before training
    so all ranks start from the same weights. All broadcasts are started
    together and waited for at the end.
    """
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, collections.abc.Iterable) and not isinstance(params, torch.Tensor):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise exceptions.InvalidArgumentError(
            "broadcast_parameters() takes a state_dict, or a list of (name, tensor) pairs or "
            f"tensors, not {type(params).__name__}")
    _set_root(root_rank, process_set, "broadcast_parameters")  # validate once, clearly
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise exceptions.InvalidArgumentError(
                f"broadcast_parameters: entry {name!r} is a {type(p).__name__}, not a tensor; "
                "broadcast non-tensor values with broadcast_object()")
        handles.append(broadcast_async_(p.detach(), root_rank,
                                        name=_named("broadcast_parameters", name) if name else None,
                                        process_set=process_set))
    _wait_all(handles)


def _wait_all(handles):
    first = None
    for h in handles:
        try:
            synchronize(h)
        except exceptions.HvdliteError as e:
            first = first or e
    if first is not None:
        raise first


class _TensorSlot(collections.namedtuple("_TensorSlot", "index shape dtype")):
    """Stands for a tensor of the root's optimizer state while the state's
    structure travels as a pickled object."""


def _strip_tensors(obj, tensors):
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), str(obj.dtype).replace("torch.", ""))
    if isinstance(obj, dict):
        return {k: _strip_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_strip_tensors(v, tensors) for v in obj)
    return obj


def _fill_tensors(obj, tensors):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_fill_tensors(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state and hyperparameters equal to
    ``root_rank``'s: tensors (momentum buffers, Adam moments, ``step``) go
    through engine broadcasts, everything else (``lr``, ``betas``, scalar
    state, custom entries) in one pickled object.

    It also works when the state does not exist yet on some ranks (a new
    optimizer, or the root restored a checkpoint and the others did not):
    the root's structure is sent first and the other ranks build matching
    state. Unlike Horovod, no dummy ``step()`` is taken, so parameters and
    step counters are not disturbed. ``optimizer`` may be a plain
    ``torch.optim.Optimizer`` or a :func:`DistributedOptimizer`. ``model`` is
    accepted for Horovod compatibility and not needed.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise exceptions.InvalidArgumentError(
            "broadcast_optimizer_state() takes a torch.optim.Optimizer, not "
            f"{type(optimizer).__name__}")
    _set_root(root_rank, process_set, "broadcast_optimizer_state")
    is_root = hvdlite.rank() == int(root_rank)
    had_state = bool(optimizer.state)
    tensors = []
    skeleton = _strip_tensors(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state.skeleton",
                                process_set=process_set)
    if not is_root:
        slots = []
        _collect_slots(skeleton, slots)
        tensors = [None] * len(slots)
        for slot in slots:
            tensors[slot.index] = torch.empty(slot.shape, dtype=getattr(torch, slot.dtype))
    handles = [broadcast_async_(t, root_rank, name=f"broadcast_optimizer_state.{i}",
                                process_set=process_set)
               for i, t in enumerate(tensors)]
    _wait_all(handles)
    if not is_root:
        _install_state(optimizer, _fill_tensors(skeleton, tensors), root_rank)
    _zero_missing_grads(optimizer, had_state)


def _zero_missing_grads(optimizer, had_state):
    """Horovod initialises a new optimizer's state with a step on zero
    gradients, which leaves every trainable parameter with a (zero) .grad;
    scripts rely on that. hvdlite sends the state without that step (so
    parameters and step counts stay untouched) but leaves the same gradients."""
    if had_state:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def _install_state(optimizer, state_dict, root_rank):
    """Puts the root's state into this rank's optimizer, matching parameters
    by their position in the parameter groups (as load_state_dict does, but
    without its casting, which mangles non-tensor values such as strings)."""
    saved_groups = state_dict["param_groups"]
    groups = optimizer.param_groups
    if len(saved_groups) != len(groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, groups)):
        raise exceptions.InvalidArgumentError(
            f"broadcast_optimizer_state: rank {root_rank}'s optimizer has parameter groups of "
            f"sizes {[len(s['params']) for s in saved_groups]}, this rank's "
            f"{[len(g['params']) for g in groups]}; build the same model and optimizer on "
            "every rank")
    by_index = {i: p for s, g in zip(saved_groups, groups) for i, p in zip(s["params"], g["params"])}
    new_state = {}
    for index, values in state_dict["state"].items():
        p = by_index[index]
        new_state[p] = {k: (v.to(p.device) if isinstance(v, torch.Tensor) else v)
                        for k, v in values.items()} if isinstance(values, dict) else values
    if isinstance(optimizer, _DistributedOptimizer):
        optimizer._hvd_reset()
    optimizer.state.clear()
    optimizer.state.update(new_state)
    for saved, group in zip(saved_groups, groups):
        for key, value in saved.items():
            if key != "params":
                group[key] = value


def _collect_slots(obj, out):
    if isinstance(obj, _TensorSlot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)
