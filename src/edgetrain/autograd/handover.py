"""Back-propagate one stage with the autograd engine holding the only reference to its output gradient.

``torch.autograd.backward(y, δ)`` keeps ``δ`` alive until it returns: the caller's argument
refers to it. Plain backprop frees a stage's output gradient as soon as the stage's last
operator has consumed it, which on a ResNet block is long before the block's peak. So a
record gets a :class:`HandOver` node on its output at forward time, and its backward is
run through that node: the node's backward takes ``δ`` out of a box and returns it, and
from then on only the engine refers to it. The profiler measures a stage's backward workspace
this way and the executor runs every backward this way, so what the chain says is what runs.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GradBox", "HandOver", "backward_from_box"]


class GradBox:
    """A one-tensor mailbox: the gradient handed to (or caught from) a stage's backward."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


class HandOver(torch.autograd.Function):
    """A 0-element output on ``y`` whose backward returns the gradient waiting in ``box`` (ones if none).

    Nothing of ``y`` is saved: the node only links to ``y``'s graph.
    """

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, box: GradBox) -> torch.Tensor:
        ctx.box = box
        ctx.like = (y.shape, y.dtype, y.device)
        return y.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad, ctx.box.grad = ctx.box.grad, None
        if grad is None:   # the loss starts its own backward with 1
            shape, dtype, device = ctx.like
            grad = torch.ones(shape, dtype=dtype, device=device)
        return grad, None


def backward_from_box(output: torch.Tensor) -> None:
    """Run the backward behind a :class:`HandOver` output; its box must hold the gradient (or None for ones)."""
    torch.autograd.backward(output, output.new_empty(0))
