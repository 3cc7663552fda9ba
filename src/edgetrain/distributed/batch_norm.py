"""BatchNorm over a data-parallel step's whole global batch: statistics summed across nodes, on CPU and gloo.

NOTE [ Cross-node BatchNorm ]
Each node of a data-parallel step holds a slice of the global batch. A plain BatchNorm
normalises over its node's slice (ghost batches: with 4 nodes of 8 samples ResNet-18 ended 40
steps at 0.85 where single-node training on the 32 ended at 0.50, docs/guide/cluster.md), so the cluster
trains another model than one node would. PyTorch's ``nn.SyncBatchNorm`` sums the statistics
across processes but runs on GPUs only. :class:`CrossNodeBatchNorm` does it on any device with
one small all-reduce in the forward (per channel: the samples' sum and sum of squares, and the
count, in float64) and one in the backward (the sums of ``g`` and ``g * x̂``), so a step's
gradient is single-node training's on the global batch, BatchNorm included.

The backward's convention follows :func:`~edgetrain.distributed.step.cluster_step`: each node's
loss is the mean over its own samples and its gradients are summed with weight ``n_r / N`` (its
share of the global batch). So the input gradient a node returns is ``dL/dx / (n_r / N)``, with
``L`` the global batch's mean loss: the cross-node sums are taken of ``(n_s / N)``-weighted terms
and divided by the local count, and the weight and bias gradients are local sums, which the
weighted gradient all-reduce then turns into the global ones.

Collectives must come in the same order on every node, while each node runs its own checkpointing
schedule (NOTE [ Cluster step ]): the forward's all-reduce happens at a layer's first forward of the
step (in stage order on every node), a recomputation (``norm_statistics.recomputing``) reuses that
forward's statistics, which makes its output the same and joins no collective, and the backward's
happens once per layer, in reverse stage order on every node. A layer called twice in one step is
refused. Outside :func:`cross_node_statistics` (profiling, planning, evaluation) the layer is a
plain BatchNorm.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ..autograd.norm_statistics import recomputing
from ..errors import EdgetrainError

__all__ = ["CrossNodeBatchNorm", "synchronise_batch_norm", "cross_node_statistics"]

_ACTIVE: ContextVar[bool] = ContextVar("edgetrain_cross_node_statistics", default=False)


@dataclass(frozen=True)
class _Statistics:
    mean: torch.Tensor  # (C,) over the global batch, in the input's dtype
    var: torch.Tensor  # (C,) biased, as normalisation uses
    share: float  # this node's count over the global count: the weight of its gradient


class CrossNodeBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm whose training statistics, inside :func:`cross_node_statistics`, are the global batch's
    (NOTE [ Cross-node BatchNorm ]); elsewhere a plain BatchNorm. Inputs of 2 to 5 dimensions, channels second."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_statistics: _Statistics | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if not 2 <= input.dim() <= 5:
            raise ValueError(f"expected a 2D to 5D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (_ACTIVE.get() and self.training):
            return super().forward(input)
        self._check_input_dim(input)
        if recomputing():
            if self._step_statistics is None:
                raise EdgetrainError("a recomputed BatchNorm has no statistics of its first forward in this step")
            stats = self._step_statistics
        else:
            if self._step_statistics is not None:
                raise EdgetrainError("a BatchNorm layer called twice in one step cannot take the global batch's "
                                     "statistics (NOTE [ Cross-node BatchNorm ]); give each call its own layer")
            stats = self._step_statistics = self._global_statistics(input)
        return _Normalise.apply(input, self.weight, self.bias, stats, self.eps)

    def _global_statistics(self, x: torch.Tensor) -> _Statistics:
        """The global batch's mean and biased variance per channel (one all-reduce); updates the running ones."""
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        count = x.numel() // channels if channels else 0
        with torch.no_grad():
            if count:
                var, mean = torch.var_mean(x, dim=dims, correction=0)
                mean64 = mean.double()
                local = torch.cat([mean64 * count, (var.double() + mean64 * mean64) * count])
            else:
                local = torch.zeros(2 * channels, dtype=torch.float64)
            packed = torch.cat([local, torch.tensor([float(count)], dtype=torch.float64)])
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
            total = float(packed[-1])
            if total < 2:
                raise EdgetrainError(f"BatchNorm needs more than one value per channel over the global batch, got "
                                     f"{total:g}")
            global_mean = packed[:channels] / total
            global_var = (packed[channels:2 * channels] / total - global_mean * global_mean).clamp_(min=0.0)
            self._update_running(global_mean, global_var, total)
        return _Statistics(global_mean.to(x.dtype), global_var.to(x.dtype), count / total)

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, total: float) -> None:
        """As ``_BatchNorm.forward`` does with one batch of ``total`` values: unbiased variance, momentum or the
        cumulative average."""
        if not self.track_running_stats or self.running_mean is None or self.running_var is None:
            return
        factor = 0.0 if self.momentum is None else self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        unbiased = var * (total / (total - 1))
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


class _Normalise(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with the global statistics, and its backward through them
    (NOTE [ Cross-node BatchNorm ]), with no temporary the size of ``x`` beyond the gradient itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                stats: _Statistics, eps: float) -> torch.Tensor:
        invstd = torch.rsqrt(stats.var + eps)
        ctx.save_for_backward(x, weight, stats.mean, invstd)
        ctx.share = stats.share
        return F.batch_norm(x, stats.mean, stats.var, weight, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        channels = x.shape[1]
        gamma = torch.ones_like(invstd) if weight is None else weight
        count = x.numel() // channels if channels else 0
        if count:  # per channel, local: sum of g * x_hat and of g (the fused kernel, given the global statistics)
            _, sum_g_xhat, sum_g = torch.ops.aten.native_batch_norm_backward(
                g, x, gamma, None, None, mean, invstd, True, 0.0, [False, True, True])
        else:
            sum_g_xhat = sum_g = torch.zeros_like(invstd)
        packed = torch.cat([sum_g, sum_g_xhat]).double() * ctx.share
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        grad_x = None
        if ctx.needs_input_grad[0] and count:
            across_g = (packed[:channels] / count).to(x.dtype)
            across_g_xhat = (packed[channels:] / count).to(x.dtype)
            scale = invstd * gamma  # dx = scale * (g - across_g - x_hat * across_g_xhat), as a*g + b*x + c
            slope = -scale * invstd * across_g_xhat
            offset = -scale * across_g - slope * mean
            shape = [1, channels] + [1] * (x.dim() - 2)
            grad_x = g * scale.view(shape)
            grad_x.addcmul_(x, slope.view(shape)).add_(offset.view(shape))
        elif ctx.needs_input_grad[0]:
            grad_x = torch.zeros_like(x)
        grad_weight = sum_g_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_g if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None


def synchronise_batch_norm(model: nn.Module) -> int:
    """Replace every BatchNorm of ``model`` by a :class:`CrossNodeBatchNorm` holding the same parameters and
    buffers (so the optimizer, the state's keys and a saved state stay as they were); returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, CrossNodeBatchNorm):
                setattr(parent, name, _cross_node_copy(child))
                replaced += 1
    return replaced


def _cross_node_copy(norm: nn.modules.batchnorm._BatchNorm) -> CrossNodeBatchNorm:
    copy = CrossNodeBatchNorm(norm.num_features, norm.eps, norm.momentum, norm.affine, norm.track_running_stats,
                              device=torch.device("meta"))
    copy.weight, copy.bias = norm.weight, norm.bias
    copy.running_mean, copy.running_var = norm.running_mean, norm.running_var
    copy.num_batches_tracked = norm.num_batches_tracked
    copy.train(norm.training)
    return copy


@contextlib.contextmanager
def cross_node_statistics(model: nn.Module) -> Iterator[None]:
    """While inside (one training step), ``model``'s :class:`CrossNodeBatchNorm` layers normalise over the global
    batch; each starts the step with no statistics (it is left with none)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        for module in model.modules():
            if isinstance(module, CrossNodeBatchNorm):
                module._step_statistics = None
