"""``edgetrain plan --strategy milp``: POET's MILP on a chain's training graph, reported like the other plans.

The MILP (:mod:`edgetrain.planners.milp`) decides per node and step on its own graph model
(Checkmate's, extended with paging); its schedule is checked by that module's replay, not by
:func:`~edgetrain.schedule.simulate`, and is not yet turned into executor ops. The two models
differ: the MILP's lets a backward use a recomputed copy of a saved input without re-recording
the stage (autograd cannot run that), while it pages a stage's record only as a whole, where
``paging-dp`` pages the record's internals and its input apart. On chains where records hold
only their input and output the MILP's model is the looser one and its energy a lower bound on
``paging-dp``'s (``tests/test_planner_milp_crosscheck.py``); on real ResNet chains either may win.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..chain import Chain
from ..energy import EnergyProfile
from ..units import parse_bytes
from .milp import MilpResult, chain_training_graph, milp

__all__ = ["MilpPlan", "plan_milp"]


@dataclass(frozen=True)
class MilpPlan:
    """A solved MILP with the keys of :meth:`~edgetrain.planners.energy_plan.EnergyPlan.to_dict`."""

    result: MilpResult
    device: str
    budget_bytes: int
    compute_time_s: float

    @property
    def schedule(self) -> None:
        """No executor schedule: the MILP's decisions live on its own graph (see the module docstring)."""
        return None

    def to_dict(self) -> dict[str, object]:
        r = self.result
        return {"strategy": "milp", "params": {"status": r.status, "mip_gap": r.mip_gap, "n_variables": r.n_variables,
                                               "n_constraints": r.n_constraints},
                "device": self.device, "predicted_peak_bytes": r.peak_bytes, "predicted_time_s": r.time_s,
                "recompute_factor": r.time_s / self.compute_time_s if self.compute_time_s > 0 else 1.0,
                "forward_advances": None, "energy_j": r.energy_j, "energy_compute_j": r.energy_compute_j,
                "energy_pagein_j": r.energy_pagein_j, "energy_pageout_j": r.energy_pageout_j,
                "paged_out_bytes": None, "peak_disk_bytes": None, "budget_bytes": self.budget_bytes,
                "deadline_s": r.deadline_s,
                "deadline_met": r.deadline_s is None or r.time_s <= r.deadline_s * (1 + 1e-9),
                "solve_time_s": r.solve_time_s, "mip_gap": r.mip_gap, "status": r.status}


def plan_milp(chain: Chain, profile: EnergyProfile, memory: int | str, *, deadline_s: float | None = None,
              time_limit_s: float = 60.0) -> MilpPlan:
    """Solve POET's MILP on ``chain`` (device times, see :func:`edgetrain.energy.scale_chain`) within ``memory``.

    Raises:
        InfeasibleBudgetError: the budget is below the graph's least feasible peak.
    """
    budget = parse_bytes(memory)
    result = milp(chain_training_graph(chain, profile), budget, deadline_s=deadline_s, time_limit_s=time_limit_s)
    return MilpPlan(result, profile.device_name, budget, chain.compute_time_s)
