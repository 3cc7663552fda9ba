"""What one training step leaves behind, to compare a scheduled step with plain autograd."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class StepResult:
    loss: torch.Tensor
    grads: list[torch.Tensor | None]
    buffers: list[torch.Tensor]
    rng: torch.Tensor


def observe(model: nn.Module, loss: torch.Tensor) -> StepResult:
    return StepResult(loss.detach(), [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()],
                      torch.get_rng_state())


def plain_autograd_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> StepResult:
    """The reference: one plain forward, cross-entropy loss and backward, the RNG seeded first."""
    torch.manual_seed(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return observe(model, loss)
