"""A model's training step as a list of stage modules: the model's own stages, then the loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .models import stages_of

__all__ = ["LossStage", "training_stages"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossStage(nn.Module):
    """The loss as the last stage of a chain, so planners see its memory and time too.

    The target changes every step, so it is set on the module (``stage.target = y``) rather
    than passed through the chain, whose stages take exactly one tensor each.
    """

    def __init__(self, loss_fn: LossFn | None = None) -> None:
        super().__init__()
        self.loss_fn: LossFn = loss_fn if loss_fn is not None else nn.functional.cross_entropy
        self.target: torch.Tensor | None = None

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        if self.target is None:
            raise RuntimeError("LossStage.target must be set before the forward pass")
        return self.loss_fn(output, self.target)


def training_stages(model: nn.Module, loss_fn: LossFn | None = None) -> list[nn.Module]:
    """The model's chain of stages followed by a :class:`LossStage`."""
    return [*stages_of(model), LossStage(loss_fn)]
