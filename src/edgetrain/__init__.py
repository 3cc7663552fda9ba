"""edgetrain: make deep-learning training fit and run well on small edge machines.

Profile a model into a :class:`Chain` of stage costs, plan a checkpointing :class:`Schedule`
for a memory budget or a recompute factor, simulate it, and run it.

The names below are imported on first use (PEP 562): ``import edgetrain.cli`` or
``import edgetrain.units`` must not pay for PyTorch, which most of the library imports.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.chain import Chain, StageCost
    from .core.schedule import (
        Backward,
        Discard,
        Forward,
        Keep,
        PageIn,
        PageInRecord,
        PageOut,
        PageOutRecord,
        Schedule,
        keep_all,
    )
    from .core.simulator import Stats, simulate, validate
    from .errors import EdgetrainError, InfeasibleBudgetError, ScheduleError, UnknownNameError
    from .planners import Plan, plan
    from .profiling import estimate_memory, measure_training_step, profile
    from .runtime import Checkpointed, Executor, fit_compiled, run_schedule
    from .units import format_bytes, parse_bytes

__version__ = "0.1.0"

__all__ = [
    "Chain", "StageCost", "Schedule", "Stats", "Forward", "Backward", "Discard", "Keep", "PageOut", "PageIn",
    "PageOutRecord", "PageInRecord", "keep_all", "simulate", "validate", "profile", "estimate_memory",
    "measure_training_step", "plan", "Plan", "Checkpointed", "fit_compiled", "Executor", "run_schedule",
    "EdgetrainError", "InfeasibleBudgetError", "ScheduleError", "UnknownNameError", "parse_bytes", "format_bytes",
]

# Where each public name lives: the module imported when the name is first read.
_HOMES = {
    ".core.chain": ("Chain", "StageCost"),
    ".errors": ("EdgetrainError", "InfeasibleBudgetError", "ScheduleError", "UnknownNameError"),
    ".planners": ("Plan", "plan"),
    ".profiling": ("estimate_memory", "measure_training_step", "profile"),
    ".runtime": ("Checkpointed", "Executor", "fit_compiled", "run_schedule"),
    ".core.schedule": ("Backward", "Discard", "Forward", "Keep", "PageIn", "PageInRecord", "PageOut", "PageOutRecord",
                       "Schedule", "keep_all"),
    ".core.simulator": ("Stats", "simulate", "validate"),
    ".units": ("format_bytes", "parse_bytes"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """A public name from its home module, or a subpackage (``edgetrain.planners``), imported on first read."""
    module = _HOME_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value   # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
