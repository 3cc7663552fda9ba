"""The measured peak of a real, plain training step: what every estimate is held against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..optim import make_optimizer
from ..stages import LossFn
from .tracker import LiveBytesTracker

__all__ = ["MeasuredStep", "measure_training_step"]


@dataclass(frozen=True)
class MeasuredStep:
    """Live tensor bytes of one steady-state step (see NOTE [ What the tracker counts ])."""

    peak_bytes: int
    resident_bytes: int
    loss: float


def measure_training_step(model: nn.Module, sample: torch.Tensor, target: torch.Tensor | None = None, *,
                          loss_fn: LossFn | None = None, optimizer: str = "sgd",
                          warmup_steps: int = 1) -> MeasuredStep:
    """Run plain training steps (zero_grad, forward, loss, backward, optimizer step) and measure the last.

    The warm-up steps create the optimizer state, so the measured step is a steady-state one,
    as every later step of a training run is. The model's weights are updated.
    """
    criterion = loss_fn if loss_fn is not None else nn.functional.cross_entropy
    labels = target if target is not None else torch.zeros(sample.shape[0], dtype=torch.long, device=sample.device)
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    model.train()
    for _ in range(warmup_steps):
        _step(model, opt, criterion, sample, labels)
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, opt, sample, labels)
        resident = tracker.current_bytes
        loss = _step(model, opt, criterion, sample, labels)
    return MeasuredStep(peak_bytes=tracker.peak_bytes, resident_bytes=resident, loss=loss)


def _step(model: nn.Module, opt: torch.optim.Optimizer, criterion: LossFn, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())
