"""Paging workloads shared by the paging tests and the paged step-time benchmark: models at sizes where activations
matter next to the weights, paging added by hand to a schedule, and a step timer.

:func:`with_paging` pages each chosen value out over every gap between the ops that use it (right after an op that
leaves it alive, back in just before the next op that needs it in RAM), so a paged schedule can be built from
keep-all or uniform checkpointing without a planner. :func:`host_paging_profile` prices paging at the throughput a
step actually measured, so the simulator's serial paging time is what that step would take without overlap.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..core.chain import Chain
from ..core.schedule import Backward, Forward, Op, PageIn, PageOut, Schedule
from ..core.simulator import simulate
from ..costs.energy import EnergyProfile
from ..errors import ScheduleError
from ..models import get_model_spec
from ..profiling import profile
from .executor import Executor
from .pager import PagingStats

__all__ = ["SIZES", "PagingCase", "case", "host_paging_profile", "median_step_s", "with_paging"]

#: (batch, image side or sequence length) per model: activations large enough to matter next to the weights.
SIZES: dict[str, tuple[int, int]] = {"resnet18": (8, 96), "transformer_small": (16, 64)}


@dataclass
class PagingCase:
    """A model of :data:`SIZES` (10 classes, seeded), its batch and targets, and its chain (sizes, no times)."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    chain: Chain

    def fresh_model(self) -> nn.Module:
        """A copy of the model with the same weights, to train without touching the cached one."""
        return copy.deepcopy(self.model)


@functools.cache
def case(name: str) -> PagingCase:
    """The paging case of model ``name`` (a key of :data:`SIZES`), built once per process."""
    spec = get_model_spec(name)
    batch, size = SIZES[name]
    torch.manual_seed(0)
    model = spec.build(num_classes=10)
    x, y = spec.example_input(batch, size), spec.example_target(batch, num_classes=10)
    return PagingCase(model, x, y, profile(model, x, y, measure_time=False))


def _needs_in_ram(op: Op, k: int, chain: Chain) -> bool:
    """Whether ``op`` reads ``x_k`` from RAM (a forward of stage k, or a backward whose record kept it)."""
    if isinstance(op, Forward):
        return op.stage == k
    if isinstance(op, Backward):
        return ((op.stage == k and chain.stages[k].input_saved)
                or (op.stage == k - 1 and chain.stages[k - 1].output_saved))
    return False


def _touches_value(op: Op, k: int) -> bool:
    return isinstance(op, (Forward, Backward)) and op.stage in (k - 1, k)


def with_paging(schedule: Schedule, chain: Chain, values: Sequence[int]) -> Schedule:
    """``schedule`` with each of ``values`` paged out over every gap between the ops that use it.

    A gap starts after an op on stage ``k - 1`` or ``k`` and ends at the next op that needs
    ``x_k`` in RAM; a gap where the value is dead, or where paging would not simulate, is left alone.
    """
    ops = list(schedule.ops)
    for k in values:
        at = 0
        while at < len(ops):
            if not _touches_value(ops[at], k):
                at += 1
                continue
            later = [b for b in range(at + 1, len(ops)) if _touches_value(ops[b], k)]
            if (not later or not _needs_in_ram(ops[later[0]], k, chain)
                    or not any(isinstance(op, (Forward, Backward)) for op in ops[at + 1:later[0]])):
                at += 1
                continue
            trial = [*ops[:at + 1], PageOut(k), *ops[at + 1:later[0]], PageIn(k), *ops[later[0]:]]
            try:
                simulate(chain, Schedule(tuple(trial), schedule.length))
            except ScheduleError:
                at += 1
                continue
            ops, at = trial, later[0] + 2
    return Schedule(tuple(ops), schedule.length, strategy=f"{schedule.strategy}+paging")


def median_step_s(executor: Executor, c: PagingCase, model: nn.Module, repeats: int = 3) -> float:
    """The median wall seconds of ``repeats`` executor steps on the case's batch, gradients reset after each."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        executor.step(c.x, c.y)
        samples.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return sorted(samples)[len(samples) // 2]


def host_paging_profile(stats: PagingStats) -> EnergyProfile:
    """A profile whose page-out and page-in rates are those ``stats`` measured (compute and powers are placeholders:
    only the simulated paging time means anything)."""
    return EnergyProfile("host", 1e9, 1.0, 1e-6, stats.bytes_read / max(stats.read_s, 1e-9), 1.0,
                         1e-6, stats.bytes_written / max(stats.write_s, 1e-9), 1.0)
