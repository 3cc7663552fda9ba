"""The optimizer stepped parameter by parameter inside the backward (NOTE [ The optimizer step in the
backward ] in ``chain.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..models.stages import parameter_holders

__all__ = ["StepInBackward", "OptimizerFactory", "shared_gradient_bytes"]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
# the optimizers whose memory the chain models (``chain.OPTIMIZERS``), by the class a factory makes
_KINDS: dict[type[torch.optim.Optimizer], str] = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam"}
_STEPPER: WeakIdKeyDictionary = WeakIdKeyDictionary()   # parameter -> the StepInBackward that hooks it
STATE_KEY = "step_in_backward"   # its state_dict's one key: the per-parameter optimizers' states


class StepInBackward:
    """One optimizer per parameter of ``stages``, stepped as soon as autograd accumulates the parameter's
    gradient, which is then dropped.

    Args:
        stages: the stages of a chain. A parameter several stages hold (a GPT's token embedding tied to
            its output layer) gets a part of its gradient from each of their backwards: it is stepped
            once the last of them has added its part (:func:`shared_gradient_bytes`: its gradient is
            held until then).
        make: builds the optimizer of one parameter, e.g. ``lambda ps: torch.optim.SGD(ps, lr=0.1)``.
        optimizer: the optimizer the chain was profiled for (``"sgd"`` or ``"adam"``); ``make``
            must build that kind, or the plan's memory would not be the step's.

    A parameter has one stepper at a time: a new one (the model wrapped again) unhooks the one before,
    which would otherwise step the parameter a second time in every backward.
    """

    def __init__(self, stages: Sequence[nn.Module], make: OptimizerFactory, optimizer: str) -> None:
        self._holders = _trainable_holders(stages)
        params = list(self._holders)
        self._added: dict[nn.Parameter, int] = {}   # this step's gradient parts so far, for a shared parameter
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
        added = self._added.pop(param, 0) + 1  # type: ignore[call-overload]
        if added < len(self._holders[param]):  # type: ignore[index]
            self._added[param] = added  # type: ignore[index]
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

    # --- to a training loop, the one optimizer it saves, restores and sets the rate of (optim.TrainingOptimizer)
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every parameter's optimizer's groups: a rate set in them is the next backward's."""
        return [group for optimizer in self.optimizers.values() for group in optimizer.param_groups]

    @property
    def state(self) -> dict[nn.Parameter, Any]:
        return {p: optimizer.state[p] for p, optimizer in self.optimizers.items() if p in optimizer.state}

    def state_dict(self) -> dict[str, Any]:
        """Each parameter's optimizer's ``state_dict()``, in the stages' order of parameters."""
        return {STATE_KEY: [optimizer.state_dict() for optimizer in self.optimizers.values()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        parts = state_dict.get(STATE_KEY)
        if not isinstance(parts, list) or len(parts) != len(self.optimizers):
            found = "one optimizer's state" if parts is None else f"{len(parts)} parameters' states"
            raise ValueError(f"the saved optimizer state is {found}, not one for each of these "
                             f"{len(self.optimizers)} parameters stepped in the backward")
        for optimizer, part in zip(self.optimizers.values(), parts, strict=True):
            optimizer.load_state_dict(part)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: each gradient was dropped once its parameter was stepped."""

    def step(self) -> None:
        """Nothing to do: the backward stepped every parameter."""

    def remove(self) -> None:
        """Unhook every parameter: later backwards leave gradients in ``.grad`` again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _trainable_holders(stages: Sequence[nn.Module]) -> dict[nn.Parameter, list[int]]:
    return {param: holding for param, holding in parameter_holders(stages).items() if param.requires_grad}


def shared_gradient_bytes(stages: Sequence[nn.Module]) -> list[int]:
    """Per stage, the gradient bytes of the parameters it shares with earlier stages and holds last.

    Such a gradient is made by this stage's backward (the first of the holders' to run) and lives until
    the first holder's backward has added its part: with the optimizer in the backward it stays a held
    gradient of this stage, where the profiler counts it (NOTE [ Shared parameters ] in
    ``profile/profiler.py``), not workspace. Held to the step's end by the chain: at most the time from
    the first holder's backward on, which is the step's last backward when the first holder is stage 0.
    """
    shared = [0] * len(stages)
    for param, holding in _trainable_holders(stages).items():
        if len(holding) > 1:
            shared[holding[-1]] += param.untyped_storage().nbytes()
    return shared
