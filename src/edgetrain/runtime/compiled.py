"""The fastest compiled training step within a byte budget: inductor's own partitions and edgetrain's regions.

NOTE [ A byte budget for torch.compile ]
``torch.compile`` trades memory for time through one knob, ``activation_memory_budget``: a fraction,
not bytes, and not monotonic (ResNet-18 at 0.1 holds more than at 0.5). A node has bytes.
:func:`fit_compiled` turns a byte budget into a compiled step by measuring candidates:

* the whole model compiled at each of a few partitioner budgets (inductor's own min-cut graph:
  it recomputes single fused pointwise ops, which no stage-sized plan can);
* edgetrain's single-level plans as checkpoint regions inside one graph compiled at
  ``regions_budget`` (NOTE [ Checkpoint regions in one compiled graph ] in ``regions.py``), fitted
  to the budget: planned on the eager chain, then the budget moved by what the compiled step
  over- or undershoots, at most three plans (a compiled step saves more or less than the eager
  chain around the regions).

Each candidate is compiled, its tensor step peak read from the allocator's records, and a few
steps timed by the process's CPU clock (the wall clock counts other processes on a shared core).
The fastest whose chain-resident bytes (weights, optimizer state, batch) plus step peak fit the
budget wins, so the step is inductor's own graph wherever that is fastest and edgetrain's
regions where they are. The search trains: the weights and optimizer state are put back after it.
Each candidate is a full compilation (seconds for a small model, minutes for a large one on a slow
core): a plan to make once per model, input shape and budget.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.chain import Chain
from ..core.simulator import simulate
from ..errors import InfeasibleBudgetError
from ..models import stages_of
from ..models.stages import LossFn
from ..planners.single_level import KEPT, single_level, single_level_plan
from ..profiling import profile
from ..profiling.process import return_freed_memory
from ..profiling.tracker import allocator_window
from ..units import format_bytes, parse_bytes
from .regions import Regions
from .verify import three_budgets

__all__ = ["CompiledCandidate", "CompiledStep", "fit_compiled", "compiled_candidates", "build_compiled",
           "measured_step_peak_bytes", "kind_text", "text_kinds", "training_step"]

TIMED_STEPS = 3


@dataclass(frozen=True)
class CompiledCandidate:
    """One compiled step measured: the partitioner budget it was compiled at, edgetrain's regions in it
    (:func:`kind_text`; None for the model's own graph), its tensor step peak and median CPU seconds a step."""

    partitioner_budget: float
    regions: str | None
    step_peak_bytes: int
    step_cpu_s: float


@dataclass
class CompiledStep:
    """The chosen compiled model (call it in the training loop as the model), with what the search measured."""

    module: nn.Module
    chosen: CompiledCandidate
    candidates: list[CompiledCandidate]
    between_steps_bytes: int
    budget_bytes: int

    @property
    def predicted_peak_bytes(self) -> int:
        """The step's tensor peak as measured in the search, with what lives between steps
        (``Chain.between_steps_bytes``)."""
        return self.between_steps_bytes + self.chosen.step_peak_bytes


class _PartitionedAt(nn.Module):
    """A compiled module that compiles (on first call, and on any recompilation) at one partitioner budget:
    ``activation_memory_budget`` is a process-wide setting, read when a graph is compiled."""

    def __init__(self, compiled: nn.Module, partitioner_budget: float) -> None:
        super().__init__()
        self.compiled, self.partitioner_budget = compiled, partitioner_budget

    def forward(self, *args: Any) -> Any:
        with _partitioner_budget(self.partitioner_budget):
            return self.compiled(*args)


@contextmanager
def _partitioner_budget(budget: float) -> Iterator[None]:
    import torch._functorch.config as functorch_config
    with functorch_config.patch(activation_memory_budget=budget):
        yield


def kind_text(kinds: tuple[int, ...] | list[int]) -> str:
    """A single-level plan as text: ``.`` a kept stage, ``S`` one that opens a region, ``R`` one that continues it."""
    return "".join(".SR"[kind] for kind in kinds)


def text_kinds(text: str) -> list[int]:
    """The single-level plan :func:`kind_text` wrote as ``text``."""
    return [".SR".index(kind) for kind in text]


def measured_step_peak_bytes(step: Callable[[], None]) -> int:
    """The most tensor bytes one ``step()`` held above its starting point, by the c10 allocator's records."""
    with allocator_window() as window:
        step()
    return window.peak_bytes


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
                  loss_fn: LossFn) -> Callable[[], None]:
    """One step as a training loop runs it: loss and backward, the optimizer, gradients freed."""
    def step() -> None:
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _step_cpu_s(step: Callable[[], None]) -> float:
    """CPU seconds of one step, every thread of the process (inductor's kernels run on torch's thread pool)."""
    start = time.process_time()
    step()
    return time.process_time() - start


def fit_compiled(model: nn.Module, x: torch.Tensor, y: torch.Tensor, memory: int | str,
                 optimizer: torch.optim.Optimizer, *, loss_fn: LossFn | None = None,
                 partitioner_budgets: tuple[float, ...] = (1.0, 0.5, 0.0), regions_budget: float = 1.0,
                 chain: Chain | None = None) -> CompiledStep:
    """The fastest compiled step of ``model`` on ``(x, y)`` within ``memory`` (NOTE [ A byte budget for
    torch.compile ]).

    Args:
        model: any model :func:`~edgetrain.models.stages_of` turns into stages, in train mode.
        memory: the step's tensor peak allowed, with the weights, optimizer state and batch it holds
            anyway, as ``Checkpointed(memory=...)`` takes it: bytes or text (``"300MiB"``).
        optimizer: the optimizer the loop will step (its state is part of the step and the budget; the
            chain counts it as SGD with momentum unless ``chain`` is given).
        partitioner_budgets: the ``activation_memory_budget`` values inductor's own graph is tried at.
        regions_budget: the partitioner budget edgetrain's regions are compiled at.
        chain: the model's profiled chain (for its resident bytes and the regions' plans), if at hand.

    Raises:
        InfeasibleBudgetError: no candidate fits; the message names the least total a candidate measured.
    """
    budget = parse_bytes(memory) if isinstance(memory, str) else memory
    chain = chain if chain is not None else profile(model, x, y, loss_fn=loss_fn)
    step_budget = budget - chain.between_steps_bytes
    candidates = compiled_candidates(model, x, y, step_budget, optimizer, loss_fn=loss_fn, chain=chain,
                                     partitioner_budgets=partitioner_budgets, regions_budget=regions_budget)
    fitting = [c for c in candidates if c.step_peak_bytes <= step_budget]
    if not fitting:
        least = min(candidates, key=lambda c: c.step_peak_bytes)
        raise InfeasibleBudgetError(
            f"{format_bytes(budget)} is below every compiled step of {type(model).__name__}: the least measured "
            f"needs {format_bytes(chain.between_steps_bytes + least.step_peak_bytes)} ({_describe(least)}); give "
            f"at least that, or train uncompiled (Checkpointed) below it",
            minimum_bytes=chain.between_steps_bytes + least.step_peak_bytes, budget_bytes=budget)
    chosen = min(fitting, key=lambda c: c.step_cpu_s)
    return CompiledStep(build_compiled(model, chosen), chosen, candidates, chain.between_steps_bytes, budget)


def compiled_candidates(model: nn.Module, x: torch.Tensor, y: torch.Tensor, step_budget: int,
                        optimizer: torch.optim.Optimizer, *, loss_fn: LossFn | None = None,
                        partitioner_budgets: tuple[float, ...] = (1.0, 0.5, 0.0), regions_budget: float = 1.0,
                        chain: Chain | None = None) -> list[CompiledCandidate]:
    """Every candidate of :func:`fit_compiled`, measured, for a step peak of ``step_budget`` (above the chain's
    resident bytes); the weights and optimizer state are put back afterwards."""
    loss = loss_fn if loss_fn is not None else nn.functional.cross_entropy
    chain = chain if chain is not None else profile(model, x, y, loss_fn=loss_fn)
    weights, optimizer_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    try:
        candidates = [_measure(model, x, y, optimizer, loss, b, None) for b in partitioner_budgets]
        return candidates + _fitted_regions(model, x, y, optimizer, loss, chain, step_budget, regions_budget)
    finally:
        model.load_state_dict(weights)
        optimizer.load_state_dict(optimizer_state)
        torch._dynamo.reset()   # the candidates' code: the budget is not among dynamo's guards
        return_freed_memory()   # the compilations' garbage, back to the kernel before training


def _describe(candidate: CompiledCandidate) -> str:
    plan = "inductor's own graph" if candidate.regions is None else f"regions {candidate.regions}"
    return f"{plan} at partitioner budget {candidate.partitioner_budget}"


def build_compiled(model: nn.Module, candidate: CompiledCandidate) -> nn.Module:
    """The candidate's module, compiled afresh (on its first call) at its partitioner budget."""
    if candidate.regions is None:
        target: nn.Module = model
    else:
        target = Regions(stages_of(model), text_kinds(candidate.regions)[:-1])
    return _PartitionedAt(torch.compile(target), candidate.partitioner_budget)  # type: ignore[arg-type]


def _measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
             partitioner_budget: float, regions: str | None) -> CompiledCandidate:
    """Compile one candidate, then measure its step's tensor peak and time it (the first step compiles)."""
    torch._dynamo.reset()   # else another budget's compiled code is reused: the budget is not in dynamo's guards
    candidate = CompiledCandidate(partitioner_budget, regions, 0, 0.0)
    step = training_step(build_compiled(model, candidate), x, y, optimizer, loss_fn)
    step()
    peak = measured_step_peak_bytes(step)
    return CompiledCandidate(partitioner_budget, regions, peak,
                             statistics.median(_step_cpu_s(step) for _ in range(TIMED_STEPS)))


def _fitted_regions(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
                    loss_fn: LossFn, chain: Chain, step_budget: int, partitioner_budget: float,
                    ) -> list[CompiledCandidate]:
    """Up to three regions plans fitted to ``step_budget``: the first planned on the eager chain at it, then the
    plan's budget moved by what the compiled step over- or undershoots (down below the plan's own predicted
    peak by an overshoot, so that the plan changes; up by an undershoot; halfway once both a fitting and an
    overshooting budget are known)."""
    least, _, keep_all_bytes = three_budgets(chain)
    plan_budget = min(max(least, chain.between_steps_bytes + step_budget), keep_all_bytes - 1)
    measured: dict[str, CompiledCandidate] = {}
    fitting: list[int] = []
    over: list[int] = []
    for _ in range(3):
        try:
            kinds = single_level_plan(chain, plan_budget)
        except InfeasibleBudgetError:   # below what a single level reaches
            break
        text = kind_text(kinds)
        if all(kind == KEPT for kind in kinds):   # inductor's own graph, tried already
            break
        if text not in measured:
            measured[text] = _measure(model, x, y, optimizer, loss_fn, partitioner_budget, text)
        peak = measured[text].step_peak_bytes
        (fitting if peak <= step_budget else over).append(plan_budget)
        if fitting and over:
            plan_budget = (max(fitting) + min(over)) // 2
        elif fitting:
            plan_budget = min(plan_budget + step_budget - peak, keep_all_bytes - 1)
        else:
            predicted = simulate(chain, single_level(kinds)).peak_bytes
            plan_budget = max(least, min(plan_budget, predicted) - (peak - step_budget))
        if plan_budget in (*fitting, *over):   # no budget left to try
            break
    return list(measured.values())
