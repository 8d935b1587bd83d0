"""The validated arguments of a DistributedOptimizer, shared by the Keras
and the tf.compat.v1 optimizer wrappers."""
import warnings

from .. import exceptions, request
from ..compression import Compression, resolve_momentum_correction, wants_optimizer_momentum
from ..ops import Average
from ..process_sets import global_process_set
from .reduction import ReduceSettings


class DistributedOptions:
    """The validated arguments of one DistributedOptimizer call."""

    def __init__(self, op=Average, compression=Compression.none, gradient_predivide_factor=1.0,
                 sparse_as_dense=False, process_set=global_process_set,
                 backward_passes_per_step=1, average_aggregated_gradients=False,
                 scale_local_gradients=True, what="DistributedOptimizer"):
        self.backward_passes_per_step = request.backward_passes(backward_passes_per_step, what)
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self.scale_local_gradients = bool(scale_local_gradients)
        self._reduce_args = dict(op=op, compression=compression,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 sparse_as_dense=sparse_as_dense, process_set=process_set,
                                 what=what)
        self.settings = self.reduce_settings()  # validates once, now

    def reduce_settings(self, postscale=1.0):
        return ReduceSettings(postscale=postscale, **self._reduce_args)


def take_optimizer_momentum(optimizer, compression, what):
    """For ``Compression.topk(momentum_correction=True)``: the compression with
    the Keras optimizer's momentum, which the engine then applies, and the
    optimizer's own set to 0. Other compressions come back as they are."""
    if not wants_optimizer_momentum(compression):
        return compression
    compression, own_off = resolve_momentum_correction(
        compression, [getattr(optimizer, "momentum", None)], bool(getattr(optimizer, "nesterov", False)), what)
    if own_off:
        optimizer.momentum = 0.0
    return compression


def check_groups(num_groups, groups, what):
    """Horovod's rules for ``num_groups`` (deprecated) and ``groups``; the
    engine fuses tensors itself, so a valid value changes nothing."""
    if num_groups:
        warnings.warn(f"{what}: num_groups is deprecated (as in Horovod); use groups=",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not isinstance(groups, list) and (
            isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0):
        raise exceptions.InvalidArgumentError(
            f"{what}: groups must be a positive int or a list of lists of variables, "
            f"not {groups!r}")
