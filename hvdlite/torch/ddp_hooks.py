"""DDP communication hooks that compress in hvdlite's engine.

On the "hvdlite" torch.distributed backend (docs/ddp.md), a DDP model can
hand its gradient buckets to hvdlite's compressors (hvdlite/compression.py,
docs/compression.md) instead of torch's Python hooks::

    from hvdlite.torch import ddp_hooks

    model = DistributedDataParallel(model)
    named = model.module.named_parameters()
    # one of:
    model.register_comm_hook(None, ddp_hooks.fp16_hook)          # or bf16_hook
    model.register_comm_hook(None, ddp_hooks.topk_hook(0.01, named_parameters=named))
    model.register_comm_hook(None, ddp_hooks.powersgd_hook(rank=2, named_parameters=named))
    model.register_comm_hook(None, ddp_hooks.quantize_hook(bits=4, named_parameters=named))

Each hook submits the bucket to the engine's allreduce (mpi_ops, with the
matching ``Compression``, op=Average as DDP expects) and returns a
``torch.futures.Future`` that the engine's completion completes; the
compressing, the error feedback and PowerSGD's factors all happen in the
engine, as for ``DistributedOptimizer(compression=...)``.

- fp16 and bf16 are elementwise: the bucket's flat buffer goes as one tensor,
  named by the process group like its other collectives.
- top-k, PowerSGD and the quantizer keep state per tensor (residuals,
  velocities, PowerSGD's Q, seeded by the tensor's name; the quantizer's
  residuals and random draws) and work per tensor: each parameter's
  gradient in the bucket goes as its own tensor (the engine still fuses them),
  named by the parameter. With ``named_parameters`` (the DDP model's
  ``module.named_parameters()``) the names are the parameters' names, as
  ``DistributedOptimizer(named_parameters=...)`` gives them, so both compute
  the same; without, ``ddp.hook<n>.<i>``: the n-th such hook made in this
  process, its i-th parameter in the order DDP first hands them over (the
  same on every rank as long as every rank makes its hooks in the same order).

``state`` (register_comm_hook's first argument) is None (the default group)
or the hvdlite process group to reduce over, as with torch's default hooks.
"""
import itertools

import torch.distributed as dist

from hvdlite import exceptions
from hvdlite.compression import Compression, PowerSGDCompressor, QuantizeCompressor, TopKCompressor
from hvdlite.request import Average

from . import c10d, mpi_ops

_hook_numbers = itertools.count()


def _group(state, what):
    """The hvdlite process group of ``state`` (None: the default group)."""
    group = state
    if group is None:
        if not dist.is_initialized():
            raise exceptions.InvalidArgumentError(
                f"{what} needs torch.distributed's default group: call "
                "dist.init_process_group(backend=\"hvdlite\") first")
        group = dist.distributed_c10d._get_default_group()
    if not isinstance(group, c10d.HvdliteProcessGroup):
        raise exceptions.InvalidArgumentError(
            f"{what} runs in hvdlite's engine: it needs a process group of the \"hvdlite\" "
            f"backend (dist.init_process_group(backend=\"hvdlite\")), or pass such a group as "
            f"register_comm_hook's state; got {group!r}")
    return group


def _future(handles, bucket, what):
    buffer = bucket.buffer()
    return c10d.HvdliteWork(handles, lambda _results: buffer, what).get_future()


def _bucket_hook(compression, label):
    """A hook that reduces the bucket's flat buffer as one tensor."""
    def hook(state, bucket):
        group = _group(state, label)
        handle = group._allreduce_start(bucket.buffer(), Average, compression=compression)
        return _future([handle], bucket, label)
    hook.__qualname__ = hook.__name__ = label
    return hook


def _parameter_hook(compression, named_parameters, label):
    """A hook that reduces each parameter's gradient in the bucket as its own
    tensor, named by the parameter (see the module's doc)."""
    number = next(_hook_numbers)
    names = {}      # id(parameter) -> engine name
    if named_parameters is not None:
        for name, p in named_parameters:
            names[id(p)] = name
    taken = set(names.values())

    def name_of(p):
        name = names.get(id(p))
        if name is None:
            name = f"ddp.hook{number}.{len(names)}"
            while name in taken:
                name += "_"
            names[id(p)] = name
            taken.add(name)
        return name

    def hook(state, bucket):
        group = _group(state, label)
        handles = [mpi_ops.allreduce_async_(grad, name=name_of(p), op=Average,
                                            process_set=group._process_set,
                                            compression=compression)
                   for p, grad in zip(bucket.parameters(), bucket.gradients())]
        return _future(handles, bucket, label)
    hook.__qualname__ = hook.__name__ = label
    return hook


def fp16_hook(state, bucket):
    """Gradients cross the wire as float16 (summed in float32 precision) and
    come back averaged in their own dtype: ``Compression.fp16`` in the engine.
    ``model.register_comm_hook(None, fp16_hook)``."""
    return _FP16(state, bucket)


def bf16_hook(state, bucket):
    """As :func:`fp16_hook` with bfloat16 on the wire (``Compression.bf16``)."""
    return _BF16(state, bucket)


_FP16 = _bucket_hook(Compression.fp16, "hvdlite.fp16_hook")
_BF16 = _bucket_hook(Compression.bf16, "hvdlite.bf16_hook")


def topk_hook(ratio=0.01, error_feedback=True, momentum_correction=None, warmup_steps=0,
              clip_norm=None, named_parameters=None):
    """A hook for ``Compression.topk(ratio, error_feedback, momentum_correction,
    warmup_steps, clip_norm)`` (docs/compression.md) on each parameter's
    gradient. A hook does not see the optimizer: give ``momentum_correction``
    as a number (the momentum) and train with plain SGD, as with direct
    collectives."""
    if momentum_correction is True:
        raise exceptions.InvalidArgumentError(
            "topk_hook(momentum_correction=True): a DDP hook does not see the optimizer, so it "
            "cannot take its momentum; give the momentum as a number (momentum_correction=0.9) "
            "and train with plain SGD (momentum=0)")
    compression = TopKCompressor(ratio, error_feedback, momentum_correction, warmup_steps,
                                 clip_norm)
    return _parameter_hook(compression, named_parameters, f"hvdlite.topk_hook({ratio})")


def powersgd_hook(rank=2, start_iter=10, named_parameters=None):
    """A hook for ``Compression.powersgd(rank, start_iter)`` on each parameter's
    gradient (matrices as rank-``rank`` factors; vectors dense)."""
    compression = PowerSGDCompressor(rank, start_iter)
    return _parameter_hook(compression, named_parameters, f"hvdlite.powersgd_hook({rank})")


def quantize_hook(bits=4, block_size=64, rounding=None, error_feedback=True, seed=0,
                  named_parameters=None):
    """A hook for ``Compression.quantize(bits, block_size, rounding,
    error_feedback, seed)`` on each parameter's gradient (its blocks and
    residual stay within the parameter)."""
    compression = QuantizeCompressor(bits, block_size, rounding, error_feedback, seed)
    return _parameter_hook(compression, named_parameters, f"hvdlite.quantize_hook({bits})")


def compression_hook(compression, named_parameters=None):
    """The hook for any of hvdlite's compressors (``Compression.none``, ``.fp16``,
    ``.bf16``, ``.topk(...)``, ``.powersgd(...)``, ``.quantize(...)``): the
    last three per parameter, the others on the whole bucket."""
    if isinstance(compression, type):
        compression = compression()
    label = f"hvdlite.compression_hook({compression!r})"
    if isinstance(compression, TopKCompressor) and compression.momentum_correction is True:
        return topk_hook(momentum_correction=True)   # raises with the advice
    if isinstance(compression, (TopKCompressor, PowerSGDCompressor, QuantizeCompressor)):
        return _parameter_hook(compression, named_parameters, label)
    return _bucket_hook(compression, label)
