"""DistributedOptimizer: averages gradients across ranks while backward runs.

Each parameter gets a post-accumulate-grad hook. When its gradient is final
for this step, the hook hands ``p.grad`` (in place, no copy) to the engine,
so the reduction of late layers runs while autograd is still computing the
early ones. ``step()`` then waits only for the reductions that have not
finished yet. Fusion, negotiation and compression all happen in the engine.
"""
import warnings
import weakref
from contextlib import contextmanager

import torch

from hvdlite import exceptions
from hvdlite import request
from hvdlite.compression import Compression, resolve_momentum_correction
from hvdlite.objects import broadcast_object
from hvdlite.process_sets import global_process_set, process_set_id

from . import mpi_ops
from .mpi_ops import Adasum, Average, _DTYPE_CODES, _resolve_op


# id(parameter) -> (weakref to it, weakref to the DistributedOptimizer hooking it, hook
# handle). Not an attribute on the parameter: that would break copy.deepcopy(model).
_HOOKED = {}


def _hook_owner(p):
    entry = _HOOKED.get(id(p))
    if entry is None or entry[0]() is not p:
        return None, None
    return entry[1](), entry[2]


class OptimizerMisuseError(exceptions.HvdliteError, AssertionError):
    """The training loop used DistributedOptimizer in a way that would give
    wrong or rank-divergent results (e.g. more backward passes than declared,
    or zero_grad() while reductions are in flight). It is also an
    AssertionError, which is what Horovod raises in these cases."""


def _find_duplicates(names):
    seen, dups = set(), []
    for n in names:
        if n in seen and n not in dups:
            dups.append(n)
        seen.add(n)
    return dups


def _split_evenly(items, n):
    n = max(1, min(n, len(items))) if items else 1
    base, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        if end > start:
            out.append(tuple(items[start:end]))
        start = end
    return out


class _DistributedOptimizer:
    """Mixin placed in front of the wrapped optimizer's class (see
    :func:`DistributedOptimizer`). ``super()`` reaches the real optimizer."""

    # -------------------------------------------------------------- setup
    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", p)
                                for i, group in enumerate(self.param_groups)
                                for j, p in enumerate(group["params"])]
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
            raise exceptions.InvalidArgumentError(
                "named_parameters must be a sequence of (name, parameter) tuples, usually "
                "model.named_parameters()")
        dups = _find_duplicates([name for name, _ in named_parameters])
        if dups:
            raise exceptions.InvalidArgumentError(
                "parameter names in named_parameters must be unique; duplicates: " + ", ".join(dups))
        named_ids = {id(p) for _, p in named_parameters}
        unnamed = [p for group in self.param_groups for p in group["params"]
                   if id(p) not in named_ids]
        if unnamed:
            shapes = ", ".join(str(tuple(p.shape)) for p in unnamed[:5])
            raise exceptions.InvalidArgumentError(
                f"named_parameters was given, but {len(unnamed)} parameter(s) of the optimizer are "
                f"not in it (shapes {shapes}); pass model.named_parameters() of the model that "
                "owns every optimized parameter")
        backward_passes_per_step = request.backward_passes(backward_passes_per_step,
                                                           "DistributedOptimizer")

        self._hvd_names = {p: name for name, p in named_parameters}
        self._hvd_compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        self._hvd_pid = process_set_id(process_set)
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named_parameters}
        self._handles = {}          # param or group tuple -> (handle or None, ctx)
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}
        self._hooked = False
        member = process_set.included() if hasattr(process_set, "included") else True
        if member and mpi_ops._set_size(process_set) > 1:
            self._register_hooks()

    def _register_hooks(self):
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if self._groups is not None:
            # Group membership must be the same everywhere: order by rank 0's names.
            order = broadcast_object([self._hvd_names[p] for p in params], root_rank=0,
                                     name="DistributedOptimizer.groups",
                                     process_set=self.process_set)
            position = {name: i for i, name in enumerate(order)}
            params.sort(key=lambda p: position.get(self._hvd_names[p], len(position)))
            if isinstance(self._groups, int):
                p_groups = _split_evenly(params, self._groups)
            else:
                wanted = {id(p) for p in params}
                p_groups, seen = [], set()
                for g in self._groups:
                    members = tuple(p for p in g if id(p) in wanted)
                    if members:
                        p_groups.append(members)
                    seen.update(id(p) for p in members)
                p_groups += [(p,) for p in params if id(p) not in seen]
            for g in p_groups:
                for p in g:
                    self._p_to_group[p] = g
                self._group_counts[g] = 0
        for key in [k for k, v in _HOOKED.items() if v[0]() is None]:
            del _HOOKED[key]        # parameters that no longer exist
        for p in params:
            self._hook_param(p)
        self._hooked = True

    def _hook_param(self, p):
        owner, handle = _hook_owner(p)
        if owner is not None and owner is not self and owner._hooked:
            warnings.warn(
                f"parameter '{self._hvd_names[p]}' was already wrapped by another "
                "DistributedOptimizer; its gradient is now reduced by the newest one only",
                stacklevel=4)
            handle.remove()
            owner._requires_update.discard(p)
        handle = p.register_post_accumulate_grad_hook(self._make_hook(p))
        _HOOKED[id(p)] = (weakref.ref(p), weakref.ref(self), handle)
        self._requires_update.add(p)
        self._hook_handles.append(handle)

    def _adopt_new_params(self):
        """Parameters unfrozen after wrapping, or added with add_param_group():
        reduce them from now on (every rank must make the same change)."""
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                if p.requires_grad and p not in self._requires_update:
                    if p not in self._hvd_names:
                        self._hvd_names[p] = f"allreduce.noname.{i}.{j}"
                    self._allreduce_delay.setdefault(p, self.backward_passes_per_step)
                    if self._groups is not None and p not in self._p_to_group:
                        self._p_to_group[p] = (p,)
                        self._group_counts[(p,)] = 0
                    self._hook_param(p)

    @property
    def _parameter_names(self):
        """{parameter: name}, the attribute Horovod scripts read."""
        return self._hvd_names

    # -------------------------------------------------------------- hooks
    def _make_hook(self, p):
        def hook(_param):
            if self._allreduce_delay[p] <= 0:
                raise OptimizerMisuseError(
                    f"the gradient of '{self._hvd_names[p]}' was computed more than "
                    f"backward_passes_per_step={self.backward_passes_per_step} times before "
                    "step(); call optimizer.step() (or synchronize()) after every "
                    f"{self.backward_passes_per_step} backward pass(es), or raise "
                    "backward_passes_per_step to accumulate more gradients locally")
            if p.grad is not None and p.grad.requires_grad:
                raise OptimizerMisuseError(
                    f"the gradient of '{self._hvd_names[p]}' requires grad (backward with "
                    "create_graph=True); DistributedOptimizer cannot reduce such gradients")
            self._allreduce_delay[p] -= 1
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._handles[group] = ([self._allreduce_grad_async(gp) for gp in group],
                                                None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _scales(self):
        _, pre, post = request.gradient_scales(self.op, self.gradient_predivide_factor)
        return pre, post

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # This rank did not use p, but another rank may have: every rank
            # must submit the same names, so reduce zeros (as Horovod does).
            p.grad = torch.zeros_like(p)
        name = self._hvd_names[p]
        grad = p.grad
        if grad.is_sparse:
            if self.sparse_as_dense:
                dense = grad.to_dense()
                return self._enqueue_dense(dense, name), ("dense_to_sparse", dense)
            return self._sparse_allreduce_async(grad, name), ("sparse", None)
        return self._enqueue_dense(grad, name), None

    def _enqueue_dense(self, grad, name):
        pre, post = self._scales()
        if not grad.is_contiguous() and grad.device.type == "cpu" and \
                grad.dtype in _DTYPE_CODES and _is_dense_block(grad):
            # e.g. channels_last parameters: the gradient is one dense block in
            # another order. Allreduce is elementwise and every rank has the
            # same layout, so reduce the block in place as a flat buffer.
            flat = grad.as_strided((grad.numel(),), (1,))
            return mpi_ops._allreduce_async(flat, flat, name, self.op, pre, post,
                                            self.process_set, self._hvd_compression,
                                            "DistributedOptimizer")
        return mpi_ops._allreduce_async(grad, grad, name, self.op, pre, post, self.process_set,
                                        self._hvd_compression, "DistributedOptimizer")

    def _sparse_allreduce_async(self, grad, name):
        return mpi_ops.sparse_allreduce_async(grad, name=name, op=self.op,
                                              process_set=self.process_set)

    # -------------------------------------------------------------- sync
    def synchronize(self):
        """Waits until every gradient has been reduced (starting the reductions
        that have not started: parameters whose hook did not fire on this rank
        reduce zeros). Call it before gradient clipping or GradScaler.unscale_,
        then ``step()`` inside :meth:`skip_synchronize`."""
        if not self._hooked:
            self._synchronized = True
            return
        self._adopt_new_params()
        started = set()
        for key in self._handles:
            started.update(key if isinstance(key, tuple) else (key,))
        try:
            for p in self._requires_update:
                if p not in started:
                    self._handles[p] = self._allreduce_grad_async(p)
            for key, (handle, ctx) in list(self._handles.items()):
                if handle is None:
                    self._handles[key] = self._allreduce_grad_async(key)
            first_error = None
            for key, (handle, ctx) in self._handles.items():
                try:
                    if isinstance(key, tuple):
                        for gp, (h, gctx) in zip(key, handle):
                            self._finish(gp, h, gctx)
                    else:
                        self._finish(key, handle, ctx)
                except exceptions.HvdliteError as e:
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            for g in self._group_counts:
                self._group_counts[g] = 0
        self._synchronized = True

    @staticmethod
    def _finish(p, handle, ctx):
        out = handle.wait()
        if ctx is None:
            return  # reduced in place into p.grad
        kind, dense = ctx
        if kind == "dense_to_sparse":
            p.grad = dense.to_sparse()
        else:
            p.grad = out

    @contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize; use after an
        explicit :meth:`synchronize`::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None, **kwargs):
        if closure is not None and self._hooked:
            # The closure runs backward inside step(): reduce after it.
            user_closure = closure

            def closure():
                with torch.enable_grad():
                    loss = user_closure()
                self.synchronize()
                return loss
            if self._should_synchronize and self._handles:
                self.synchronize()
        elif self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): the gradients are reduced again, which is slower. "
                    "Wrap step() in `with optimizer.skip_synchronize():`", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if closure is None:
            return super().step(**kwargs)
        return super().step(closure, **kwargs)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise OptimizerMisuseError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the gradients are still being "
                "reduced (or accumulated over backward_passes_per_step). Call zero_grad() "
                "before backward() or after step()")
        return super().zero_grad(set_to_none=set_to_none)

    def _hvd_reset(self):
        self._handles.clear()
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for g in self._group_counts:
            self._group_counts[g] = 0

    def load_state_dict(self, state_dict):
        self._hvd_reset()
        return super().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes):
        passes = request.backward_passes(passes, "set_backward_passes_per_step")
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def remove_hooks(self):
        """Detaches the gradient hooks (the optimizer then no longer reduces)."""
        for h in self._hook_handles:
            h.remove()
        for p in list(self._requires_update):
            if _hook_owner(p)[0] is self:
                del _HOOKED[id(p)]
        self._hook_handles = []
        self._requires_update.clear()
        self._hooked = False


# torch.optim.Optimizer wraps a class's step() for profiling and step hooks
# the first time an instance is built; the wrapped optimizer's own step()
# (reached through super()) already is, so ours must not be wrapped again.
_DistributedOptimizer.step.hooked = True


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

    Adasum combines what each rank would *do* to the model, not the raw
    gradients: when a parameter's gradient is final, the wrapped optimizer
    steps on that parameter alone, and the change it made (the delta) is
    combined across ranks with the engine's Adasum while backward goes on.
    ``step()`` then sets every parameter to its starting value plus the
    combined delta. Between a parameter's hook and ``step()`` the parameter
    holds its delta, as in Horovod.
    """

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        start = p.detach().clone()
        self._step_one(p)
        with torch.no_grad():
            p.sub_(start)  # p now holds this rank's delta
        handle = mpi_ops._allreduce_async(p.data, p.data, self._hvd_names[p], Adasum, 1.0, 1.0,
                                          self.process_set, self._hvd_compression,
                                          "DistributedOptimizer(op=Adasum)")
        return handle, ("adasum", start)

    def _step_one(self, p):
        """The wrapped optimizer's step on ``p`` alone (its state for p advances)."""
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p] if any(p is q for q in group["params"]) else []
            super(_DistributedOptimizer, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params

    @staticmethod
    def _finish(p, handle, ctx):
        handle.wait()
        with torch.no_grad():
            p.add_(ctx[1])  # start + combined delta

    @contextmanager
    def skip_synchronize(self):
        raise OptimizerMisuseError(
            "skip_synchronize() is not supported with op=Adasum: step() applies the combined "
            "update itself")
        yield  # pragma: no cover

    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()  # starts what has not started, waits, applies start + delta
        self._synchronized = False
        return loss


_DistributedAdasumOptimizer.step.hooked = True


def _is_dense_block(t):
    # Non-overlapping and dense: the strides are a permutation of a
    # contiguous layout's.
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, n in dims:
        if stride != expected:
            return False
        expected *= n
    return True


_CLASSES = {}


def _distributed_class(base, mixin=_DistributedOptimizer):
    cls = _CLASSES.get((base, mixin))
    if cls is None:
        cls = type(base.__name__, (mixin, base),
                   {"__module__": __name__, "__qualname__": base.__qualname__,
                    "__doc__": base.__doc__})
        _CLASSES[(base, mixin)] = cls
    return cls


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a ``torch.optim`` optimizer so that gradients are averaged over
    the ranks of ``process_set`` before each ``step()``.

    The result is an instance of the optimizer's own class (``isinstance``,
    ``state_dict``, LR schedulers and GradScaler work as before) that shares
    its parameter groups, state and hyperparameters.

    Arguments:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; the names key the
            reductions, so they must be the same on every rank. Without it,
            names are made from the parameter's position in its group.
        compression: ``Compression.none`` (default), ``.fp16``, ``.bf16``,
            ``Compression.topk(ratio, ...)``, ``Compression.powersgd(rank)`` or
            ``Compression.quantize(bits=4)``; runs in the engine. ``topk(momentum_correction=True)`` moves this
            optimizer's momentum into the engine (its own is set to 0).
        backward_passes_per_step: reduce once every k backward passes
            (gradient accumulation); ``step()`` after each k.
        op: ``Average`` (default) or ``Sum`` (or Min/Max/Product); ``Adasum``
            combines each rank's optimizer update with Adasum instead (Horovod's
            delta optimizer; a power-of-2 number of ranks).
        gradient_predivide_factor: with Average, divide by f before the sum
            and by size/f after it (for fp16 range).
        num_groups / groups: reduce parameters in groups (an int, or a list
            of lists of parameters); a group starts when all its gradients
            are ready. The engine fuses across groups anyway.
        sparse_as_dense: reduce sparse gradients as dense tensors instead of
            allgathering their indices and values.
        process_set: reduce only over these ranks.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer() wraps a torch.optim.Optimizer, not "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise exceptions.InvalidArgumentError(
            "this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
    op = _resolve_op(op, None, "DistributedOptimizer")
    gradient_predivide_factor = request.predivide_factor(gradient_predivide_factor, op,
                                                         "DistributedOptimizer")
    if num_groups:
        warnings.warn("num_groups is deprecated (as in Horovod); use groups=", DeprecationWarning,
                      stacklevel=2)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, bool) or not isinstance(groups, (int, list)) or \
                (isinstance(groups, int) and groups <= 0):
            raise exceptions.InvalidArgumentError(
                "groups must be a positive int or a list of lists of parameters")
        if isinstance(groups, list):
            seen = set()
            for g in groups:
                for p in g:
                    if not isinstance(p, torch.Tensor):
                        raise exceptions.InvalidArgumentError("groups must contain torch tensors")
                    if id(p) in seen:
                        raise exceptions.InvalidArgumentError(
                            "a parameter may appear in only one group")
                    seen.add(id(p))
    # momentum_correction=True: the engine applies the optimizer's momentum
    # before top-k, and the optimizer steps without its own.
    compression, own_momentum_off = resolve_momentum_correction(
        compression, [g.get("momentum") for g in optimizer.param_groups],
        any(g.get("nesterov", False) for g in optimizer.param_groups), "DistributedOptimizer")
    if own_momentum_off:
        for group in optimizer.param_groups:
            group["momentum"] = 0.0
    request.split_compression(compression)  # clear error for a bad compression argument
    if process_set is None:
        process_set = global_process_set
    # With Adasum on more than one rank, the optimizer combines its updates,
    # not the gradients (Horovod's delta optimizer); on one rank there is
    # nothing to combine.
    adasum = op == Adasum and mpi_ops._set_size(process_set) > 1
    if adasum and (groups is not None or sparse_as_dense):
        raise exceptions.InvalidArgumentError(
            "DistributedOptimizer(op=Adasum) combines each parameter's update on its own; "
            "groups= and sparse_as_dense= do not apply")
    cls = _distributed_class(type(optimizer),
                             _DistributedAdasumOptimizer if adasum else _DistributedOptimizer)
    wrapped = cls.__new__(cls)
    # Share the optimizer's groups, state and settings. Instance attributes
    # that shadow our methods (an LR scheduler patches ``opt.step``) are left
    # behind, or step() would bypass the reduction.
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                             if not callable(getattr(_DistributedOptimizer, k, None))})
    wrapped._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
