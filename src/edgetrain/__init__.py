"""edgetrain: make deep-learning training fit and run well on small edge machines.

Profile a model into a :class:`Chain` of stage costs, plan a checkpointing :class:`Schedule`
for a memory budget or a recompute factor, simulate it, and run it.
"""

from .chain import Chain, StageCost
from .errors import EdgetrainError, InfeasibleBudgetError, ScheduleError, UnknownNameError
from .planners import Plan, plan
from .profile import estimate_memory, measure_training_step, profile
from .runtime import Checkpointed, Executor, run_schedule
from .schedule import Backward, Discard, Forward, Keep, PageIn, PageInRecord, PageOut, PageOutRecord, Schedule, Stats, keep_all, simulate, validate
from .units import format_bytes, parse_bytes

__version__ = "0.1.0"

__all__ = [
    "Chain", "StageCost", "Schedule", "Stats", "Forward", "Backward", "Discard", "Keep", "PageOut", "PageIn", "PageOutRecord", "PageInRecord", "keep_all",
    "simulate", "validate", "profile", "estimate_memory", "measure_training_step", "plan", "Plan",
    "Checkpointed", "Executor", "run_schedule",
    "EdgetrainError", "InfeasibleBudgetError", "ScheduleError", "UnknownNameError", "parse_bytes", "format_bytes",
]
