"""BatchNorm whose batch statistics span every rank's micro-batch, on the CPU.

torch's SyncBatchNorm runs on GPUs only; under gloo the built-in data-parallel loop uses this
instead, so that W ranks normalize a micro-step with the statistics of all its rows, as one
process would. Sums travel through an all-reduce that carries gradients back to every rank;
mean and variance are two passes, in float64 like torch's own CPU BatchNorm.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _SumOverRanks(torch.autograd.Function):
    """y = the sum of x over the ranks; each rank's gradient is the sum of theirs."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = grad.clone()
        dist.all_reduce(out)
        return out


class RankBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm layer (any input rank) normalizing with statistics over all ranks."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        count = torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64)
        dist.all_reduce(count)
        n = float(count)
        wide = x.to(torch.float64)
        mean = _SumOverRanks.apply(wide.sum(dims)) / n
        centered = wide - mean.reshape(shape)
        var = _SumOverRanks.apply((centered * centered).sum(dims)) / n
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (
                    self.momentum
                    if self.momentum is not None
                    else 1 / float(self.num_batches_tracked)
                )
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                unbiased = var * n / max(n - 1, 1)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        return out.to(x.dtype)


def convert(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm layer by a RankBatchNorm holding the same parameters and buffers
    (the optimizer keeps working on them)."""
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            layer = RankBatchNorm(
                child.num_features,
                child.eps,
                child.momentum,
                child.affine,
                child.track_running_stats,
            )
            if child.affine:
                layer.weight, layer.bias = child.weight, child.bias
            if child.track_running_stats:
                layer.running_mean, layer.running_var = child.running_mean, child.running_var
                layer.num_batches_tracked = child.num_batches_tracked
            layer.train(child.training)
            setattr(model, name, layer)
        else:
            convert(child)
    return model
