"""Planners: pure functions from a chain and a budget to a :class:`~edgetrain.core.schedule.Schedule`.

``uniform(chain, segments)`` is PyTorch's ``checkpoint_sequential``, ``revolve(chain, slots)``
binomial checkpointing (Griewank & Walther 2000), ``optimal(chain, memory_bytes)`` the dynamic
programme for heterogeneous chains (Beaumont et al. 2019); ``plan`` picks among them for time.
For energy on a device: ``paging_dp`` adds paging to storage to the DP (POFO/POET),
``capuchin`` is a greedy baseline, ``plan_energy`` picks among them.
"""

from .capuchin import capuchin
from .choose import STRATEGIES, Candidate, Plan, plan
from .dp.optimal import OptimalTable, optimal, solve
from .dp.paging import CostWeights, PagingTable, paging_dp, solve_paging
from .energy_plan import ENERGY_STRATEGIES, EnergyPlan, plan_energy
from .revolve import revolve, revolve_advances
from .uniform import uniform

__all__ = ["uniform", "revolve", "revolve_advances", "optimal", "solve", "OptimalTable", "plan", "Plan",
           "Candidate", "STRATEGIES", "REGISTRY", "paging_dp", "solve_paging", "PagingTable", "CostWeights",
           "capuchin", "plan_energy", "EnergyPlan", "ENERGY_STRATEGIES"]

REGISTRY = {"uniform": uniform, "revolve": revolve, "optimal": optimal, "paging-dp": paging_dp,
            "capuchin": capuchin}
