"""``edgetrain plan --strategy milp``: POET's MILP on a chain's training graph, reported like the other plans.

The MILP (:mod:`edgetrain.planners.milp.solve`) decides per node and step on its own graph model
(Checkmate's, extended with paging); its schedule is checked by that module's replay and turned
into executor ops by :func:`~edgetrain.planners.milp.ops.milp_schedule` where the ops can express
it (:attr:`MilpPlan.schedule`; otherwise ``to_dict()["schedule_error"]`` says why). It is solved
with ``read_back_once`` (a page-in consumes the copy on flash, as the executor pages). The two
models still differ on general chains: the MILP's lets a backward use a recomputed copy of a saved
input without re-recording the stage (autograd cannot run that; the conversion refuses it), and
it pages a stage's record as a whole, where ``paging-dp`` pages the record's internals and its
input apart. On chains whose records hold only their output the two coincide and reach the same
optimum (``tests/test_planner_milp_crosscheck.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ...core.chain import Chain
from ...core.schedule import Schedule
from ...core.simulator import simulate
from ...costs.energy import EnergyProfile
from ...errors import EdgetrainError
from ...units import parse_bytes
from ..choose import beside_generator_states
from .graph import chain_training_graph
from .solve import MilpResult, milp

__all__ = ["MilpPlan", "plan_milp"]


@dataclass(frozen=True)
class MilpPlan:
    """A solved MILP with the keys of :meth:`~edgetrain.planners.energy_plan.EnergyPlan.to_dict`."""

    result: MilpResult
    device: str
    budget_bytes: int
    compute_time_s: float
    chain: Chain | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def _converted(self) -> tuple[Schedule | None, str | None]:
        if self.chain is None:
            return None, "no chain to convert the MILP's decisions on"
        from .ops import milp_schedule

        try:
            return milp_schedule(self.chain, self.result), None
        except EdgetrainError as exc:
            return None, str(exc)

    @property
    def schedule(self) -> Schedule | None:
        """The executor ops of the MILP's decisions (:func:`~edgetrain.planners.milp.ops.milp_schedule`),
        or None where they cannot express them (the reason is ``to_dict()["schedule_error"]``)."""
        return self._converted[0]

    def to_dict(self) -> dict[str, object]:
        """The MILP's own figures; with a converted schedule, the peak is the simulator's of those ops."""
        r = self.result
        schedule = self.schedule
        peak = r.peak_bytes if schedule is None or self.chain is None else simulate(self.chain, schedule).peak_bytes
        return {"strategy": "milp", "params": {"status": r.status, "mip_gap": r.mip_gap, "n_variables": r.n_variables,
                                               "n_constraints": r.n_constraints},
                "device": self.device, "predicted_peak_bytes": peak, "milp_peak_bytes": r.peak_bytes,
                "predicted_time_s": r.time_s,
                "recompute_factor": r.time_s / self.compute_time_s if self.compute_time_s > 0 else 1.0,
                "forward_advances": None, "energy_j": r.energy_j, "energy_compute_j": r.energy_compute_j,
                "energy_pagein_j": r.energy_pagein_j, "energy_pageout_j": r.energy_pageout_j,
                "paged_out_bytes": None, "peak_disk_bytes": None, "budget_bytes": self.budget_bytes,
                "deadline_s": r.deadline_s,
                "deadline_met": r.deadline_s is None or r.time_s <= r.deadline_s * (1 + 1e-9),
                "solve_time_s": r.solve_time_s, "mip_gap": r.mip_gap, "status": r.status,
                "schedule_error": self._converted[1]}


def plan_milp(chain: Chain, profile: EnergyProfile, memory: int | str, *, deadline_s: float | None = None,
              time_limit_s: float = 60.0) -> MilpPlan:
    """Solve POET's MILP on ``chain`` (device times, see :func:`edgetrain.costs.energy.scale_chain`) within ``memory``.

    Raises:
        InfeasibleBudgetError: the budget is below the graph's least feasible peak.
    """
    budget = parse_bytes(memory)
    graph = chain_training_graph(chain, profile)
    result = beside_generator_states(chain, budget, lambda lowered: milp(
        graph, lowered, deadline_s=deadline_s, time_limit_s=time_limit_s, read_back_once=True), "the MILP")
    return MilpPlan(result, profile.device_name, budget, chain.compute_time_s, chain=chain)
