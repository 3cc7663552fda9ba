"""The optimizers edgetrain plans for, built the same way everywhere (profiling, measuring, training)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch

from ..errors import UnknownNameError
from .chain import OPTIMIZERS

__all__ = ["make_optimizer", "DEFAULT_LR", "LR_SCHEDULES", "scheduled_rate", "set_learning_rate", "TrainingOptimizer"]

DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3}
LR_SCHEDULES = ("constant", "cosine")


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float | None = None) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (the default) or Adam, over the parameters of ``params`` that train (frozen ones,
    NOTE [ Update schemes ] in ``models/update.py``, get no state); the CPU single-tensor code paths."""
    if name not in OPTIMIZERS:
        raise UnknownNameError("optimizer", name, OPTIMIZERS)
    rate = DEFAULT_LR[name] if lr is None else lr
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=rate, momentum=0.9, foreach=False)
    return torch.optim.Adam(params, lr=rate, foreach=False)


def scheduled_rate(rate: float, schedule: str, step: int, total_steps: int) -> float:
    """The rate of the step that follows ``step`` steps of a run of ``total_steps``: ``rate`` throughout
    (``constant``), or ``cosine``: ``rate · (1 + cos(π · step / total_steps)) / 2``, from ``rate`` at the first step
    down towards 0 at the last, without warm-up (Loshchilov & Hutter 2017, one cycle). A decay to 0 is what makes a
    run's final loss a property of the run, not of where SGD's noise left the weights at a constant rate."""
    if schedule not in LR_SCHEDULES:
        raise UnknownNameError("learning-rate schedule", schedule, LR_SCHEDULES)
    if schedule == "constant":
        return rate
    return rate * (1 + math.cos(math.pi * min(step, total_steps) / total_steps)) / 2


class TrainingOptimizer(Protocol):
    """What a training loop asks of its optimizer: a ``torch.optim.Optimizer``, or one optimizer per parameter
    stepped in the backward (:class:`~edgetrain.runtime.step_in_backward.StepInBackward`)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    @property
    def state(self) -> Mapping[Any, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


def set_learning_rate(optimizer: TrainingOptimizer, rate: float) -> None:
    """Every parameter group's rate becomes ``rate`` (the optimizer's state is kept)."""
    for group in optimizer.param_groups:
        group["lr"] = rate
