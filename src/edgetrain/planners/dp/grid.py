"""The checkpointing DP's recurrence and its table over memory units: shared by ``optimal`` and ``paging-dp``.

The recurrence is that of Beaumont et al. 2019 (arXiv:1911.13214; the ``rotor`` library),
re-derived from edgetrain's simulator (NOTE [ The chain memory model ] in ``chain.py``,
``simulator.SimState``), the oracle for every figure, including its ``input_saved`` /
``output_saved`` flags, which the paper's model does not have. ``optimal.py`` is the planner
that solves it for time, ``paging.py`` adds paged moves and weighs time into energy,
``exact.py`` solves it in bytes without a grid.

NOTE [ The optimal DP's sub-problem ]
Notation: ``A(k) = value_bytes[k]``; ``d(k)`` the size of ``δ_k`` (``A(k)`` for ``0 < k < L``,
zero for ``δ_0``, which is never made, and ``δ_L``, which the loss seeds); for stage ``j``:
``f_j, b_j`` times, ``S_j`` saved bytes, ``G_j`` gradient bytes, ``wf_j, wr_j, wb_j``
workspaces, ``is_j, os_j`` whether the record keeps its input / output; ``g(i..j)`` the
gradients of stages ``i..j``.

``P(s, t, e)`` back-propagates stages ``s..t``. On entry ``x_s`` is available, ``δ_{t+1}`` is
present, nothing else of stages ``s..t`` is alive and the gradients of stages ``> t`` exist
(the caller counts them). ``e = 1`` when ``x_s`` is held on its own (a checkpoint, or the
output of a record that does not keep it): then ``P`` counts ``A(s)`` and frees it;
``e = 0`` when ``x_s`` costs ``P`` nothing (``x_0``, or inside the record of stage ``s-1``).
On exit stages ``s..t`` are done, ``δ_s`` is present and ``x_s``, ``x_{t+1}`` are gone.
``C(s, t, m, e)`` is the least time when ``P``'s own memory, ``d(t+1) + e·A(s)`` on entry,
never exceeds ``m``. Two ways to start:

(a) *record* ``s``: ``Forward(s, all)``, ``P(s+1, t, 1 - os_s)`` if ``s < t``, ``Backward(s)``.
    Recording drops ``x_s`` unless ``is_s``; the record holds ``e·is_s·A(s) + S_s`` of which
    ``(1 - os_s)·A(s+1)`` is ``x_{s+1}``, counted by the child. Peaks:
    ``d(t+1) + e·A(s) + S_s + wr_s`` (forward),
    ``e·is_s·A(s) + S_s - (1 - os_s)A(s+1) + d(s+1) + g(s..t) + d(s) + wb_s`` (backward,
    ``wb_s`` may be negative; an unsaved ``x_{s+1}`` is the child's or, when ``s = t``, dead
    after the forward, the loss ``x_L`` aside) and ``d(s) + g(s..t)`` (after it).
(b) *checkpoint* ``x_k``, ``s < k <= t``: ``Forward(s, input)``, ``Forward(s+1..k-1, none)``,
    then ``P(k, t, 1)`` with ``m - e·A(s)`` and ``P(s, k-1, e)`` with ``m - g(k..t)``. Peak of
    the advances: ``d(t+1) + e·A(s) + max_j ([j > s]A(j) + A(j+1) + wf_j)``, ``j = s..k-1``.

At the top, ``P(0, L-1, 0)`` gets ``budget - resident_bytes``, and the optimizer step must
fit: ``resident + g(0..L-1) + optimizer_workspace <= budget``.

The schedules this builds are *persistent* (a checkpoint lives until the backward of its
stage) and *in order* (stage ``i`` is never recorded while stage ``i+1`` is recorded and not
yet back-propagated). Exhaustive search over every 1-4 stage chain we tried confirms the
table is optimal within that class; the simulator allows two more moves, which win on
rare budgets (about 0.1-0.3% of tiny random cases, by up to ~20% of the time): releasing a
checkpoint by advancing from it with ``keep="none"`` and rebuilding it later from an earlier
one, and recording a stage while its successor's record waits for its backward (see
``tests/test_planner_optimal.py``).

Rounding: memory is counted in units of ``unit_bytes``. Each local peak is rounded up as a
whole and each amount handed down to a child (``e·A(s)``, the record, ``g(k..t)``) on its
own, so what fits in units fits in bytes and a rebuilt schedule never exceeds its budget.
Nesting is at most ``L - 1`` deep, so a schedule is charged at most ``L`` roundings: the
table finds every schedule of its class whose simulated peak is ``L * unit_bytes`` below the
budget. When every size is a multiple of a common divisor giving at most ``slots`` units, that
divisor is the unit and the table is exact.

One table serves ``optimal`` and ``paging-dp``: ``paging.py`` adds the paged moves (a') and
(b') of NOTE [ The paging DP ] and weighs time into energy; the recompute-only planner switches
them off and its cost is the time (:func:`without_paging`). The solvers (the pure-Python
:func:`solve_reference`, the statement of the recurrence, and the numba kernel in
``kernel.py``, equal to it bit for bit) and the rebuild live here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, reduce
from typing import Literal, TypeVar

import numpy as np

from ...core.chain import Chain
from ...core.schedule import Backward, Forward, Keep, Op, PageIn, PageInRecord, PageOut, PageOutRecord
from ...errors import InfeasibleBudgetError

__all__ = ["Solver", "SubProblem", "Costs", "Grid", "MovesGrid", "BudgetTable", "RECORD_VARIANTS", "ceil_div", "row",
           "needed_subproblems", "sweep_time_s", "common_unit_bytes", "discretise", "without_paging", "solve_reference",
           "solve_fast", "solve_grid", "rebuild", "replay", "unfold", "check_options", "check_length", "step_bytes"]

logger = logging.getLogger(__name__)

Solver = Literal["fast", "reference"]
Task = TypeVar("Task", bound=tuple[int, ...])  # a sub-problem to rebuild: (s, t, e) or (s, t, memory, e)
SubProblem = tuple[int, int, int, int]           # (s, t, m, e): P(s, t, e) within memory m


def ceil_div(n_bytes: int, unit_bytes: int) -> int:
    """``ceil(n_bytes / unit_bytes)`` in integers."""
    return -(-n_bytes // unit_bytes)


def row(s: int, t: int) -> int:
    """Row of ``P(s, t)`` in the packed triangular table; same layout as the kernel's."""
    return t * (t + 1) // 2 + s


# --- the recurrence in bytes -------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Costs:
    """The byte quantities of NOTE [ The optimal DP's sub-problem ], read once from a chain."""

    chain: Chain
    value_bytes: tuple[int, ...]        # A(k), k = 0..L
    delta_bytes: tuple[int, ...]        # d(k), k = 0..L
    grad_prefix_bytes: tuple[int, ...]  # g(0..k-1), k = 0..L
    sweep_bytes: np.ndarray             # [L, L+1] max_{j=s..k-1} ([j > s]A(j) + A(j+1) + wf_j)

    @classmethod
    def of(cls, chain: Chain) -> Costs:
        length, values = chain.length, chain.value_bytes
        deltas = tuple(values[k] if 0 < k < length else 0 for k in range(length + 1))
        prefix = [0]
        for stage in chain.stages:
            prefix.append(prefix[-1] + stage.grad_bytes)
        sweep = np.zeros((length, length + 1), np.int64)
        for s in range(length):
            peak = 0
            for j in range(s, length):
                held_input = values[j] if j > s else 0
                peak = max(peak, held_input + values[j + 1] + chain.stages[j].fwd_workspace_bytes)
                sweep[s, j + 1] = peak
        return cls(chain, values, deltas, tuple(prefix), sweep)

    def grads(self, first: int, last: int) -> int:
        """``g(first..last)``; zero for an empty range."""
        return self.grad_prefix_bytes[last + 1] - self.grad_prefix_bytes[first] if last >= first else 0

    def entry(self, e: int, s: int) -> int:
        """``e·A(s)``: what ``x_s`` costs the sub-problem on entry."""
        return e * self.value_bytes[s]

    def record_hold(self, e: int, s: int) -> int:
        """Bytes of (a) that the child ``P(s+1, t)`` does not count: dropped ``x_s`` aside, the record."""
        stage = self.chain.stages[s]
        pinned = self.value_bytes[s] if e and stage.input_saved else 0
        output = 0 if stage.output_saved else self.value_bytes[s + 1]
        return pinned + stage.saved_bytes - output

    def record_peak(self, e: int, s: int, t: int) -> int:
        """Largest memory of (a) outside the child: forward, backward and the state after it."""
        return max(self.record_peaks(e, s, t))

    def record_peaks(self, e: int, s: int, t: int) -> tuple[int, int, int]:
        """Memory of (a) outside the child while recording, while back-propagating, and after."""
        stage = self.chain.stages[s]
        forward = self.delta_bytes[t + 1] + self.entry(e, s) + stage.saved_bytes + stage.rec_workspace_bytes
        # x_{t+1} of the last stage is dead once its forward returns (NOTE [ Dead outputs ] in
        # schedule.py), except the loss x_L, which the step returns.
        loss_output = 0 if stage.output_saved or t + 1 < self.chain.length else self.value_bytes[s + 1]
        held = self.record_hold(e, s) + (0 if s < t else loss_output)
        backward = (held + self.delta_bytes[s + 1] + self.grads(s, t) + self.delta_bytes[s]
                    + stage.bwd_workspace_bytes)
        after = self.delta_bytes[s] + self.grads(s, t)
        return forward, backward, after

    def sweep_peak(self, e: int, s: int, k: int, t: int) -> int:
        """Largest memory of the advances ``x_s -> x_k`` of (b)."""
        return self.delta_bytes[t + 1] + self.entry(e, s) + int(self.sweep_bytes[s, k])


def needed_subproblems(chain: Chain) -> np.ndarray:
    """``needed[e, s]``: whether any schedule reaches ``P(s, ., e)``.

    ``x_0`` is never held on its own (``e = 0`` only); ``x_s`` with ``s > 0`` costs nothing
    only inside a record of stage ``s-1`` that keeps its output.
    """
    needed = np.zeros((2, chain.length), np.bool_)
    needed[0, 0] = True
    for s in range(1, chain.length):
        needed[1, s] = True
        needed[0, s] = chain.stages[s - 1].output_saved
    return needed



def sweep_time_s(chain: Chain) -> np.ndarray:
    """``[L, L+1]``: ``f_s + ... + f_{k-1}``, summed in stage order (both solvers add the same way)."""
    length = chain.length
    sweep_time = np.zeros((length, length + 1))
    for s in range(length):
        total = 0.0
        for j in range(s, length):
            total += chain.stages[j].fwd_time_s
            sweep_time[s, j + 1] = total
    return sweep_time



# --- the recurrence in units -------------------------------------------------------------------

def common_unit_bytes(chain: Chain) -> int:
    """Greatest common divisor of every size the recurrence adds (1 when they are all zero)."""
    sizes = [*chain.value_bytes]
    for stage in chain.stages:
        sizes += [stage.saved_bytes, stage.grad_bytes, stage.fwd_workspace_bytes, stage.rec_workspace_bytes,
                  abs(stage.bwd_workspace_bytes)]
    return reduce(math.gcd, sizes, 0) or 1


def _unit_bytes(chain: Chain, activation_budget_bytes: int, slots: int) -> int:
    """The memory unit: the common divisor when it gives ``<= slots`` units (exact), else a slot."""
    common = common_unit_bytes(chain)
    if activation_budget_bytes // common <= slots:
        return common
    return ceil_div(activation_budget_bytes, slots)


@dataclass(frozen=True, eq=False)
class Grid:
    """The recurrence in memory units: what both solvers and the rebuild read.

    Local peaks are rounded up as a whole, amounts handed to a child each on their own
    (NOTE [ The optimal DP's sub-problem ]); indices ``[e, s, t]`` as in the note.
    """

    unit_bytes: int
    max_units: int
    needed: np.ndarray                 # [2, L] bool, see needed_subproblems
    turn_time_s: np.ndarray            # [L] f_s + b_s
    sweep_time_s: np.ndarray           # [L, L+1] f_s + ... + f_{k-1}
    child_entry: np.ndarray            # [L] entry state of P(s+1, t) after recording s: 1 - os_s
    record_need_units: np.ndarray      # [2, L, L] ceil(record_peak)
    record_hold_units: np.ndarray      # [2, L] ceil(record_hold), at least 0
    checkpoint_hold_units: np.ndarray  # [2, L] ceil(e·A(s))
    entry_bytes: np.ndarray            # [2, L] e·A(s); with the next two, the advances' peak
    sweep_bytes: np.ndarray            # [L, L+1]
    delta_bytes: np.ndarray            # [L+1] d(k)
    grad_units: np.ndarray             # [L+1, L] ceil(g(k..t)), 0 when k > t

    @property
    def length(self) -> int:
        return int(self.turn_time_s.shape[0])


def discretise(chain: Chain, activation_budget_bytes: int, slots: int, unit_bytes: int | None = None) -> Grid:
    """The recurrence in units of ``unit_bytes`` (default :func:`_unit_bytes`'s); 1 gives it in bytes, exact."""
    length, costs = chain.length, Costs.of(chain)
    unit = unit_bytes or _unit_bytes(chain, activation_budget_bytes, slots)
    record_need = np.zeros((2, length, length), np.int64)
    grad_units = np.zeros((length + 1, length), np.int64)
    for s in range(length):
        for t in range(s, length):
            grad_units[s, t] = ceil_div(costs.grads(s, t), unit)
            for e in (0, 1):
                record_need[e, s, t] = ceil_div(costs.record_peak(e, s, t), unit)
    pairs = [(e, s) for e in (0, 1) for s in range(length)]
    return Grid(
        unit_bytes=unit,
        max_units=activation_budget_bytes // unit,
        needed=needed_subproblems(chain),
        turn_time_s=np.array([stage.fwd_time_s + stage.bwd_time_s for stage in chain.stages]),
        sweep_time_s=sweep_time_s(chain),
        child_entry=np.array([0 if stage.output_saved else 1 for stage in chain.stages], np.int64),
        record_need_units=record_need,
        record_hold_units=np.array([max(0, ceil_div(costs.record_hold(e, s), unit)) for e, s in pairs],
                                   np.int64).reshape(2, length),
        checkpoint_hold_units=np.array([ceil_div(costs.entry(e, s), unit) for e, s in pairs],
                                       np.int64).reshape(2, length),
        entry_bytes=np.array([costs.entry(e, s) for e, s in pairs], np.int64).reshape(2, length),
        sweep_bytes=costs.sweep_bytes,
        delta_bytes=np.array(costs.delta_bytes, np.int64),
        grad_units=grad_units,
    )


# --- the solvers: one table for recompute-only and paging ----------------------------------

# What move (a') pages of record s: its input x_s (pinned, or the parent's), its internals, or both.
RECORD_VARIANTS = ("value", "internals", "both")


@dataclass(frozen=True, eq=False)
class MovesGrid:
    """The table's input: ``Grid`` with costs in place of times and the arrays of the paged moves.

    The paged moves (a') and (b') are NOTE [ The paging DP ]'s (``paging.py``); the
    recompute-only planner switches them off (:func:`without_paging`).
    """

    base: Grid
    turn_cost: np.ndarray            # [L] weight x (f_s + b_s)
    sweep_cost: np.ndarray           # [L, L+1] weight x (f_s + ... + f_{k-1})
    value_paging_cost: np.ndarray    # [L] page-out + page-in of x_s (inf where x_s never pages)
    value_can_page: np.ndarray       # [2, L] whether P(s, ., e) may page x_s
    record_can_page: np.ndarray      # [3, 2, L] whether (a') variant v applies
    record_paging_cost: np.ndarray   # [3, L] its transfers, both ways
    record_hold_units: np.ndarray    # [3, 2, L] what it holds from the child; < 0 when it frees the parent's x_s
    record_need_units: np.ndarray    # [3, 2, L, L] ceil of (a')'s peaks, its page-ins included
    late: np.ndarray                 # [2, L] x_s paged in after Backward(s): e = 0 and the record drops x_s
    checkpoint_hold_units: np.ndarray  # [2, L] what (b') holds from P(k, t): 0, or minus the parent's x_s
    paged_sweep_bytes: np.ndarray    # [2, L, L+1] peak of (b')'s advances above d(t+1)
    recompute: bool                  # False: records only, moves (a) and (a'): paging without recomputation


def without_paging(grid: Grid) -> MovesGrid:
    """The recompute-only table: moves (a) and (b) alone, their cost the time."""
    length = grid.length
    never = np.zeros((2, length), np.bool_)
    return MovesGrid(base=grid, turn_cost=grid.turn_time_s, sweep_cost=grid.sweep_time_s,
                      value_paging_cost=np.full(length, math.inf), value_can_page=never,
                      record_can_page=np.zeros((3, 2, length), np.bool_),
                      record_paging_cost=np.full((3, length), math.inf),
                      record_hold_units=np.zeros((3, 2, length), np.int64),
                      record_need_units=np.zeros((3, 2, length, length), np.int64), late=never,
                      checkpoint_hold_units=np.zeros((2, length), np.int64),
                      paged_sweep_bytes=np.zeros((2, length, length + 1), np.int64), recompute=True)


# Choice codes: s (record), (v+1)·L + s (record, page variant v), k in s+1..t (checkpoint x_k),
# 4·L + k (checkpoint x_k, page x_s).

def solve_reference(grid: MovesGrid) -> tuple[np.ndarray, np.ndarray]:
    """Memoised recursion over ``C(s, t, m, e)`` with every move; the statement the kernel follows.

    Returns ``(cost, choice)`` indexed ``[e, row(s, t), m]``. Ties go to the smallest choice
    code; sums are formed as in the kernel (move's own cost first, then children in order).
    """
    g = grid.base
    length, top = g.length, g.max_units
    turn, sweep_cost = grid.turn_cost.tolist(), grid.sweep_cost.tolist()
    value_cost, value_can = grid.value_paging_cost.tolist(), grid.value_can_page.tolist()
    record_can, record_cost = grid.record_can_page.tolist(), grid.record_paging_cost.tolist()
    paged_hold, paged_need, late = grid.record_hold_units.tolist(), grid.record_need_units.tolist(), grid.late.tolist()
    paged_checkpoint, paged_sweep = grid.checkpoint_hold_units.tolist(), grid.paged_sweep_bytes.tolist()
    child_entry, record_need = g.child_entry.tolist(), g.record_need_units.tolist()
    record_hold, checkpoint_hold = g.record_hold_units.tolist(), g.checkpoint_hold_units.tolist()
    entry_bytes, sweep_bytes = g.entry_bytes.tolist(), g.sweep_bytes.tolist()
    deltas, grads, unit = g.delta_bytes.tolist(), g.grad_units.tolist(), g.unit_bytes

    @cache
    def best(s: int, t: int, m: int, e: int) -> tuple[float, int]:
        if m < 0:
            return math.inf, -1
        found: list[tuple[float, int]] = []
        if record_need[e][s][t] <= m:                                            # (a)
            rest = best(s + 1, t, m - record_hold[e][s], child_entry[s])[0] if s < t else 0.0
            found.append((turn[s] + rest, s))
        for k in range(s + 1, t + 1 if grid.recompute else s + 1):               # (b)
            if ceil_div(deltas[t + 1] + entry_bytes[e][s] + sweep_bytes[s][k], unit) <= m:
                found.append((sweep_cost[s][k] + best(k, t, m - checkpoint_hold[e][s], 1)[0]
                              + best(s, k - 1, m - grads[k][t], e)[0], k))
        for v in range(3):                                                       # (a')
            alone = s == t and v == 0 and late[e][s]    # page x_s out around the backward that drops it
            if record_can[v][e][s] and (s < t or alone) and paged_need[v][e][s][t] <= m:
                rest = best(s + 1, t, min(m - paged_hold[v][e][s], top), child_entry[s])[0] if s < t else 0.0
                found.append(((turn[s] + record_cost[v][s]) + rest, (v + 1) * length + s))
        if value_can[e][s] and grid.recompute:                                   # (b')
            for k in range(s + 1, t + 1):
                if ceil_div(deltas[t + 1] + paged_sweep[e][s][k], unit) <= m:
                    upper = best(k, t, min(m - paged_checkpoint[e][s], top), 1)[0]
                    lower = best(s, k - 1, m - grads[k][t], e)[0]
                    found.append(((sweep_cost[s][k] + value_cost[s]) + upper + lower, 4 * length + k))
        found = [(value, code) for value, code in found if math.isfinite(value)]
        return min(found, default=(math.inf, -1))

    width = g.max_units + 1
    cost = np.full((2, length * (length + 1) // 2, width), np.inf)
    choice = np.full(cost.shape, -1, np.int16)
    for span in range(length):
        for s in range(length - span):
            for e in (0, 1):
                if g.needed[e, s]:
                    for m in range(width):
                        value, code = best(s, s + span, m, e)
                        if math.isfinite(value):
                            cost[e, row(s, s + span), m], choice[e, row(s, s + span), m] = value, code
    return cost, choice


def solve_fast(grid: MovesGrid) -> tuple[np.ndarray, np.ndarray]:
    """:func:`solve_reference` compiled by numba (``kernel.py``); the reference where numba is missing."""
    try:
        from .kernel import solve_table
    except ImportError:
        logger.warning("numba is not installed: solving the checkpointing table in pure Python (slow)")
        return solve_reference(grid)
    g = grid.base
    return solve_table(g.needed, grid.turn_cost, grid.sweep_cost, g.child_entry, g.record_need_units,
                              g.record_hold_units, g.checkpoint_hold_units, g.entry_bytes, g.sweep_bytes,
                              g.delta_bytes, g.grad_units, g.unit_bytes, g.max_units, grid.value_paging_cost,
                              grid.value_can_page, grid.record_can_page, grid.record_paging_cost,
                              grid.record_hold_units, grid.record_need_units, grid.late, grid.checkpoint_hold_units,
                              grid.paged_sweep_bytes, grid.recompute)


def rebuild(grid: MovesGrid, choice: np.ndarray, units: int) -> tuple[Op, ...]:
    """Replay the table's choices from ``P(0, L-1, 0)`` in ``units``."""
    return replay(grid, lambda s, t, m, e: int(choice[e, row(s, t), m]), units)


def unfold(top: Task, expand: Callable[[Task], tuple[list[Op], list[Task | Op]]]) -> tuple[Op, ...]:
    """The ops of a DP's moves from the sub-problem ``top``, on an explicit stack (chains outgrow Python's recursion).

    ``expand(task)`` gives the ops its move runs first and then, in the order they run after
    those, the ops and sub-problems that follow (stacked in reverse, so the next pops first).
    """
    ops: list[Op] = []
    stack: list[Task | Op] = [top]
    while stack:
        task = stack.pop()
        if isinstance(task, tuple):
            first, then = expand(task)
            ops += first
            stack += reversed(then)
        else:
            ops.append(task)
    return tuple(ops)


def replay(grid: MovesGrid, choose: Callable[[int, int, int, int], int], units: int) -> tuple[Op, ...]:
    """The ops of the moves ``choose(s, t, m, e)`` picks, from ``P(0, L-1, 0)`` in ``units``.

    Choice codes as in :func:`solve_reference`.
    """
    g = grid.base
    length = g.length

    def expand(task: SubProblem) -> tuple[list[Op], list[SubProblem | Op]]:
        s, t, m, e = task
        code = choose(s, t, m, e)
        if code < 0:
            raise AssertionError(f"rebuild reached an infeasible sub-problem P({s}, {t}, {e}) in {m} units")
        kind, k = divmod(code, length)
        then: list[SubProblem | Op] = []
        if k == s and kind < 4:            # (a) / (a')
            variant = RECORD_VARIANTS[kind - 1] if kind else None
            pages_value, pages_internals = variant in ("value", "both"), variant in ("internals", "both")
            value_late = pages_value and bool(grid.late[e, s])
            first: list[Op] = [Forward(s, Keep.ALL)]
            if pages_value:
                first.append(PageOut(s))
            if pages_internals:
                first.append(PageOutRecord(s))
            if s < t:
                hold = int(g.record_hold_units[e, s]) if kind == 0 else int(grid.record_hold_units[kind - 1, e, s])
                then.append((s + 1, t, min(m - hold, g.max_units), int(g.child_entry[s])))
            if pages_value and not value_late:
                then.append(PageIn(s))
            if pages_internals:
                then.append(PageInRecord(s))
            then.append(Backward(s))
            if value_late:
                then.append(PageIn(s))
            return first, then
        paged = kind == 4                  # (b) / (b')
        first = [Forward(s, Keep.INPUT)]
        if paged:
            first.append(PageOut(s))
        first += [Forward(j, Keep.NONE) for j in range(s + 1, k)]
        hold = int(grid.checkpoint_hold_units[e, s]) if paged else int(g.checkpoint_hold_units[e, s])
        then.append((k, t, min(m - hold, g.max_units), 1))
        if paged:
            then.append(PageIn(s))
        then.append((s, k - 1, m - int(g.grad_units[k, t]), e))
        return first, then

    return unfold((0, length - 1, units, 0), expand)


def check_options(slots: int, solver: str) -> None:
    """Refuse ``slots < 1`` and unknown solvers."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if solver not in ("fast", "reference"):
        raise ValueError(f"unknown solver {solver!r}; valid: fast, reference")


def solve_grid(grid: MovesGrid, solver: str) -> tuple[np.ndarray, np.ndarray]:
    """``(top, choice)``: the best value of the whole chain per memory unit, and the choice table."""
    cost, choice = (solve_fast if solver == "fast" else solve_reference)(grid)
    return cost[0, row(0, grid.base.length - 1)].copy(), choice


def step_bytes(chain: Chain) -> int:
    """What the optimizer step needs whatever the schedule: resident state, all gradients, workspace."""
    return chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes


def check_length(chain: Chain) -> None:
    """Refuse chains whose move codes (up to ``5 L``) overflow the int16 choice table."""
    longest = (2**15 - 1) // 5
    if chain.length > longest:
        raise ValueError(f"a chain of {chain.length} stages is too long for the table (at most {longest})")



class BudgetTable:
    """What a solved table answers about budgets, whatever it minimises: time (``optimal.py``), energy (``paging.py``).

    A subclass provides ``chain``, ``max_memory_bytes``, ``grid`` and ``top_values``, the best
    value of the whole chain per memory unit (inf where nothing fits).
    """

    chain: Chain
    max_memory_bytes: int
    grid: MovesGrid
    kind = "schedule"

    @property
    def unit_bytes(self) -> int:
        """Size of one memory unit of the grid."""
        return self.grid.base.unit_bytes

    @property
    def top_values(self) -> np.ndarray:
        raise NotImplementedError

    @property
    def step_bytes(self) -> int:
        """What the optimizer step needs whatever the schedule: resident state, all gradients, workspace."""
        return step_bytes(self.chain)

    @property
    def min_memory_bytes(self) -> int:
        """Smallest budget on this table's grid that some schedule fits in."""
        first_units = int(np.argmax(np.isfinite(self.top_values)))
        return max(self.chain.resident_bytes + first_units * self.unit_bytes, self.step_bytes)

    def _top_units(self, memory_bytes: int) -> int:
        """Units of ``P(0, L-1)`` for ``memory_bytes``; raises when nothing fits."""
        if memory_bytes > self.max_memory_bytes:
            raise ValueError(f"budget {memory_bytes} bytes is above the table's maximum "
                             f"{self.max_memory_bytes}; solve a table for it")
        minimum = self.min_memory_bytes
        if memory_bytes < minimum:
            raise InfeasibleBudgetError(
                f"no {self.kind} of {self.chain.name or 'this chain'} fits in {memory_bytes} bytes on a grid of "
                f"{self.unit_bytes}-byte units: the least is {minimum} bytes",
                minimum_bytes=minimum, budget_bytes=memory_bytes)
        return (memory_bytes - self.chain.resident_bytes) // self.unit_bytes
