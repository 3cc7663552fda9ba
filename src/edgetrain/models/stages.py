"""A model's training step as a list of stage modules: the model's own stages, then the loss."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..models import stages_of
from .call import Inputs, ModelCall
from .traced import model_call

__all__ = ["CompiledStage", "FrozenPrefix", "LossStage", "compiled_stages", "fold_frozen_prefix", "parameter_holders",
           "training_stages"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def parameter_holders(stages: Sequence[nn.Module]) -> dict[nn.Parameter, list[int]]:
    """Each parameter of ``stages`` in order, with the stages that hold it: more than one for a parameter
    that stages share (a GPT's token embedding tied to its output layer; NOTE [ Shared parameters ] in
    ``profile/profiler.py``)."""
    holders: dict[nn.Parameter, list[int]] = {}
    for index, stage in enumerate(stages):
        for param in stage.parameters():
            holders.setdefault(param, []).append(index)
    return holders


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


def training_stages(model: nn.Module, loss_fn: LossFn | None = None,
                    sample: Inputs | None = None) -> list[nn.Module]:
    """The model's chain of stages (given ``sample``, exported where torch.fx cannot trace it: :func:`stages_of`)
    followed by a :class:`LossStage`; the stages before the first one with a parameter that trains fold into it
    (:func:`fold_frozen_prefix`)."""
    stages = stages_of(model, sample)
    call = model_call(stages)
    return fold_frozen_prefix([*stages, LossStage(loss_fn if call is None else loss_on_output(loss_fn, call))])


def loss_on_output(loss_fn: LossFn | None, call: ModelCall) -> LossFn | None:
    """``loss_fn`` computed on the model's own output structure (NOTE [ Side inputs ] in ``models/call.py``), as
    the user's loop computes it; None (cross-entropy on the output tensor) stays None."""
    if loss_fn is None:
        return None
    user_loss = loss_fn

    @functools.wraps(user_loss)
    def on_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return user_loss(call.output(output), target)

    return on_output


class FrozenPrefix(nn.Sequential):
    """The stages before the first one that trains, and that one: the chain's first stage.

    Nothing before the first trained parameter needs a gradient, so autograd records nothing there: the frozen
    stages' activations are transients of one forward, never values a schedule keeps or recomputes. As the
    chain's first stage, its input is the batch, which no gradient reaches, as the planners and the executor
    assume of stage 0 (NOTE [ Update schemes ] in ``models/update.py``).
    """

    @property
    def frozen(self) -> int:
        """How many frozen stages come before the one that trains."""
        return len(self) - 1


def fold_frozen_prefix(stages: list[nn.Module]) -> list[nn.Module]:
    """``stages`` with those before the first holding a parameter that trains folded into it (a
    :class:`FrozenPrefix`); unchanged if the first stage trains, or if no stage does."""
    first = next((i for i, stage in enumerate(stages) if any(p.requires_grad for p in stage.parameters())), 0)
    if first == 0:
        return stages
    return [FrozenPrefix(*stages[:first + 1]), *stages[first + 1:]]


# NOTE [ Compiled stages ]
# torch.compile's inductor fuses the elementwise work around convolutions and matmuls (BatchNorm,
# activations, residual adds) that eager runs as separate kernels, each writing a full tensor:
# on CPU it trains MobileNetV2 at half of eager's time (the compile_budget benchmark). Planning
# and fusion are independent: a compiled stage is still a stage, whose saved tensors (AOTAutograd
# saves through ``ctx.save_for_backward``, which ``saved_tensors_hooks`` see), output and times the
# profiler measures, its bytes by the allocator's records rather than the tracker (NOTE [ Compiled
# code and the tracker ] in ``profile/tracker.py``), so the chain, the planners and the executor need
# no change; a plan made on the compiled stages trades memory for time at the fused kernels' prices. Each
# stage is compiled alone (no graph breaks across stages, and a recomputation runs the same
# compiled code), with ``dynamic=False``: a chain is planned per input shape anyway. Stages of
# one class share one code object (a ResNet's blocks: ``BasicBlock.forward``), and each shape and
# grad mode (a recomputation without autograd) is one more compilation of it: dynamo's recompile
# limit (8 per code object) would silently leave the later blocks eager, so it is raised to two
# per stage, process-wide (a dynamo setting, not a per-module one).


class CompiledStage(nn.Module):
    """A stage compiled by inductor on its own, which runs its eager module while a dispatch mode is active.

    A compiled module called under any ``TorchDispatchMode`` (edgetrain's byte tracker, a FLOP counter,
    fake tensors) runs eagerly, and dynamo then skips its code for the rest of the process: every later
    call of every module of that class runs eagerly too, without a word. Under a mode this stage calls the
    eager module instead, so the compiled one stays compiled (NOTE [ Compiled code and the tracker ]).
    """

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.compiled: nn.Module = torch.compile(stage, dynamic=False)  # type: ignore[assignment]

    @property
    def eager(self) -> nn.Module:
        """The stage as written, uncompiled."""
        module = self.compiled._orig_mod
        assert isinstance(module, nn.Module)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:   # the mode stack itself (the module-level flag outlives a pop)
            return self.eager(x)
        output: torch.Tensor = self.compiled(x)
        return output


def compiled_stages(stages: list[nn.Module]) -> list[nn.Module]:
    """Every stage but the loss (the last) compiled on its own; see NOTE [ Compiled stages ]."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * len(stages))
    return [*(CompiledStage(stage) for stage in stages[:-1]), stages[-1]]
