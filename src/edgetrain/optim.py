"""The optimizers edgetrain plans for, built the same way everywhere (profiling, measuring, training)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .chain import OPTIMIZERS
from .errors import UnknownNameError

__all__ = ["make_optimizer", "DEFAULT_LR"]

DEFAULT_LR = {"sgd": 0.01, "adam": 1e-3}


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float | None = None) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (the default) or Adam; the CPU single-tensor code paths."""
    if name not in OPTIMIZERS:
        raise UnknownNameError("optimizer", name, OPTIMIZERS)
    rate = DEFAULT_LR[name] if lr is None else lr
    if name == "sgd":
        return torch.optim.SGD(params, lr=rate, momentum=0.9, foreach=False)
    return torch.optim.Adam(params, lr=rate, foreach=False)
