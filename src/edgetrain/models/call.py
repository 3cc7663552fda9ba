"""A model called as it is published: several inputs, keyword inputs, a structured output.

NOTE [ Side inputs ]
A chain passes one tensor from stage to stage, but a published model takes several inputs
(``input_ids`` with an ``attention_mask``, a dict of them) and returns a structure (a Hugging
Face ``ModelOutput``). Its ``torch.export`` graph (NOTE [ Exported stages ] in ``traced.py``) has
one placeholder per input tensor and one output per tensor of the structure. The first input
tensor is the chain's input. A value that depends neither on it nor on a parameter (the other
inputs, the extended attention mask made from one, a position index) is a *side value*: no
gradient reaches it and no schedule decides about it, so it is computed once per batch, before
the first stage and without autograd, by one module of the graph's side ops, and it is held for the
whole step like the batch (the chain counts its bytes in ``input_bytes``). The cuts are taken on the
rest of the graph with the side values always available, so every encoder layer still ends at a
cut although each one reads the mask. A stage that reads side values takes them from a
:class:`SideValues` holder that :meth:`ModelCall.bind` fills for each batch, so the executor, the
profiler and the planners still see stages of one tensor. The chain ends at the model's one output
tensor; :meth:`ModelCall.output` rebuilds the model's own structure around it, and the loss is
computed on that structure, as the user's loop computes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

__all__ = ["Inputs", "ModelCall", "SideValues", "WithSideValues", "as_call", "flat_inputs", "input_shapes"]

Inputs = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
"""What a model is called with: one tensor, positional tensors (a tuple or list), or keyword tensors (a dict)."""


def as_call(sample: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``sample`` as the positional and keyword arguments of a call of the model."""
    if isinstance(sample, torch.Tensor):
        return (sample,), {}
    if isinstance(sample, Mapping):
        return (), dict(sample)
    if isinstance(sample, (tuple, list)):
        return tuple(sample), {}
    raise TypeError(f"a model's input is a tensor, a tuple of tensors or a dict of them, got {type(sample).__name__}")


def flat_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The input tensors of a call, in the order ``torch.export`` numbers them."""
    return [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]


def input_shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """Every input tensor's shape: what an export is specialised to."""
    return tuple(tuple(t.shape) for t in flat_inputs(args, kwargs))


@dataclass
class SideValues:
    """The current batch's side values by graph name (NOTE [ Side inputs ])."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)


class WithSideValues(nn.Module):
    """A stage of one tensor whose graph also reads side values: it takes them from ``holder``."""

    def __init__(self, stage: nn.Module, names: list[str], holder: SideValues) -> None:
        super().__init__()
        self.stage = stage
        self.names = names
        self.holder = holder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(x, *(self.holder.values[name] for name in self.names))


@dataclass
class ModelCall:
    """How a model with side inputs or a structured output is called (NOTE [ Side inputs ]).

    ``sides`` computes, from every argument of the call, the side values the stages read (named ``names``);
    ``main`` is the position of the chain's input, the first tensor, among those arguments; ``out_spec`` the
    structure of the model's output around its one tensor; ``shapes`` the input shapes the export holds for.
    """

    in_spec: pytree.TreeSpec
    main: int
    sides: fx.GraphModule
    names: list[str]
    holder: SideValues
    out_spec: pytree.TreeSpec
    shapes: tuple[tuple[int, ...], ...]

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """The chain's input of a call, with the call's side values put in the holder (without autograd).

        Raises:
            ValueError: a call whose inputs are not the ones the model was captured with (other names or shapes).
        """
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            raise ValueError(f"the model was planned for inputs {self.in_spec}, and is called with {spec}")
        with torch.no_grad():
            values = self.sides(*flat) if self.names else ()
        self.holder.values = dict(zip(self.names, values, strict=True))
        return flat[self.main]

    def side_tensors(self) -> list[torch.Tensor]:
        """The holder's side values that are tensors, the call's other inputs among them (a flag the call passes,
        ``use_cache=False``, is not one)."""
        return [value for value in self.holder.values.values() if isinstance(value, torch.Tensor)]

    def weights(self) -> list[torch.Tensor]:
        """The parameters and buffers the side values are made from: a side value that views one (a slice of a
        position-index buffer) is part of the weights, not of the batch."""
        return [*self.sides.parameters(), *self.sides.buffers()]

    def output(self, tensor: torch.Tensor) -> Any:
        """The model's own output structure (a ``ModelOutput``, a tuple) around its one tensor."""
        return pytree.tree_unflatten([tensor], self.out_spec)

    @property
    def plain(self) -> bool:
        """Whether the model is called with one tensor and returns one: the call adds nothing."""
        return not self.names and self.out_spec.is_leaf() and self.in_spec.num_leaves == 1
