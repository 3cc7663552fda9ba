"""Training steps named by a setting: eager, ``torch.compile`` at an activation memory budget, or edgetrain's plans.

The ``compile_budget`` and ``step_peak_live`` benchmarks set edgetrain against inductor's min-cut
rematerialisation (``torch._functorch.config.activation_memory_budget``) on one model at a time; a *setting* names
the step they measure:

* ``eager``: plain autograd; ``inductor:B``: the model compiled with ``activation_memory_budget = B``;
* ``edgetrain:R``: ``Checkpointed(recompute=R)``; ``edgetrain:least``: at the least feasible budget;
  ``edgetrain=inductor:B``: at the budget whose step share (the budget less the weights, optimizer state and batch
  the chain holds anyway) is the tensor step peak ``inductor:B`` measured (passed in as ``match_step_bytes``);
* ``edgetrain+compile:...`` the same with every stage compiled by inductor before it is profiled and planned
  (``Checkpointed(compile_stages=True)``, NOTE [ Compiled stages ]);
* ``edgetrain+regions@b=inductor:B``: a single-level plan at the matched budget run as ``torch.utils.checkpoint``
  regions of one graph compiled whole at ``activation_memory_budget = b`` (1.0 where ``@b`` is left out; NOTE
  [ Checkpoint regions in one compiled graph ] in ``runtime/regions.py``);
* ``edgetrain+compiled=inductor:B``: :func:`~edgetrain.runtime.compiled.fit_compiled` at the matched budget (NOTE
  [ A byte budget for torch.compile ]);
* ``+step_in_backward`` after a setting's kind (``inductor+step_in_backward:1.0``,
  ``edgetrain+step_in_backward:least``): the optimizer stepped in the backward, one SGD per parameter hooked to its
  gradient's accumulation (NOTE [ The optimizer step in the backward ] in ``chain.py``), a step with another
  contract (no gradient outlives the backward).

Models are ``resnet18`` and ``mobilenet_v2`` of the zoo (at a batch and image size) or the cases of
:mod:`edgetrain.models.cases` (their activation-bound inputs where they have them); ``NAME@channels_last`` is that
model with its weights and batch in channels-last memory format. edgetrain plans with measured stage times and, for
the traced models without compilation, recomputation inside coarse stages (``blocks=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.optim import make_optimizer
from ..core.simulator import simulate
from ..errors import EdgetrainError
from ..models import get_model_spec, stages_of
from ..models.cases import Case, block_model_cases, model_cases
from ..models.segmented import SegmentedStage, segmented_stages
from ..models.stages import compiled_stages, training_stages
from ..planners.blocks import least_block_bytes
from ..planners.single_level import single_level
from ..profiling import profile
from .checkpointed import Checkpointed
from .compiled import (
    CompiledCandidate,
    build_compiled,
    compiled_candidates,
    fit_compiled,
    measured_step_peak_bytes,
    text_kinds,
    training_step,
)
from .step_in_backward import StepInBackward, shared_gradient_bytes
from .verify import three_budgets

__all__ = ["IN_BACKWARD", "REGISTRY_MODELS", "Step", "build_case", "in_backward", "setting_step"]

REGISTRY_MODELS = ("resnet18", "mobilenet_v2")
IN_BACKWARD = "+step_in_backward"   # a setting's kind with it: the optimizer stepped in the backward

Step = Callable[[], None]


def build_case(name: str, batch: int, image: int) -> tuple[Case, bool]:
    """The model, input and target named ``name``, and whether edgetrain should plan inside its stages.

    ``resnet18`` and ``mobilenet_v2`` take ``batch`` and ``image`` (10 classes); the cases of
    :mod:`edgetrain.models.cases` have their own inputs (planned inside their stages). ``MODEL@channels_last`` is
    that model with its weights and input batch in channels-last memory format (oneDNN's convolutions then work in
    their own layout, without the conversions that an NCHW convolution's backward allocates: scratch that the
    allocator's records count and a plan does not).

    Raises:
        EdgetrainError: an unknown model or memory format.
    """
    base, _, layout = name.partition("@")
    if layout:
        if layout != "channels_last":
            raise EdgetrainError(f"unknown memory format {layout!r} in {name!r}; known: channels_last")
        (model, x, y), blocks = build_case(base, batch, image)
        return (model.to(memory_format=torch.channels_last),  # type: ignore[call-overload]
                x.contiguous(memory_format=torch.channels_last), y), blocks
    if name in REGISTRY_MODELS:
        model = get_model_spec(name).build(10)
        return (model, torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))), False
    cases = {**model_cases(), **block_model_cases()}
    if name not in cases:
        raise EdgetrainError(f"unknown model {name!r}; known: {', '.join((*REGISTRY_MODELS, *cases))}")
    return cases[name](), True


def in_backward(setting: str) -> bool:
    """Whether ``setting`` steps its optimizer in the backward (another contract than a whole step's)."""
    return IN_BACKWARD in setting.partition(":")[0]


def _full_step(loss_step: Callable[[], Any], optimizer: torch.optim.Optimizer) -> Step:
    """``Checkpointed``'s training step as the other settings run theirs (:func:`~edgetrain.runtime.compiled.
    training_step`): its loss and backward, the optimizer, gradients freed."""
    def step() -> None:
        loss_step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _edgetrain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, setting: str, blocks: bool,
                    optimizer: torch.optim.Optimizer, match_step_bytes: int | None) -> tuple[Step, dict[str, Any]]:
    """The training step of ``Checkpointed`` for ``setting``, and what its plan predicts.

    A matched setting (``=inductor:B``) first plans at the chain's resident bytes plus inductor's measured step
    peak, then lowers the budget by what the measured step overshoots, up to four times: edgetrain's tensor
    accounting leaves out scratch memory inside a kernel (a convolution's unfolded columns) that the allocator's
    records include, and the comparison is on the records.
    """
    value = setting.partition(":")[2]
    compiled = setting.startswith("edgetrain+compile")
    blocks = blocks and not compiled   # a compiled stage is not traced: nothing to segment
    # the compiled stages profiled as Checkpointed(compile_stages=True) will run them; else the model itself
    stepping = in_backward(setting)
    chain = profile(nn.Sequential(*compiled_stages(training_stages(model))[:-1]) if compiled else model, x, y,
                    step_in_backward=stepping)

    def stepped(plain: Any, stages: list[nn.Module]) -> Any:   # the chain as the step runs it (Checkpointed
        # plans it so from the plain one)
        return plain.with_step_in_backward(shared_gradient_bytes(stages)) if stepping else plain

    least, twins = three_budgets(stepped(chain, training_stages(model)))[0], None
    if blocks:
        stages = segmented_stages(stages_of(model), x)
        twins = profile(nn.Sequential(*stages), x, y, step_in_backward=stepping)
        least = least_block_bytes(stepped(chain, training_stages(model)), stepped(twins, training_stages(
            nn.Sequential(*stages))), [isinstance(stage, SegmentedStage) for stage in stages] + [False])

    def planned(**request: Any) -> tuple[Checkpointed, Step]:
        wrapped = Checkpointed(model, sample=x, target=y, chain=chain, blocks=blocks, twins=twins,
                               compile_stages=compiled, **request,
                               step_in_backward=(lambda ps: make_optimizer("sgd", ps)) if stepping else None)
        if stepping:
            def step() -> None:
                wrapped.step_loss(x, y)
            return wrapped, step
        return wrapped, _full_step(lambda: wrapped.step_loss(x, y), optimizer)

    fits: list[int] = []
    budget: int | None = None   # the memory request planned at, where the setting asks for memory
    if match_step_bytes is not None:
        budget = max(least, chain.between_steps_bytes + match_step_bytes)
        for _ in range(4):
            wrapped, step = planned(memory=budget)
            step()
            fits.append(measured_step_peak_bytes(step))
            if fits[-1] <= match_step_bytes or budget == least:
                break
            budget = max(least, budget - (fits[-1] - match_step_bytes))
    elif value == "least":
        budget = least
        wrapped, step = planned(memory=budget)
    else:
        wrapped, step = planned(recompute=float(value))
    return step, {"between_steps_bytes": wrapped.chain.between_steps_bytes, "least_bytes": least,
                  "budget_bytes": budget, "gradients_bytes": chain.gradients_bytes,   # a whole step's floor
                  "predicted_step_peak_bytes": wrapped.plan.predicted_peak_bytes - wrapped.chain.between_steps_bytes,
                  "recompute_factor": (wrapped.block_plan or wrapped.plan).recompute_factor,  # inner recomputation too
                  "fit_step_peaks_bytes": fits}


def _regions_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
                  match_step_bytes: int, partitioner_budget: float) -> tuple[Step, dict[str, Any]]:
    """The whole model compiled once at ``activation_memory_budget = partitioner_budget``, with edgetrain's
    single-level plan as checkpoint regions inside it: inductor's min-cut decides what to save outside the
    regions, edgetrain's regions recompute whole stages (NOTE [ Checkpoint regions in one compiled graph ]).

    The candidates are :func:`edgetrain.runtime.compiled.compiled_candidates`' at this one budget (inductor's own
    graph at it, then up to three regions plans fitted to the measured step; NOTE [ A byte budget for
    torch.compile ]). Kept: the fastest within ``match_step_bytes``, else the one with the least peak.
    """
    chain = profile(model, x, y)
    tried = compiled_candidates(model, x, y, match_step_bytes, optimizer, chain=chain,
                                partitioner_budgets=(partitioner_budget,), regions_budget=partitioner_budget)
    fitted = [c for c in tried if c.step_peak_bytes <= match_step_bytes]
    chosen = (min(fitted, key=lambda c: c.step_cpu_s) if fitted else min(tried, key=lambda c: c.step_peak_bytes))
    return _whole_graph_step(model, x, y, optimizer, chain, chosen, tried)


def _compiled_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
                   match_step_bytes: int) -> tuple[Step, dict[str, Any]]:
    """:func:`~edgetrain.runtime.compiled.fit_compiled` at the matched budget: the fastest of inductor's own graphs
    at 1.0, 0.5 and 0.0 and edgetrain's regions fitted at 1.0 whose step fits."""
    chain = profile(model, x, y)
    fit = fit_compiled(model, x, y, chain.between_steps_bytes + match_step_bytes, optimizer, chain=chain)
    return _whole_graph_step(model, x, y, optimizer, chain, fit.chosen, fit.candidates)


def _whole_graph_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
                      chain: Any, chosen: CompiledCandidate, tried: list[CompiledCandidate],
                      ) -> tuple[Step, dict[str, Any]]:
    """The chosen whole-model candidate's step, and what is recorded of it and of every candidate."""
    kinds = chosen.regions or "." * chain.length
    stats = simulate(chain, single_level(text_kinds(kinds)))
    step = training_step(build_compiled(model, chosen), x, y, optimizer, nn.functional.cross_entropy)
    return step, {
        "between_steps_bytes": chain.between_steps_bytes, "least_bytes": three_budgets(chain)[0],
        "predicted_step_peak_bytes": stats.peak_bytes - chain.between_steps_bytes,
        "recompute_factor": stats.recompute_factor, "partitioner_budget": chosen.partitioner_budget,
        "single_level_kinds": kinds,
        "candidates": [{"kinds": c.regions or "." * chain.length, "partitioner_budget": c.partitioner_budget,
                        "step_tensor_peak_bytes": c.step_peak_bytes, "step_cpu_s": c.step_cpu_s} for c in tried]}


def _in_backward_step(model: nn.Module, run: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """Loss and backward of ``run`` (``model``, compiled or not) with one SGD per parameter of ``model`` stepped as
    its gradient is accumulated: the whole step."""
    StepInBackward([model], lambda ps: make_optimizer("sgd", ps), "sgd")   # the parameters' hooks keep it

    def step() -> None:
        nn.functional.cross_entropy(run(x), y).backward()
    return step


def setting_step(setting: str, name: str, batch: int, image: int,
                 match_step_bytes: int | None) -> tuple[Step, dict[str, Any]]:
    """The training step of ``setting`` on model ``name`` (one torch thread, seed 0, SGD with momentum), and what
    its plan predicts (nothing for eager and inductor).

    ``match_step_bytes`` is the tensor step peak of the inductor setting a matched one (``=inductor:B``) meets;
    ``None`` for the others. An ``inductor`` setting sets ``activation_memory_budget`` for the whole process: run
    one setting per process.

    Raises:
        EdgetrainError: a matched setting without ``match_step_bytes``, an unknown model.
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    (model, x, y), blocks = build_case(name, batch, image)
    optimizer = make_optimizer("sgd", model.parameters())
    kind, _, value = setting.partition(":")
    if kind in ("inductor", "inductor" + IN_BACKWARD):
        import torch._functorch.config as functorch_config
        functorch_config.activation_memory_budget = float(value)
        if kind == "inductor":
            return training_step(torch.compile(model), x, y, optimizer,  # type: ignore[arg-type]
                                 nn.functional.cross_entropy), {}
        return _in_backward_step(model, torch.compile(model), x, y), {}   # type: ignore[arg-type]
    if kind.startswith(("edgetrain+compiled", "edgetrain+regions")) and match_step_bytes is None:
        raise EdgetrainError(f"{setting!r} is matched to an inductor setting: give its step peak")
    if kind.startswith("edgetrain+compiled"):
        assert match_step_bytes is not None
        return _compiled_step(model, x, y, optimizer, match_step_bytes)
    if kind.startswith("edgetrain+regions"):
        assert match_step_bytes is not None
        partitioner_budget = float(kind.partition("@")[2].partition("=")[0] or 1.0)
        return _regions_step(model, x, y, optimizer, match_step_bytes, partitioner_budget)
    if kind.startswith("edgetrain"):
        return _edgetrain_step(model, x, y, setting, blocks, optimizer, match_step_bytes)
    return training_step(model, x, y, optimizer, nn.functional.cross_entropy), {}
