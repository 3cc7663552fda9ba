"""The single-level planner's search, counted and timed, at a grouping of one's choice and with a time limit.

:func:`~edgetrain.planners.single_level.single_level_plan` searches a chain of more than ``MAX_GROUPS`` model
stages in groups of consecutive stages (NOTE [ Searching long chains in groups ] in ``single_level.py``).
:func:`timed_search` runs that search with another ``max_groups`` (the chain's length: stage by stage) and counts its
simulations, stopping it once it runs past a limit, so that the two ways can be set side by side on one chain (the
``single_level_search`` benchmark).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ..core.chain import Chain
from ..core.simulator import simulate
from . import single_level as planner

__all__ = ["SearchRun", "timed_search"]


class _OutOfTime(Exception):
    pass


@dataclass(frozen=True)
class SearchRun:
    """One search: whether it finished within its limit, its seconds and simulations, and the plan it found.

    ``plan`` is the stage kinds as text (``.`` kept, ``S`` opens a region, ``R`` continues it); it, ``step_time_s``
    and ``peak_bytes`` (the plan simulated on the chain) are ``None`` for a search stopped at its limit.
    """

    finished: bool
    seconds: float
    simulations: int
    plan: str | None = None
    step_time_s: float | None = None
    peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed_search(chain: Chain, budget_bytes: int, max_groups: int, limit_s: float) -> SearchRun:
    """``single_level_plan(chain, budget_bytes)`` searched in ``max_groups`` groups, stopped past ``limit_s`` seconds.

    The planner's module-level ``simulate`` and ``MAX_GROUPS`` are swapped for the search and put back after it,
    however it ends (so no other thread may plan at the same time).

    Raises:
        InfeasibleBudgetError: the search finished and no plan it found fits ``budget_bytes``.
    """
    real, grouping, calls = planner.simulate, planner.MAX_GROUPS, [0]
    start = time.perf_counter()

    def counted(*args: Any) -> Any:
        calls[0] += 1
        if time.perf_counter() - start > limit_s:
            raise _OutOfTime
        return real(*args)
    planner.simulate, planner.MAX_GROUPS = counted, max_groups   # type: ignore[assignment]
    try:
        kinds = planner.single_level_plan(chain, budget_bytes)
    except _OutOfTime:
        return SearchRun(False, time.perf_counter() - start, calls[0])
    finally:
        planner.simulate, planner.MAX_GROUPS = real, grouping
    seconds = time.perf_counter() - start
    stats = simulate(chain, planner.single_level(kinds))
    return SearchRun(True, seconds, calls[0], "".join(".SR"[k] for k in kinds), stats.time_s, stats.peak_bytes)
