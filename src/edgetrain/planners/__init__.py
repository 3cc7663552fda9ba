"""Checkpointing planners: pure functions from a chain and a budget to a :class:`~edgetrain.schedule.Schedule`.

``uniform(chain, segments)`` is PyTorch's ``checkpoint_sequential``, ``revolve(chain, slots)``
binomial checkpointing (Griewank & Walther 2000), ``optimal(chain, memory_bytes)`` the dynamic
programme for heterogeneous chains (Beaumont et al. 2019); ``plan`` picks among them.
"""

from .optimal import OptimalTable, optimal, solve
from .plan import STRATEGIES, Candidate, Plan, plan
from .revolve import revolve, revolve_advances
from .uniform import uniform

__all__ = ["uniform", "revolve", "revolve_advances", "optimal", "solve", "OptimalTable", "plan", "Plan",
           "Candidate", "STRATEGIES", "REGISTRY"]

REGISTRY = {"uniform": uniform, "revolve": revolve, "optimal": optimal}
