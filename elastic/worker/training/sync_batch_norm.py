"""`hvd.SyncBatchNorm`: batch normalization with statistics over every rank's batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from elastic.worker.collectives.allreduces import allreduce
from elastic.worker.collectives.reduce_ops import Sum

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's `SyncBatchNorm`: in training, the mean and variance of each channel are
    those of the whole job's batch, not this rank's; in evaluation the running statistics
    are used, as in `torch.nn.BatchNorm*d`.

    Each training forward makes one fused allreduce of the per-channel counts, sums and sums
    of squares (in float32 or wider); it is differentiable, so the backward pass gives the
    gradients of normalization over the whole batch. Every rank must call forward the same
    number of times (a rank with an empty batch still calls it). Input: (N, C, ...).
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, not {input.dim()}-D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias,
                False, 0.0, self.eps,
            )  # fmt: skip
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        wide = input.double() if input.dtype == torch.float64 else input.float()
        count = torch.full((1,), input.numel() // max(channels, 1), dtype=wide.dtype)
        local = torch.cat([wide.sum(dims), (wide * wide).sum(dims), count.to(wide.device)])
        total = allreduce(local, op=Sum, name=None)
        n = total[-1].clamp(min=1)
        mean = total[:channels] / n
        var = (total[channels : 2 * channels] / n - mean * mean).clamp(min=0)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (wide - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var * n / (n - 1).clamp(min=1)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach(), alpha=momentum)
        return out.to(input.dtype)
