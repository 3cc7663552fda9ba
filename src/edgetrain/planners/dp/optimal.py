"""Optimal checkpointing of a heterogeneous chain by dynamic programming over memory units.

O. Beaumont, L. Eyraud-Dubois, J. Herrmann, A. Joly, A. Shilova, "Optimal checkpointing for
heterogeneous chains: how to train deep neural networks with limited memory", 2019
(arXiv:1911.13214; the ``rotor`` library). As there, the work is split in two: *solve* a
table of the least time of every sub-chain for every memory budget once, then *rebuild* the
schedule of any budget from the recorded choices, so a budget sweep costs one solve.

The recurrence (re-derived from edgetrain's simulator), its rounding to memory units and the
solvers are in ``grid.py`` (NOTE [ The optimal DP's sub-problem ]), shared with
``paging-dp``; here the paged moves are switched off and the cost is the time.
``exact.py`` solves the same recurrence in bytes, without a grid, where a table cannot
vouch for its answer. The schedules are persistent and in order (NOTE [ The optimal DP's
sub-problem ]).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...core.chain import Chain
from ...core.schedule import Schedule
from ...errors import InfeasibleBudgetError
from .exact import below_minimum_error, exact_minimum_bytes
from .grid import (
    BudgetTable,
    Costs,
    MovesGrid,
    Solver,
    ceil_div,
    check_length,
    check_options,
    common_unit_bytes,
    discretise,
    rebuild,
    solve_grid,
    without_paging,
)

__all__ = ["OptimalTable", "solve", "optimal"]

logger = logging.getLogger(__name__)


def _infeasible(chain: Chain, budget_bytes: int, slots: int) -> InfeasibleBudgetError:
    """The error for a table with no feasible entry: below the exact minimum, or lost to rounding."""
    minimum = exact_minimum_bytes(chain)
    if budget_bytes < minimum:
        return below_minimum_error(chain, budget_bytes, minimum)
    name = chain.name or "this chain"
    activation = budget_bytes - chain.resident_bytes
    largest_unit_bytes = max(1, (budget_bytes - minimum) // chain.length)
    return InfeasibleBudgetError(
        f"{budget_bytes} bytes is at least the exact minimum {minimum} of {name} but too close to it for a "
        f"grid of {slots} slots (each stage may lose a slot to rounding); use slots >= "
        f"{ceil_div(activation, largest_unit_bytes)} or a larger budget",
        minimum_bytes=minimum, budget_bytes=budget_bytes)



@dataclass(frozen=True, eq=False)
class OptimalTable(BudgetTable):
    """The solved table of one chain for every budget up to ``max_memory_bytes``.

    It keeps what rebuilding needs: ``choice[e, row(s, t), m]``, the decision reaching the
    least time of sub-chain ``s..t`` in ``m`` memory units (NOTE [ The optimal DP's
    sub-problem ]), and ``top_time_s[m]``, the least time of the whole chain. The times of
    the sub-chains (8 bytes per entry against 2) are dropped once solved.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> table = solve(Chain.uniform(10), 20)
        >>> table.time_s(20), table.min_memory_bytes
        (20.0, 5)
    """

    chain: Chain
    max_memory_bytes: int
    slots: int
    grid: MovesGrid
    top_time_s: np.ndarray  # [max_units + 1] C(0, L-1, m, 0)
    choice: np.ndarray      # [2, L(L+1)/2, max_units + 1] int16

    @property
    def top_values(self) -> np.ndarray:
        return self.top_time_s

    @property
    def rounding_bytes(self) -> int:
        """How far below a budget a schedule's peak may need to be for this table to find it.

        ``L`` units, one per rounding a schedule is charged (NOTE [ The optimal DP's
        sub-problem ]), none on an exact grid (every size a multiple of the unit); plus, per
        stage, what the grid's clamping of a negative record hold to zero withholds from a child.
        """
        costs = Costs.of(self.chain)
        clamped = sum(max(0, -costs.record_hold(e, s)) for s in range(self.chain.length) for e in (0, 1))
        exact = self.unit_bytes == common_unit_bytes(self.chain)
        return clamped + (0 if exact else self.chain.length * self.unit_bytes)

    def time_s(self, memory_bytes: int) -> float:
        """Time of the fastest schedule within ``memory_bytes`` (the whole peak of the step)."""
        return float(self.top_time_s[self._top_units(memory_bytes)])

    def schedule(self, memory_bytes: int) -> Schedule:
        """Rebuild the fastest schedule within ``memory_bytes`` from the recorded choices.

        Raises:
            InfeasibleBudgetError: below :attr:`min_memory_bytes` (carried as ``minimum_bytes``).
            ValueError: above the budget the table was solved for.
        """
        ops = rebuild(self.grid, self.choice, self._top_units(memory_bytes))
        return Schedule(ops, self.chain.length, strategy="optimal",
                        params={"slots": self.slots, "budget_bytes": memory_bytes, "unit_bytes": self.unit_bytes})


def solve(chain: Chain, max_memory_bytes: int, *, slots: int = 500, solver: Solver = "fast") -> OptimalTable:
    """Solve the optimal-checkpointing table of ``chain`` once for every budget up to ``max_memory_bytes``.

    Args:
        chain: the cost model.
        max_memory_bytes: the largest budget the table answers for: the whole peak of a step
            as :func:`~edgetrain.core.simulator.simulate` reports it (weights, optimizer state,
            input, activations, gradients, workspaces).
        slots: memory units the activation budget ``max_memory_bytes - chain.resident_bytes``
            is cut into (fewer when a common divisor of all sizes makes the grid exact);
            solve time and table size grow linearly with it.
        solver: ``"fast"`` (numba) or ``"reference"`` (pure Python, for tests and tiny chains).

    Returns:
        An :class:`OptimalTable`; :meth:`~OptimalTable.schedule` rebuilds any budget.

    Raises:
        InfeasibleBudgetError: when nothing fits in ``max_memory_bytes`` on the grid; its
            ``minimum_bytes`` is the exact least budget (no rounding) of this planner.
        ValueError: for ``slots < 1`` or an unknown solver.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> table = solve(Chain.uniform(8), 12)
        >>> [table.time_s(b) for b in (5, 6, 12)]
        [36.0, 24.0, 16.0]
    """
    check_options(slots, solver)
    activation_bytes = max_memory_bytes - chain.resident_bytes
    if activation_bytes < 0:
        raise _infeasible(chain, max_memory_bytes, slots)
    check_length(chain)
    grid = without_paging(discretise(chain, activation_bytes, slots))
    table = OptimalTable(chain, max_memory_bytes, slots, grid, *solve_grid(grid, solver))
    if not np.isfinite(table.top_time_s[-1]) or table.step_bytes > max_memory_bytes:
        raise _infeasible(chain, max_memory_bytes, slots)
    logger.debug("optimal table of %d stages: %d units of %d bytes", chain.length, grid.base.max_units + 1,
                 grid.base.unit_bytes)
    return table


def optimal(chain: Chain, memory_bytes: int, *, slots: int = 500) -> Schedule:
    """The fastest schedule whose simulated peak stays within ``memory_bytes``.

    Solves a table for this one budget and rebuilds it; to sweep budgets, call :func:`solve`
    once with the largest and :meth:`OptimalTable.schedule` for each.

    Args:
        chain: the cost model.
        memory_bytes: the whole peak of the step allowed (see :func:`solve`).
        slots: memory units of the grid.

    Returns:
        A schedule with ``strategy="optimal"`` and ``params`` recording ``slots``,
        ``budget_bytes`` and ``unit_bytes``.

    Raises:
        InfeasibleBudgetError: when nothing fits, carrying the least budget as ``minimum_bytes``.

    Example:
        >>> from edgetrain.core.chain import Chain
        >>> from edgetrain.core.simulator import simulate
        >>> stats = simulate(Chain.uniform(8), optimal(Chain.uniform(8), 6))
        >>> stats.peak_bytes <= 6, stats.time_s
        (True, 24.0)
    """
    return solve(chain, memory_bytes, slots=slots).schedule(memory_bytes)
