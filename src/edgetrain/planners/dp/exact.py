"""The optimal DP in bytes, without a memory grid: the exact least budget, and a table that loses nothing to rounding.

The recurrence of NOTE [ The optimal DP's sub-problem ] (``grid.py``), its sums formed as
:func:`~edgetrain.planners.dp.grid.solve_reference` forms them, with each sub-problem's least
time a step function of its memory instead of a row of units. :func:`exact_minimum_bytes` is
the same recurrence with ``max`` for memory in place of ``+`` for time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.chain import Chain
from ...core.schedule import Backward, Forward, Keep, Op, Schedule
from ...errors import InfeasibleBudgetError
from .grid import Costs, SubProblem, check_length, needed_subproblems, step_bytes, sweep_time_s, unfold

__all__ = ["ExactTable", "solve_exact", "exact_minimum_bytes", "least_peak_schedule", "below_minimum_error"]

_Least = dict[tuple[int, int, int], tuple[int, float, int]]  # (s, t, e) -> (peak bytes, time s, move)


def _least_peaks(chain: Chain) -> _Least:
    """Every ``P(s, t, e)``'s least memory, the least time at that memory, and the move reaching both.

    The recurrence with ``max`` for memory in place of ``+`` for time (``O(L^3)``), ties in
    memory broken by time and then by the smallest move (``s`` records, ``k > s`` checkpoints).
    """
    costs, length = Costs.of(chain), chain.length
    child_entry = [0 if stage.output_saved else 1 for stage in chain.stages]
    turn = [stage.fwd_time_s + stage.bwd_time_s for stage in chain.stages]
    sweep = sweep_time_s(chain).tolist()
    least: _Least = {}
    for span in range(length):          # bottom-up: every child is solved before its parent
        for s in range(length - span):
            t = s + span
            for e in (0, 1):
                record_peak, record_time = costs.record_peak(e, s, t), turn[s]
                if s < t:
                    child_peak, child_time, _ = least[s + 1, t, child_entry[s]]
                    record_peak = max(record_peak, costs.record_hold(e, s) + child_peak)
                    record_time += child_time
                moves = [(record_peak, record_time, s)]
                for k in range(s + 1, t + 1):
                    upper, lower = least[k, t, 1], least[s, k - 1, e]
                    peak = max(costs.sweep_peak(e, s, k, t), costs.entry(e, s) + upper[0], costs.grads(k, t) + lower[0])
                    moves.append((peak, sweep[s][k] + upper[1] + lower[1], k))
                least[s, t, e] = min(moves)
    return least


def exact_minimum_bytes(chain: Chain) -> int:
    """Least budget, in bytes and without rounding, of any schedule the recurrence builds.

    It tells a caller what a request needs when a table has no feasible entry.
    """
    step = chain.gradients_bytes + chain.optimizer_workspace_bytes
    return chain.resident_bytes + max(_least_peaks(chain)[0, chain.length - 1, 0][0], step)


def least_peak_schedule(chain: Chain) -> Schedule:
    """The schedule of least peak (:func:`exact_minimum_bytes`), the fastest of those, in ``O(L^3)``.

    Where no table is solved (a chain too long for the exact table whose grid rounds every
    schedule away near the minimum), it is the answer that fits every feasible budget.
    """
    least = _least_peaks(chain)

    def expand(task: tuple[int, int, int]) -> tuple[list[Op], list[tuple[int, int, int] | Op]]:
        s, t, e = task
        k = least[s, t, e][2]
        if k == s:                         # (a)
            child = [(s + 1, t, 0 if chain.stages[s].output_saved else 1)] if s < t else []
            return [Forward(s, Keep.ALL)], [*child, Backward(s)]
        return _advance(s, k), [(k, t, 1), (s, k - 1, e)]   # (b)

    ops = unfold((0, chain.length - 1, 0), expand)
    return Schedule(ops, chain.length, strategy="optimal", params={"least_peak": True})


def below_minimum_error(chain: Chain, budget_bytes: int, minimum_bytes: int) -> InfeasibleBudgetError:
    """The error for a budget below the exact least one of the class, carrying it."""
    return InfeasibleBudgetError(f"no checkpointing schedule of {chain.name or 'this chain'} fits in {budget_bytes} "
                                 f"bytes: it needs at least {minimum_bytes} bytes", minimum_bytes=minimum_bytes,
                                 budget_bytes=budget_bytes)


@dataclass(frozen=True, eq=False)
class _Front:
    """``C(s, t, ., e)`` as a step function: from ``need_bytes[i]`` on, ``time_s[i]`` by move ``code[i]``."""

    need_bytes: np.ndarray  # [n] int64, increasing
    time_s: np.ndarray      # [n] float64, decreasing
    code: np.ndarray        # [n] int64: s (record), k in s+1..t (checkpoint x_k)

    def index(self, memory_bytes: np.ndarray | int) -> np.ndarray:
        """Index of the step that ``memory_bytes`` falls in; -1 below the first."""
        return np.searchsorted(self.need_bytes, memory_bytes, side="right") - 1


def _envelope(need: np.ndarray, time: np.ndarray, code: np.ndarray, cap_bytes: int) -> _Front:
    """Lower envelope of candidate steps up to ``cap_bytes``; ties go to the smallest code, as in the table."""
    keep = need <= cap_bytes
    need, time, code = need[keep], time[keep], code[keep]
    order = np.lexsort((code, time, need))
    need, time, code = need[order], time[order], code[order]
    earlier = np.concatenate(([np.inf], np.minimum.accumulate(time)[:-1]))
    better = time < earlier
    return _Front(need[better], time[better], code[better])


def _record_move(costs: Costs, fronts: dict[tuple[int, int, int], _Front], turn_s: float, e: int, s: int,
                 t: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps of move (a): record ``s``, then ``P(s+1, t)`` beside the record."""
    need = costs.record_peak(e, s, t)
    if s == t:
        return np.array([need], np.int64), np.array([turn_s])
    stage = costs.chain.stages[s]
    child = fronts[0 if stage.output_saved else 1, s + 1, t]
    return np.maximum(need, child.need_bytes + costs.record_hold(e, s)), turn_s + child.time_s


def _checkpoint_move(costs: Costs, fronts: dict[tuple[int, int, int], _Front], sweep_s: float, e: int, s: int,
                     k: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps of move (b): advance to ``x_k``, ``P(k, t, 1)`` beside ``x_s``, then ``P(s, k-1, e)`` beside g(k..t)."""
    upper, lower = fronts[1, k, t], fronts[e, s, k - 1]
    upper_need = upper.need_bytes + costs.entry(e, s)
    lower_need = lower.need_bytes + costs.grads(k, t)
    points = np.concatenate((upper_need, lower_need))  # duplicates are merged by _envelope
    at_upper = np.searchsorted(upper_need, points, side="right") - 1
    at_lower = np.searchsorted(lower_need, points, side="right") - 1
    both = (at_upper >= 0) & (at_lower >= 0)
    time = sweep_s + upper.time_s[at_upper[both]] + lower.time_s[at_lower[both]]
    return np.maximum(costs.sweep_peak(e, s, k, t), points[both]), time


def _solve_fronts(chain: Chain, activation_budget_bytes: int) -> dict[tuple[int, int, int], _Front]:
    """Every needed ``C(s, t, ., e)`` in bytes, up to the largest memory a sub-problem can be handed.

    The moves and sums of ``solve_reference`` without the grid: a step function per
    sub-problem instead of a row of units, so no schedule of the class is lost to rounding.
    """
    costs, length, needed = Costs.of(chain), chain.length, needed_subproblems(chain)
    turn = [stage.fwd_time_s + stage.bwd_time_s for stage in chain.stages]
    sweep = sweep_time_s(chain).tolist()
    # A record handing its child more than it was given (negative hold) raises a child's memory.
    cap = activation_budget_bytes + sum(max(0, -costs.record_hold(e, s)) for e in (0, 1) for s in range(length))
    fronts: dict[tuple[int, int, int], _Front] = {}
    for span in range(length):
        for s in range(length - span):
            t = s + span
            for e in (0, 1):
                if not needed[e, s]:
                    continue
                moves = [(*_record_move(costs, fronts, turn[s], e, s, t), s)]
                moves += [(*_checkpoint_move(costs, fronts, sweep[s][k], e, s, k, t), k) for k in range(s + 1, t + 1)]
                fronts[e, s, t] = _envelope(np.concatenate([need for need, _, _ in moves]).astype(np.int64),
                                            np.concatenate([time for _, time, _ in moves]),
                                            np.concatenate([np.full(len(need), code) for need, _, code in moves]),
                                            cap)
    return fronts


def _rebuild_fronts(chain: Chain, fronts: dict[tuple[int, int, int], _Front], activation_bytes: int) -> tuple[Op, ...]:
    """``rebuild`` in bytes: replay the steps' moves from ``P(0, L-1, 0)``."""
    costs = Costs.of(chain)

    def expand(task: SubProblem) -> tuple[list[Op], list[SubProblem | Op]]:
        s, t, m, e = task
        front = fronts[e, s, t]
        step = int(front.index(m))
        if step < 0:
            raise AssertionError(f"rebuild reached an infeasible sub-problem P({s}, {t}, {e}) in {m} bytes")
        k = int(front.code[step])
        if k == s:                         # (a)
            entry = 0 if chain.stages[s].output_saved else 1
            child = [(s + 1, t, m - costs.record_hold(e, s), entry)] if s < t else []
            return [Forward(s, Keep.ALL)], [*child, Backward(s)]
        return _advance(s, k), [(k, t, m - costs.entry(e, s), 1), (s, k - 1, m - costs.grads(k, t), e)]   # (b)

    return unfold((0, chain.length - 1, activation_bytes, 0), expand)


def _advance(s: int, k: int) -> list[Op]:
    """Move (b)'s forwards: ``x_s`` kept as the checkpoint, then on to ``x_k`` keeping nothing."""
    return [Forward(s, Keep.INPUT), *(Forward(j, Keep.NONE) for j in range(s + 1, k))]


@dataclass(frozen=True, eq=False)
class ExactTable:
    """The optimal DP of one chain for every budget up to ``max_memory_bytes``, counted in bytes.

    The same recurrence and moves as :class:`OptimalTable` with no memory grid: each
    sub-problem's least time is a step function of its memory, so no schedule of the class is
    lost to rounding, however close the budget is to the least one. It costs more than a table
    of a few hundred slots (the steps of a sub-problem can number thousands), so :func:`plan`
    solves it only where a table cannot vouch for its answer.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> table = solve_exact(Chain.uniform(8), 12)
        >>> table.min_memory_bytes, [table.time_s(b) for b in (5, 6, 12)]
        (5, [36.0, 24.0, 16.0])
    """

    chain: Chain
    max_memory_bytes: int
    fronts: dict[tuple[int, int, int], _Front]

    @property
    def _top(self) -> _Front:
        return self.fronts[0, 0, self.chain.length - 1]

    @property
    def min_memory_bytes(self) -> int:
        """The least budget any schedule of the class fits in (equal to the exact minimum)."""
        return max(self.chain.resident_bytes + int(self._top.need_bytes[0]), step_bytes(self.chain))

    def time_s(self, memory_bytes: int) -> float:
        """Time of the fastest schedule within ``memory_bytes`` (the whole peak of the step)."""
        return float(self._top.time_s[self._step(memory_bytes)])

    def least_memory_within(self, time_limit_s: float) -> int:
        """The least budget whose fastest schedule takes at most ``time_limit_s``.

        Raises:
            InfeasibleBudgetError: when no schedule within ``max_memory_bytes`` is that fast.
        """
        fast_enough = np.flatnonzero(self._top.time_s <= time_limit_s)
        if not len(fast_enough):
            raise InfeasibleBudgetError(
                f"no schedule of {self.chain.name or 'this chain'} within {self.max_memory_bytes} bytes takes at most "
                f"{time_limit_s} s", budget_bytes=self.max_memory_bytes)
        return max(self.chain.resident_bytes + int(self._top.need_bytes[fast_enough[0]]), self.min_memory_bytes)

    def schedule(self, memory_bytes: int) -> Schedule:
        """Rebuild the fastest schedule within ``memory_bytes``.

        Raises:
            InfeasibleBudgetError: below :attr:`min_memory_bytes` (carried as ``minimum_bytes``).
            ValueError: above the budget the table was solved for.
        """
        self._step(memory_bytes)
        ops = _rebuild_fronts(self.chain, self.fronts, memory_bytes - self.chain.resident_bytes)
        return Schedule(ops, self.chain.length, strategy="optimal",
                        params={"budget_bytes": memory_bytes, "exact": True})

    def _step(self, memory_bytes: int) -> int:
        if memory_bytes > self.max_memory_bytes:
            raise ValueError(f"budget {memory_bytes} bytes is above the table's maximum {self.max_memory_bytes}; "
                             "solve a table for it")
        minimum = self.min_memory_bytes
        if memory_bytes < minimum:
            raise InfeasibleBudgetError(f"no schedule of {self.chain.name or 'this chain'} fits in {memory_bytes} "
                                        f"bytes: the least is {minimum} bytes", minimum_bytes=minimum,
                                        budget_bytes=memory_bytes)
        return int(self._top.index(memory_bytes - self.chain.resident_bytes))


def solve_exact(chain: Chain, max_memory_bytes: int) -> ExactTable:
    """Solve the optimal DP of ``chain`` in bytes, with no grid, for every budget up to ``max_memory_bytes``.

    Args:
        chain: the cost model.
        max_memory_bytes: the largest budget the table answers for (the whole peak of a step).

    Returns:
        An :class:`ExactTable`; its least budget is the exact minimum of the class.

    Raises:
        InfeasibleBudgetError: when nothing fits in ``max_memory_bytes``, carrying the least budget.
    """
    check_length(chain)
    minimum = exact_minimum_bytes(chain)
    if max_memory_bytes < minimum:
        raise below_minimum_error(chain, max_memory_bytes, minimum)
    return ExactTable(chain, max_memory_bytes, _solve_fronts(chain, max_memory_bytes - chain.resident_bytes))
