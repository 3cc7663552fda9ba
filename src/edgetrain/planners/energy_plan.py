"""Pick the least-energy schedule on a device for a memory budget and, optionally, a deadline.

The counterpart of :func:`~edgetrain.planners.plan` for the energy objective of POET (Patil et
al., ICML 2022): the chain's stage times must be the device's (:func:`edgetrain.energy.scale_chain`),
and every candidate is priced by :func:`~edgetrain.schedule.simulate` with the device's
:class:`~edgetrain.energy.EnergyProfile`, so all strategies are compared on the same oracle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..chain import Chain
from ..energy import EnergyProfile
from ..errors import InfeasibleBudgetError, UnknownNameError
from ..schedule import Schedule, Stats, keep_all, simulate
from ..units import format_bytes, parse_bytes
from .optimal import solve
from .paging import paging_dp

__all__ = ["EnergyPlan", "plan_energy", "ENERGY_STRATEGIES"]

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
    schedule = solve(chain, budget, slots=slots).schedule(budget)
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
        chain: the cost model with the device's stage times (see :func:`edgetrain.energy.scale_chain`).
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
    try:
        schedule = _BUILDERS[strategy](chain, profile, budget, deadline_s, slots)
    except InfeasibleBudgetError as exc:
        minimum = exc.minimum_bytes
        raise InfeasibleBudgetError(
            f"budget {format_bytes(budget)} ({budget} bytes) is below what strategy {strategy!r} can fit for "
            f"{chain.name or 'this chain'}"
            + (f": at least {format_bytes(minimum)} ({minimum} bytes)" if minimum else ""),
            minimum_bytes=minimum, budget_bytes=budget) from exc
    elapsed = time.perf_counter() - start
    return EnergyPlan(schedule, simulate(chain, schedule, profile), profile.device_name, budget, deadline_s, elapsed)
