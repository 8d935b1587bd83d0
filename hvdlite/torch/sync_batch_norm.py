"""Batch normalization whose statistics cover the whole global batch.

In training each rank computes per-channel sums of x and x² over its own
batch; one allreduce (Sum) of [sum, sum of squares, count] gives the global
mean and variance. Backward needs two more global sums (of dy and of
dy·x̂), again one allreduce. Weight and bias gradients stay local: the
DistributedOptimizer averages them like any other gradient.
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvdlite.process_sets import global_process_set

from . import mpi_ops


def _channel_shape(x):
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        x = x.contiguous()
        channels = x.shape[1]
        dims = _reduce_dims(x)
        local_count = x.numel() // channels if channels else 0
        stats = torch.cat([
            x.sum(dims, dtype=torch.float64),
            (x * x).sum(dims, dtype=torch.float64),
            torch.tensor([float(local_count)], dtype=torch.float64),
        ])
        stats = mpi_ops.allreduce(stats, op=mpi_ops.Sum, process_set=process_set)
        count = stats[-1].item()
        if count <= 1 and running_mean is not None:
            raise ValueError(
                f"SyncBatchNorm: expected more than 1 value per channel over all ranks in "
                f"training, got input of shape {tuple(x.shape)} on this rank and {int(count)} "
                "values in total")
        mean = stats[:channels] / count
        var = (stats[channels:2 * channels] / count - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)

        shape = _channel_shape(x)
        mean_x = mean.to(x.dtype).view(shape)
        invstd_x = invstd.to(x.dtype).view(shape)
        xhat = (x - mean_x) * invstd_x
        out = xhat
        if weight is not None:
            out = out * weight.view(shape)
        if bias is not None:
            out = out + bias.view(shape)

        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * (count / (count - 1))
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        ctx.save_for_backward(xhat, weight, invstd_x)
        ctx.count = count
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xhat, weight, invstd = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dims = _reduce_dims(grad_out)
        channels = grad_out.shape[1]
        shape = _channel_shape(grad_out)
        sum_dy = grad_out.sum(dims, dtype=torch.float64)
        sum_dy_xhat = (grad_out * xhat).sum(dims, dtype=torch.float64)

        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None and \
            ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(grad_out.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None

        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = mpi_ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=mpi_ops.Sum,
                                     process_set=ctx.process_set)
            mean_dy = (sums[:channels] / ctx.count).to(grad_out.dtype).view(shape)
            mean_dy_xhat = (sums[channels:] / ctx.count).to(grad_out.dtype).view(shape)
            scale = invstd if weight is None else invstd * weight.view(shape)
            grad_x = (grad_out - mean_dy - xhat * mean_dy_xhat) * scale
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Drop-in replacement for ``torch.nn.BatchNorm1d/2d/3d`` that, in
    training, normalizes with the mean and variance of the batch of all ranks
    of ``process_set`` together (running statistics too). In eval mode, or on
    one rank, it is plain batch norm. Input: (N, C, ...) with at least 2 dims.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2D input (N, C, ...), "
                             f"got {input.dim()}D")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or mpi_ops._set_size(self.process_set) == 1:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        track = self.track_running_stats and self.running_mean is not None
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if track else None, self.running_var if track else None,
            self.eps, factor, self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns ``module`` with every BatchNorm*d replaced by SyncBatchNorm
        (weights and running statistics kept)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out
