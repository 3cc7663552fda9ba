"""A real, plain training step and what is measured of it: its peak (what every estimate is held against), its time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..core.optim import make_optimizer
from ..models.stages import LossFn
from .tracker import LiveBytesTracker

__all__ = ["MeasuredStep", "measure_training_step", "step_times", "train_step"]


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
        train_step(model, sample, labels, opt, criterion)
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, opt, sample, labels)
        resident = tracker.current_bytes
        loss = train_step(model, sample, labels, opt, criterion)
    return MeasuredStep(peak_bytes=tracker.peak_bytes, resident_bytes=resident, loss=loss)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer | None = None,
               criterion: LossFn = nn.functional.cross_entropy) -> float:
    """One plain training step, its loss: zero_grad, forward, loss, backward, then the optimizer's step.

    Without an optimizer the step ends at the gradients: the forward and backward whose FLOPs
    the planner counts (the device probe and the host calibration time it).
    """
    if optimizer is None:
        model.zero_grad(set_to_none=True)
    else:
        optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return float(loss.detach())


def step_times(step: Callable[[], object], repeats: int, *, warmup: int = 1, calls: int = 1,
               around: Callable[[], AbstractContextManager[object]] = nullcontext) -> Iterator[float]:
    """Seconds per call of ``step``, timed over ``calls`` calls at a time, ``repeats`` times after ``warmup`` calls.

    The warm-up calls (allocator, caches, optimizer state) are not timed. ``around`` is entered
    around each timed stretch (a power meter's sampling). A generator, so that what the caller
    does between two stretches (a DGEMM burst, a progress report) runs there and is not timed.
    """
    for _ in range(warmup):
        step()
    for _ in range(repeats):
        with around():
            start = time.perf_counter()
            for _ in range(calls):
                step()
            elapsed = time.perf_counter() - start
        yield elapsed / calls
