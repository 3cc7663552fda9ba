"""Pick the best schedule for a memory budget or for a recompute factor.

A memory budget means what a device's RAM means: the whole peak of a training step as
:func:`~edgetrain.core.simulator.simulate` counts it. With ``memory=`` we return the fastest schedule
within it; with ``recompute=ρ`` the schedule of least peak whose time stays within ``ρ`` times
a step without recomputation (the founding paper's binary search over memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from ..core.chain import Chain
from ..core.schedule import Schedule, keep_all
from ..core.simulator import Stats, simulate
from ..errors import InfeasibleBudgetError, UnknownNameError
from ..units import format_bytes, parse_bytes
from .dp.exact import least_peak_schedule, solve_exact
from .dp.grid import Solver
from .dp.optimal import OptimalTable, solve
from .revolve import revolve
from .uniform import uniform

__all__ = ["Plan", "Candidate", "plan", "sequential_baseline", "least_step_bytes", "beside_generator_states",
           "STRATEGIES"]

STRATEGIES = ("auto", "uniform", "revolve", "optimal")
REPLANS = 4  # DP solves lowered by the generator states' excess before the reserve (_optimal_within_budget)
EXACT_MAX_STAGES = 64  # longest chain the exact optimal table is solved for (NOTE [ Grid and exact optimal tables ])


@dataclass(frozen=True)
class Candidate:
    """A schedule and what the simulator says it costs."""

    schedule: Schedule
    stats: Stats

    @property
    def strategy(self) -> str:
        return self.schedule.strategy

    def to_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "params": self.schedule.params, "peak_bytes": self.stats.peak_bytes,
                "time_s": self.stats.time_s, "recompute_factor": self.stats.recompute_factor}


@dataclass(frozen=True)
class Plan:
    """The chosen schedule, its predicted cost, and PyTorch's ``checkpoint_sequential`` under the same request."""

    chosen: Candidate
    budget_bytes: int | None
    recompute_limit: float | None
    baseline: Candidate | None

    @property
    def schedule(self) -> Schedule:
        return self.chosen.schedule

    @property
    def stats(self) -> Stats:
        return self.chosen.stats

    @property
    def strategy(self) -> str:
        return self.chosen.strategy

    @property
    def predicted_peak_bytes(self) -> int:
        return self.stats.peak_bytes

    @property
    def predicted_time_s(self) -> float:
        return self.stats.time_s

    @property
    def recompute_factor(self) -> float:
        return self.stats.recompute_factor

    def to_dict(self) -> dict[str, object]:
        return {"strategy": self.strategy, "params": self.schedule.params,
                "predicted_peak_bytes": self.predicted_peak_bytes, "predicted_time_s": self.predicted_time_s,
                "recompute_factor": self.recompute_factor, "forward_advances": self.stats.forward_advances,
                "budget_bytes": self.budget_bytes, "recompute_limit": self.recompute_limit,
                "baseline": None if self.baseline is None else self.baseline.to_dict()}


def plan(chain: Chain, memory: int | str | None = None, recompute: float | None = None, *,
         strategy: str = "auto", slots: int = 500, jit: bool = True) -> Plan:
    """The best checkpointing schedule for ``chain`` under a memory budget or a recompute factor.

    Args:
        chain: the cost model (from :func:`edgetrain.profile` or a zoo estimate).
        memory: the whole peak allowed, in bytes or as text such as ``"300MiB"``.
        recompute: the largest acceptable ``ρ = time / time without recomputation`` (>= 1).
        strategy: ``"auto"`` (the best of all), ``"uniform"`` (checkpoint_sequential),
            ``"revolve"`` (binomial) or ``"optimal"`` (dynamic programme).
        slots: memory units of the ``optimal`` planner's table.
        jit: solve grid tables with the numba kernel. ``False`` keeps numba (about 100 MiB
            resident once compiled) out of the process, for planning inside a training process:
            chains of up to ``EXACT_MAX_STAGES`` stages then get the exact table alone (same
            optimum), longer ones the pure-Python grid solver (slow).

    Raises:
        InfeasibleBudgetError: the budget is below the least peak any schedule of the
            strategy reaches; ``minimum_bytes`` carries that least peak.
        ValueError: neither or both of ``memory`` and ``recompute``, ``ρ < 1``.
        UnknownNameError: an unknown strategy.

    Example:
        >>> best = plan(Chain.uniform(20), recompute=1.5)
        >>> best.recompute_factor <= 1.5
        True
    """
    if strategy not in STRATEGIES:
        raise UnknownNameError("strategy", strategy, STRATEGIES)
    if (memory is None) == (recompute is None):
        raise ValueError("give exactly one of memory= (a budget) or recompute= (a factor ρ >= 1)")
    names = STRATEGIES[1:] if strategy == "auto" else (strategy,)
    if memory is not None:
        budget = parse_bytes(memory)
        best = min(_within_budget(chain, budget, names, slots, jit), key=_fastest, default=None)
        if best is None:
            raise _below_minimum(chain, budget, names)
        return Plan(best, budget, None, sequential_baseline(chain, budget))
    assert recompute is not None
    if recompute < 1:
        raise ValueError(f"the recompute factor ρ is time with recomputation over time without: >= 1, got {recompute}")
    best = min(_within_factor(chain, recompute, names, slots, jit), key=_smallest)
    baseline = min((c for c in _uniform_candidates(chain) if c.stats.recompute_factor <= recompute + 1e-12),
                   key=_smallest, default=None)
    return Plan(best, None, recompute, baseline)


def sequential_baseline(chain: Chain, budget_bytes: int) -> Candidate | None:
    """The fastest ``checkpoint_sequential`` segmentation within ``budget_bytes``; None when none fits."""
    return min((c for c in _uniform_candidates(chain) if c.stats.peak_bytes <= budget_bytes), key=_fastest,
               default=None)


def least_step_bytes(chain: Chain) -> int:
    """The least tensor peak any schedule reaches on ``chain`` (what :func:`plan` says a 1-byte budget needs)."""
    try:
        plan(chain, memory=1, jit=False)
    except InfeasibleBudgetError as exc:
        assert exc.minimum_bytes is not None
        return exc.minimum_bytes
    return 1


Planned = TypeVar("Planned")


def beside_generator_states(chain: Chain, budget: int, solve: Callable[[int], Planned], planner: str) -> Planned:
    """``solve`` at ``budget`` less ``Chain.rng_reserve_bytes``, for a planner whose own model leaves the
    generator states out (NOTE [ Generator states in the plan ] in schedule.py).

    Raises:
        InfeasibleBudgetError: nothing fits; ``planner`` names what refused, and the minimum counts the
            states back in.
    """
    reserve = chain.rng_reserve_bytes
    try:
        return solve(max(budget - reserve, 0))
    except InfeasibleBudgetError as exc:
        minimum = None if exc.minimum_bytes is None else exc.minimum_bytes + reserve
        least = "" if minimum is None else f": at least {format_bytes(minimum)} ({minimum} bytes)" + (
            f", {reserve} bytes of them the generator states'" if reserve else "")
        raise InfeasibleBudgetError(
            f"budget {format_bytes(budget)} ({budget} bytes) is below what {planner} can fit for "
            f"{chain.name or 'this chain'}{least}", minimum_bytes=minimum, budget_bytes=budget) from exc


def _fastest(candidate: Candidate) -> tuple[float, int]:
    return candidate.stats.time_s, candidate.stats.peak_bytes


def _smallest(candidate: Candidate) -> tuple[int, float]:
    return candidate.stats.peak_bytes, candidate.stats.time_s


def _candidate(chain: Chain, schedule: Schedule) -> Candidate:
    return Candidate(schedule, simulate(chain, schedule))


def _uniform_candidates(chain: Chain) -> Iterator[Candidate]:
    for segments in range(1, chain.length + 1):
        yield _candidate(chain, uniform(chain, segments))


def _revolve_candidates(chain: Chain) -> Iterator[Candidate]:
    for slots in range(1, max(chain.length - 1, 1) + 1):
        yield _candidate(chain, revolve(chain, slots))


_ENUMERATED: dict[str, Callable[[Chain], Iterator[Candidate]]] = {
    "uniform": _uniform_candidates, "revolve": _revolve_candidates}


def _keep_all_peak(chain: Chain) -> int:
    return simulate(chain, keep_all(chain.length)).peak_bytes


def _keep_all_as_optimal(chain: Chain) -> Candidate:
    """No recomputation at all: the optimum whenever it fits, even where the table's rounding misses it."""
    schedule = keep_all(chain.length)
    return _candidate(chain, Schedule(schedule.ops, chain.length, strategy="optimal", params={"recompute": False}))


def _optimal_within_budget(chain: Chain, budget: int, slots: int, jit: bool) -> Candidate | None:
    """The optimal DP's fastest schedule whose simulated peak is within ``budget``; None where none is.

    The DP's recurrence leaves the generator states out (NOTE [ Generator states in the plan ] in
    schedule.py): where they take its schedule over the budget, it plans again lower by what they
    took (a few times), then ``Chain.rng_reserve_bytes`` lower, and the least-peak schedule answers
    where it alone fits. On such chains the schedule fits but may not be the fastest that does.
    """
    search = _OptimalSearch(chain, slots, jit)
    tried: list[Candidate | None] = []
    lowered = budget
    for _ in range(REPLANS):
        tried.append(search.within(lowered))
        last = tried[-1]
        if last is None or last.stats.peak_bytes <= budget:
            break
        lowered -= last.stats.peak_bytes - budget
    if not any(c is not None and c.stats.peak_bytes <= budget for c in tried):
        tried += [search.within(budget - chain.rng_reserve_bytes), search.least_peak]
    return min((c for c in tried if c is not None and c.stats.peak_bytes <= budget), key=_fastest, default=None)


def _least_peak_candidate(chain: Chain) -> Candidate:
    return _candidate(chain, least_peak_schedule(chain))


class _OptimalSearch:
    """The optimal DP asked for one chain at several budgets (the replans of :func:`_optimal_within_budget`):
    keep-all, the least-peak schedule (about a second on 100 stages) and the grid table up to keep-all's peak
    are each made once, when first needed."""

    def __init__(self, chain: Chain, slots: int, jit: bool) -> None:
        self.chain, self.slots, self.jit = chain, slots, jit

    @functools.cached_property
    def keep_all(self) -> Candidate:
        return _keep_all_as_optimal(self.chain)

    @functools.cached_property
    def least_peak(self) -> Candidate:
        return _least_peak_candidate(self.chain)

    @functools.cached_property
    def keep_all_table(self) -> OptimalTable | None:
        """Solved with numba's solver whatever ``jit`` says: this is planning outside a training process."""
        return _keep_all_table(self.chain, self.keep_all.stats.peak_bytes, self.slots, jit=True)

    def within(self, budget: int) -> Candidate | None:
        """The optimal DP's fastest schedule within ``budget`` by its own accounting; None below its exact
        minimum.

        NOTE [ Grid and exact optimal tables ]
        A table of ``slots`` units rounds memory up, so it misses schedules whose peak lies
        within its ``rounding_bytes`` of the budget: near the least budget it finds nothing, and
        elsewhere it can return a slower schedule than one that fits. It finds every schedule
        ``rounding_bytes`` below a budget, so its time at ``budget + rounding_bytes`` bounds the
        best time at ``budget`` from below: when the two agree the table's answer is the optimum.
        Otherwise the exact table (no grid) answers, on chains of up to ``EXACT_MAX_STAGES``
        stages: its cost grows as ``L^3`` in Python (0.1 s for 22 stages, 1.3 s for 56, minutes
        for 152), so longer chains take the fastest that fits of the grid's answer, the schedules
        a grid places up to its rounding above the budget (NOTE [ Schedules a grid charges above
        what they hold ]) and the least-peak schedule (``least_peak_schedule``, ``O(L^3)`` on
        numbers, about a second for 100 stages), which fits every feasible budget, so a valid
        request never meets a grid error.
        """
        chain = self.chain
        if self.keep_all.stats.peak_bytes <= budget:
            return self.keep_all
        table = None if not self.jit and chain.length <= EXACT_MAX_STAGES else \
            _grid_table(chain, budget, self.slots, self.jit)
        if table is not None and _vouches(table, budget):
            return _candidate(chain, table.schedule(budget))
        if chain.length <= EXACT_MAX_STAGES:
            try:
                return _candidate(chain, solve_exact(chain, budget).schedule(budget))
            except InfeasibleBudgetError:
                return None
        fitting = [c for c in (_candidate(chain, table.schedule(budget)) if table is not None else None,
                               *(self.rounded_up(budget) if self.jit else ()), self.least_peak)
                   if c is not None and c.stats.peak_bytes <= budget]
        return min(fitting, key=_fastest, default=None)

    def rounded_up(self, budget: int) -> list[Candidate]:
        """On a chain too long for the exact table, the schedules a grid finds *above* ``budget`` that fit it.

        NOTE [ Schedules a grid charges above what they hold ]
        A grid table rounds each value up to whole units, so a schedule it places at a budget up to its
        ``rounding_bytes`` above ``budget`` may hold no more than ``budget`` when simulated. Near the least
        budget such a schedule can be much faster than the least-peak schedule, which only minimises the
        peak: EfficientNet-B0's 79-stage two-level chain at its least budget, 70,104,256 bytes, got a plan of
        ρ 1.241 while ``plan(recompute=1.5)`` found one of ρ 1.134 at the same simulated peak. So the table
        solved up to keep-all's peak is read at each unit from ``budget`` to ``rounding_bytes`` above it,
        each new schedule simulated.
        """
        table = self.keep_all_table
        if table is None:
            return []
        found: list[Candidate] = []
        times: set[float] = set()
        start = max(budget, table.min_memory_bytes)
        for memory in range(start, min(budget + table.rounding_bytes, table.max_memory_bytes) + 1,
                            table.unit_bytes):
            if table.time_s(memory) in times:   # the same schedule one unit up
                continue
            times.add(table.time_s(memory))
            found.append(_candidate(self.chain, table.schedule(memory)))
        return found


def _grid_table(chain: Chain, budget: int, slots: int, jit: bool) -> OptimalTable | None:
    """A table with a schedule at ``budget``, solved far enough above it to vouch for it; None if none fits."""
    margin = 0
    if chain.length <= EXACT_MAX_STAGES and chain.length < slots and budget > chain.resident_bytes:
        # One unit of a table solved this far above the budget is at most the margin's L-th part;
        # longer chains, which the exact table does not back, keep the finer grid of the budget itself.
        margin = chain.length * -(-(budget - chain.resident_bytes) // (slots - chain.length))
    try:
        table = solve(chain, budget + margin, slots=slots, solver=_solver(jit))
        table.time_s(budget)
    except InfeasibleBudgetError:
        return None
    return table


def _vouches(table: OptimalTable, budget: int) -> bool:
    """Whether no schedule within ``budget`` is faster than the table's (NOTE [ Grid and exact optimal tables ])."""
    vouching_budget = budget + table.rounding_bytes
    return vouching_budget <= table.max_memory_bytes and table.time_s(vouching_budget) == table.time_s(budget)


def _solver(jit: bool) -> Solver:
    return "fast" if jit else "reference"


def _within_budget(chain: Chain, budget: int, names: tuple[str, ...], slots: int,
                   jit: bool) -> Iterator[Candidate]:
    for name in names:
        if name == "optimal":
            best = _optimal_within_budget(chain, budget, slots, jit)
            if best is not None:
                yield best
        else:
            yield from (c for c in _ENUMERATED[name](chain) if c.stats.peak_bytes <= budget)


def _within_factor(chain: Chain, factor: float, names: tuple[str, ...], slots: int,
                   jit: bool) -> Iterator[Candidate]:
    limit = factor * chain.compute_time_s * (1 + 1e-12)
    for name in names:
        if name == "optimal":
            yield _least_memory_within(chain, limit, slots, jit)
        else:
            yield from (c for c in _ENUMERATED[name](chain) if c.stats.time_s <= limit)


def _least_memory_within(chain: Chain, time_limit_s: float, slots: int, jit: bool) -> Candidate:
    """The least budget whose optimal time is within the limit, and its schedule.

    A grid table can only vouch for that budget when it is exact (NOTE [ Grid and exact
    optimal tables ]); otherwise the exact table answers, up to ``EXACT_MAX_STAGES`` stages.
    Beyond, the grid's answer stands, or keep-all (always within the limit) where rounding
    leaves the grid empty.
    """
    keep_all_peak = _keep_all_peak(chain)
    grid = _keep_all_table(chain, keep_all_peak, slots, jit) if jit or chain.length > EXACT_MAX_STAGES else None
    if grid is not None and (grid.rounding_bytes == 0 or chain.length > EXACT_MAX_STAGES):
        return _least_on_grid(chain, grid, time_limit_s)
    if grid is None and chain.length > EXACT_MAX_STAGES:
        return _keep_all_as_optimal(chain)
    # Here the chain is short enough for the exact table (the grid was skipped or not exact).
    table = solve_exact(chain, keep_all_peak)
    return _candidate(chain, table.schedule(table.least_memory_within(time_limit_s)))


def _keep_all_table(chain: Chain, keep_all_peak: int, slots: int, jit: bool) -> OptimalTable | None:
    """The grid table solved up to keep-all's peak (every budget a plan can ask); None where rounding leaves it
    empty."""
    try:
        return solve(chain, keep_all_peak, slots=slots, solver=_solver(jit))
    except InfeasibleBudgetError:
        return None


def _least_on_grid(chain: Chain, table: OptimalTable, time_limit_s: float) -> Candidate:
    """Binary search of the smallest budget on the table whose time is within the limit."""
    low, high = table.min_memory_bytes, table.max_memory_bytes
    step = table.unit_bytes
    while high - low > step:
        middle = low + (high - low) // 2
        if table.time_s(middle) <= time_limit_s:
            high = middle
        else:
            low = middle
    budget = low if table.time_s(low) <= time_limit_s else high
    if table.time_s(budget) > time_limit_s:  # only rounding keeps keep-all itself off the grid
        return _keep_all_as_optimal(chain)
    return _candidate(chain, table.schedule(budget))


def _below_minimum(chain: Chain, budget: int, names: tuple[str, ...]) -> InfeasibleBudgetError:
    minima = []
    for name in names:
        if name == "optimal":   # the DP's least schedule, its generator states counted
            minima.append(_least_peak_candidate(chain).stats.peak_bytes)
        else:
            minima.append(min(c.stats.peak_bytes for c in _ENUMERATED[name](chain)))
    minimum = min(minima)
    what = "any strategy" if len(names) > 1 else f"strategy {names[0]!r}"
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget)} ({budget} bytes) is below the feasible minimum of {what} for "
        f"{chain.name or 'this chain'}: {format_bytes(minimum)} ({minimum} bytes)",
        minimum_bytes=minimum, budget_bytes=budget)
