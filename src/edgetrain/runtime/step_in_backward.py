"""The optimizer stepped parameter by parameter inside the backward (NOTE [ The optimizer step in the
backward ] in ``chain.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["StepInBackward", "OptimizerFactory"]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
# the optimizers whose memory the chain models (``chain.OPTIMIZERS``), by the class a factory makes
_KINDS: dict[type[torch.optim.Optimizer], str] = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam"}
_STEPPER: WeakIdKeyDictionary = WeakIdKeyDictionary()   # parameter -> the StepInBackward that hooks it


class StepInBackward:
    """One optimizer per parameter of ``stages``, stepped as soon as autograd accumulates the parameter's
    gradient, which is then dropped.

    Args:
        stages: the stages of a chain; a parameter may belong to one stage only (a parameter shared by
            two stages gets a gradient from each backward, and would be stepped twice).
        make: builds the optimizer of one parameter, e.g. ``lambda ps: torch.optim.SGD(ps, lr=0.1)``.
        optimizer: the optimizer the chain was profiled for (``"sgd"`` or ``"adam"``); ``make``
            must build that kind, or the plan's memory would not be the step's.

    A parameter has one stepper at a time: a new one (the model wrapped again) unhooks the one before,
    which would otherwise step the parameter a second time in every backward.
    """

    def __init__(self, stages: Sequence[nn.Module], make: OptimizerFactory, optimizer: str) -> None:
        params = _stage_parameters(stages)
        self.optimizers: dict[nn.Parameter, torch.optim.Optimizer] = {p: make([p]) for p in params}
        kinds = {_KINDS.get(type(opt), type(opt).__name__) for opt in self.optimizers.values()}
        if kinds - {optimizer}:
            raise ValueError(f"step_in_backward builds {', '.join(sorted(kinds))} but the plan is for "
                             f"optimizer={optimizer!r}: give the same kind to both")
        self._paused = False
        for earlier in {id(s): s for p in params if (s := _STEPPER.get(p)) is not None}.values():
            earlier.remove()
        self._handles = [p.register_post_accumulate_grad_hook(self._step) for p in params]
        for p in params:
            _STEPPER[p] = self

    def _step(self, param: torch.Tensor) -> None:
        if self._paused:
            return
        optimizer = self.optimizers[param]  # type: ignore[index]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Gradients accumulate as usual (profiling measures them), no parameter moves."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def remove(self) -> None:
        """Unhook every parameter: later backwards leave gradients in ``.grad`` again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _stage_parameters(stages: Sequence[nn.Module]) -> list[nn.Parameter]:
    """The trainable parameters of ``stages`` in order; refuses one that two stages share."""
    owner: dict[nn.Parameter, int] = {}
    for index, stage in enumerate(stages):
        for param in stage.parameters():
            if not param.requires_grad:
                continue
            first = owner.setdefault(param, index)
            if first != index:
                raise ValueError(f"a parameter of shape {list(param.shape)} is used by stages {first} and {index}: "
                                 "step_in_backward would step it once per stage (untie it or train without it)")
    return list(owner)
