"""Pick the least-energy schedule on a device for a memory budget and, optionally, a deadline.

The counterpart of :func:`~edgetrain.planners.plan` for the energy objective of POET (Patil et
al., ICML 2022): the chain's stage times must be the device's (:func:`edgetrain.costs.energy.scale_chain`),
and every candidate is priced by :func:`~edgetrain.core.simulator.simulate` with the device's
:class:`~edgetrain.costs.energy.EnergyProfile`, so all strategies are compared on the same oracle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.chain import Chain
from ..core.schedule import Schedule, keep_all
from ..core.simulator import Stats, simulate
from ..costs.energy import EnergyProfile, scale_chain
from ..costs.timemodel import HostCalibration, training_rate
from ..errors import EdgetrainError, InfeasibleBudgetError, UnknownNameError
from ..units import parse_bytes
from .choose import beside_generator_states, plan, sequential_baseline
from .dp.optimal import solve
from .dp.paging import paging_dp

if TYPE_CHECKING:
    from ..devices import Device
    from .milp.strategy import MilpPlan

__all__ = ["EnergyPlan", "plan_energy", "ENERGY_STRATEGIES", "EnergyReport", "energy_report", "deadline_seconds"]

ENERGY_STRATEGIES = ("paging-dp", "recompute", "paging-only", "capuchin")


@dataclass(frozen=True)
class EnergyPlan:
    """The chosen schedule on a device, what it costs there, and how long planning took."""

    schedule: Schedule
    stats: Stats
    device: str
    budget_bytes: int
    deadline_s: float | None
    solve_time_s: float
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        return self.schedule.strategy

    @property
    def deadline_met(self) -> bool:
        return self.deadline_s is None or self.stats.time_s <= self.deadline_s * (1 + 1e-12)

    def to_dict(self) -> dict[str, object]:
        stats = self.stats
        return {"strategy": self.strategy, "params": self.schedule.params, "device": self.device,
                "predicted_peak_bytes": stats.peak_bytes, "predicted_time_s": stats.time_s,
                "recompute_factor": stats.recompute_factor, "forward_advances": stats.forward_advances,
                "energy_j": stats.energy_j, "energy_compute_j": stats.energy_compute_j,
                "energy_pagein_j": stats.energy_pagein_j, "energy_pageout_j": stats.energy_pageout_j,
                "paged_out_bytes": stats.pageout_bytes, "peak_disk_bytes": stats.peak_disk_bytes,
                "budget_bytes": self.budget_bytes, "deadline_s": self.deadline_s, "deadline_met": self.deadline_met,
                "solve_time_s": self.solve_time_s, **self.extra}


def _recompute_only(chain: Chain, profile: EnergyProfile, budget: int, slots: int) -> Schedule:
    everything = keep_all(chain.length)
    if simulate(chain, everything).peak_bytes <= budget:
        return Schedule(everything.ops, chain.length, strategy="recompute", params={"recompute": False})
    try:
        schedule = solve(chain, budget, slots=slots).schedule(budget)
    except InfeasibleBudgetError:   # the grid can round every schedule away near the least: plan() answers from it
        schedule = plan(chain, memory=budget, strategy="optimal").schedule
    return Schedule(schedule.ops, chain.length, strategy="recompute", params=schedule.params)


def _paging(recompute: bool) -> Callable[[Chain, EnergyProfile, int, float | None, int], Schedule]:
    """The DP's schedule, or keep-all where it fits (the grid's rounding can keep the table off it)."""
    def build(chain: Chain, profile: EnergyProfile, budget: int, deadline_s: float | None, slots: int) -> Schedule:
        name = "paging-dp" if recompute else "paging-only"
        everything = keep_all(chain.length)
        stats = simulate(chain, everything, profile)
        if stats.peak_bytes <= budget and (deadline_s is None or stats.time_s <= deadline_s):
            return Schedule(everything.ops, chain.length, strategy=name, params={"paging": False, "recompute": False})
        result = paging_dp(chain, profile, budget, deadline_s=deadline_s, slots=slots, recompute=recompute)
        return Schedule(result.schedule.ops, chain.length, strategy=name, params=result.schedule.params)
    return build


def _capuchin(chain: Chain, profile: EnergyProfile, budget: int, deadline_s: float | None, slots: int) -> Schedule:
    from .capuchin import capuchin

    return capuchin(chain, profile, budget)


_BUILDERS: dict[str, Callable[[Chain, EnergyProfile, int, float | None, int], Schedule]] = {
    "paging-dp": _paging(True),
    "paging-only": _paging(False),
    "recompute": lambda chain, profile, budget, deadline_s, slots: _recompute_only(chain, profile, budget, slots),
    "capuchin": _capuchin,
}


def plan_energy(chain: Chain, profile: EnergyProfile, memory: int | str, *, deadline_s: float | None = None,
                strategy: str = "paging-dp", slots: int = 2000) -> EnergyPlan:
    """The least-energy schedule of ``strategy`` within ``memory`` (and ``deadline_s``) on a device.

    Args:
        chain: the cost model with the device's stage times (see :func:`edgetrain.costs.energy.scale_chain`).
        profile: the device's energy profile.
        memory: the whole peak allowed, bytes or text such as ``"512MiB"``.
        deadline_s: the longest step time allowed (compute plus serial paging), or None.
        strategy: ``"paging-dp"`` (recompute + paging, least energy), ``"recompute"`` (the
            ``optimal`` DP, no paging), ``"paging-only"`` (no recomputation) or ``"capuchin"``
            (greedy: swap first, recompute when a swap cannot hide).
        slots: memory units of the DP tables.

    Returns:
        An :class:`EnergyPlan`; ``deadline_met`` is False when no schedule of the strategy
        meets the deadline (the fastest one found is returned).

    Raises:
        InfeasibleBudgetError: nothing of the strategy fits; ``minimum_bytes`` says what would.
        UnknownNameError: an unknown strategy.
    """
    if strategy not in _BUILDERS:
        raise UnknownNameError("strategy", strategy, ENERGY_STRATEGIES)
    budget = parse_bytes(memory)
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError(f"the deadline must be > 0 s, got {deadline_s}")
    start = time.perf_counter()
    schedule = beside_generator_states(
        chain, budget, lambda lowered: _BUILDERS[strategy](chain, profile, lowered, deadline_s, slots),
        f"strategy {strategy!r}")
    elapsed = time.perf_counter() - start
    return EnergyPlan(schedule, simulate(chain, schedule, profile), profile.device_name, budget, deadline_s, elapsed)


def deadline_seconds(deadline: str, base_time_s: float) -> float:
    """A deadline as written on the command line, in seconds.

    Args:
        deadline: ``"1.2"``, a factor of ``base_time_s``; ``"3.5s"``, seconds.
        base_time_s: the step without recomputation or paging on the device.

    Raises:
        EdgetrainError: not a number, not finite and > 0, or a factor below 1.
    """
    text = deadline.strip().lower()
    try:
        value = float(text[:-1]) if text.endswith("s") else float(text)
    except ValueError:
        raise EdgetrainError(f"--deadline must be a factor like 1.2 or seconds like 3.5s, got {deadline!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise EdgetrainError(f"--deadline must be a finite number > 0, got {deadline!r}")
    if text.endswith("s"):
        return value
    if value < 1:
        raise EdgetrainError(f"a --deadline factor below 1 ({deadline}) is faster than a step without recomputation")
    return value * base_time_s


@dataclass(frozen=True)
class EnergyReport:
    """An energy plan on a device beside what it saves: the recompute-only optimum and ``checkpoint_sequential``.

    ``chain`` is the chain with the device's stage times, the one the plan's schedule runs on.
    """

    plan: EnergyPlan | MilpPlan
    chain: Chain
    recompute_only_energy_j: float | None
    baseline: dict[str, object] | None

    def to_dict(self) -> dict[str, object]:
        return {**self.plan.to_dict(), "recompute_only_energy_j": self.recompute_only_energy_j,
                "baseline": self.baseline}


def energy_report(chain: Chain, device: Device, memory: int | str, *, deadline: str | None = None,
                  strategy: str = "auto", host: HostCalibration | None = None) -> EnergyReport:
    """The least-energy plan of ``chain`` on ``device`` (``edgetrain plan --objective energy``), compared.

    Args:
        chain: the cost model (any stage times: they are scaled to the device's).
        device: the device whose power and storage figures price the plan.
        memory: the whole peak allowed, bytes or text such as ``"512MiB"``.
        deadline: the longest step, as :func:`deadline_seconds` reads it; None for none.
        strategy: ``"auto"`` (= ``"paging-dp"``), one of :data:`ENERGY_STRATEGIES`, or ``"milp"``
            (POET's MILP, :func:`~edgetrain.planners.milp.strategy.plan_milp`).
        host: this machine's calibration, needed by a device whose training rate is calibrated
            (NOTE [ One time model ]).

    Returns:
        An :class:`EnergyReport`; ``recompute_only_energy_j`` is None when recomputation alone
        cannot fit the plan's budget, ``baseline`` when no ``checkpoint_sequential`` segmentation does.

    Raises:
        InfeasibleBudgetError: nothing of the strategy fits.
        EdgetrainError: a malformed deadline; the MILP without HiGHS.
    """
    profile = EnergyProfile.from_device(device, training_rate(device, host))
    device_chain = scale_chain(chain, profile)
    deadline_s = None if deadline is None else deadline_seconds(deadline, device_chain.compute_time_s)
    name = "paging-dp" if strategy == "auto" else strategy
    if name == "milp":
        from .milp.strategy import plan_milp

        chosen: MilpPlan | EnergyPlan = plan_milp(device_chain, profile, memory, deadline_s=deadline_s)
    else:
        chosen = plan_energy(device_chain, profile, memory, deadline_s=deadline_s, strategy=name)
    try:
        recompute_only: float | None = plan_energy(device_chain, profile, chosen.budget_bytes,
                                                   strategy="recompute").stats.energy_j
    except InfeasibleBudgetError:
        recompute_only = None
    baseline = sequential_baseline(device_chain, chosen.budget_bytes)
    return EnergyReport(chosen, device_chain, recompute_only, None if baseline is None else baseline.to_dict())
