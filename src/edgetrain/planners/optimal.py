"""Optimal checkpointing of a heterogeneous chain by dynamic programming over memory units.

O. Beaumont, L. Eyraud-Dubois, J. Herrmann, A. Joly, A. Shilova, "Optimal checkpointing for
heterogeneous chains: how to train deep neural networks with limited memory", 2019
(arXiv:1911.13214; the ``rotor`` library). As there, the work is split in two: *solve* a
table of the least time of every sub-chain for every memory budget once, then *rebuild* the
schedule of any budget from the recorded choices, so a budget sweep costs one solve. The
recurrence is re-derived from edgetrain's simulator (NOTE [ The chain memory model ] in
``chain.py``, ``schedule._State``), the oracle for every figure, including its
``input_saved`` / ``output_saved`` flags, which the paper's model does not have.

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

One table serves this planner and ``paging-dp``: ``paging.py`` adds the paged moves (a') and
(b') of NOTE [ The paging DP ] and weighs time into energy; here they are switched off and the
cost is the time (:func:`_without_paging`). The solvers (the pure-Python ``_solve_reference``,
the statement of the recurrence, and the numba kernel in ``_dp_kernel.py``, equal to it bit for
bit) and the rebuild live here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import cache, reduce
from typing import Literal

import numpy as np

from ..chain import Chain
from ..errors import InfeasibleBudgetError
from ..schedule import Backward, Forward, Keep, Op, PageIn, PageInRecord, PageOut, PageOutRecord, Schedule

__all__ = ["OptimalTable", "ExactTable", "Solver", "solve", "solve_exact", "exact_minimum_bytes", "optimal"]

logger = logging.getLogger(__name__)

Solver = Literal["fast", "reference"]


def _ceil_div(n_bytes: int, unit_bytes: int) -> int:
    return -(-n_bytes // unit_bytes)


def _row(s: int, t: int) -> int:
    """Row of ``P(s, t)`` in the packed triangular table; same layout as the kernel's."""
    return t * (t + 1) // 2 + s


# --- the recurrence in bytes -------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Costs:
    """The byte quantities of NOTE [ The optimal DP's sub-problem ], read once from a chain."""

    chain: Chain
    value_bytes: tuple[int, ...]        # A(k), k = 0..L
    delta_bytes: tuple[int, ...]        # d(k), k = 0..L
    grad_prefix_bytes: tuple[int, ...]  # g(0..k-1), k = 0..L
    sweep_bytes: np.ndarray             # [L, L+1] max_{j=s..k-1} ([j > s]A(j) + A(j+1) + wf_j)

    @classmethod
    def of(cls, chain: Chain) -> _Costs:
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


def _needed(chain: Chain) -> np.ndarray:
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


def exact_minimum_bytes(chain: Chain) -> int:
    """Least budget, in bytes and without rounding, of any schedule the recurrence builds.

    The same recurrence with ``max`` for memory in place of ``+`` for time (``O(L^3)``);
    it tells a caller what a request needs when a table has no feasible entry.
    """
    costs, length = _Costs.of(chain), chain.length
    child_entry = [0 if stage.output_saved else 1 for stage in chain.stages]

    @cache
    def least(s: int, t: int, e: int) -> int:
        record = costs.record_peak(e, s, t)
        if s < t:
            record = max(record, costs.record_hold(e, s) + least(s + 1, t, child_entry[s]))
        checkpoints = (max(costs.sweep_peak(e, s, k, t), costs.entry(e, s) + least(k, t, 1),
                           costs.grads(k, t) + least(s, k - 1, e)) for k in range(s + 1, t + 1))
        return min([record, *checkpoints])

    for span in range(length):          # fill bottom-up so the recursion stays shallow
        for s in range(length - span):
            for e in (0, 1):
                least(s, s + span, e)
    step = chain.gradients_bytes + chain.optimizer_workspace_bytes
    return chain.resident_bytes + max(least(0, length - 1, 0), step)


def _sweep_time_s(chain: Chain) -> np.ndarray:
    """``[L, L+1]``: ``f_s + ... + f_{k-1}``, summed in stage order (both solvers add the same way)."""
    length = chain.length
    sweep_time = np.zeros((length, length + 1))
    for s in range(length):
        total = 0.0
        for j in range(s, length):
            total += chain.stages[j].fwd_time_s
            sweep_time[s, j + 1] = total
    return sweep_time


_exact_minimum_bytes = exact_minimum_bytes  # the name tests/test_planner_optimal.py reads; move it to the public one


# --- the recurrence in units -------------------------------------------------------------------

def _common_unit_bytes(chain: Chain) -> int:
    """Greatest common divisor of every size the recurrence adds (1 when they are all zero)."""
    sizes = [*chain.value_bytes]
    for stage in chain.stages:
        sizes += [stage.saved_bytes, stage.grad_bytes, stage.fwd_workspace_bytes, stage.rec_workspace_bytes,
                  abs(stage.bwd_workspace_bytes)]
    return reduce(math.gcd, sizes, 0) or 1


def _unit_bytes(chain: Chain, activation_budget_bytes: int, slots: int) -> int:
    """The memory unit: the common divisor when it gives ``<= slots`` units (exact), else a slot."""
    common = _common_unit_bytes(chain)
    if activation_budget_bytes // common <= slots:
        return common
    return _ceil_div(activation_budget_bytes, slots)


@dataclass(frozen=True, eq=False)
class _Grid:
    """The recurrence in memory units: what both solvers and the rebuild read.

    Local peaks are rounded up as a whole, amounts handed to a child each on their own
    (NOTE [ The optimal DP's sub-problem ]); indices ``[e, s, t]`` as in the note.
    """

    unit_bytes: int
    max_units: int
    needed: np.ndarray                 # [2, L] bool, see _needed
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


def _discretise(chain: Chain, activation_budget_bytes: int, slots: int) -> _Grid:
    length, costs = chain.length, _Costs.of(chain)
    unit = _unit_bytes(chain, activation_budget_bytes, slots)
    record_need = np.zeros((2, length, length), np.int64)
    grad_units = np.zeros((length + 1, length), np.int64)
    for s in range(length):
        for t in range(s, length):
            grad_units[s, t] = _ceil_div(costs.grads(s, t), unit)
            for e in (0, 1):
                record_need[e, s, t] = _ceil_div(costs.record_peak(e, s, t), unit)
    pairs = [(e, s) for e in (0, 1) for s in range(length)]
    return _Grid(
        unit_bytes=unit,
        max_units=activation_budget_bytes // unit,
        needed=_needed(chain),
        turn_time_s=np.array([stage.fwd_time_s + stage.bwd_time_s for stage in chain.stages]),
        sweep_time_s=_sweep_time_s(chain),
        child_entry=np.array([0 if stage.output_saved else 1 for stage in chain.stages], np.int64),
        record_need_units=record_need,
        record_hold_units=np.array([max(0, _ceil_div(costs.record_hold(e, s), unit)) for e, s in pairs],
                                   np.int64).reshape(2, length),
        checkpoint_hold_units=np.array([_ceil_div(costs.entry(e, s), unit) for e, s in pairs],
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
class _MovesGrid:
    """The table's input: ``_Grid`` with costs in place of times and the arrays of the paged moves.

    The paged moves (a') and (b') are NOTE [ The paging DP ]'s (``paging.py``); the
    recompute-only planner switches them off (:func:`_without_paging`).
    """

    base: _Grid
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


def _without_paging(grid: _Grid) -> _MovesGrid:
    """The recompute-only table: moves (a) and (b) alone, their cost the time."""
    length = grid.length
    never = np.zeros((2, length), np.bool_)
    return _MovesGrid(base=grid, turn_cost=grid.turn_time_s, sweep_cost=grid.sweep_time_s,
                      value_paging_cost=np.full(length, math.inf), value_can_page=never,
                      record_can_page=np.zeros((3, 2, length), np.bool_),
                      record_paging_cost=np.full((3, length), math.inf),
                      record_hold_units=np.zeros((3, 2, length), np.int64),
                      record_need_units=np.zeros((3, 2, length, length), np.int64), late=never,
                      checkpoint_hold_units=np.zeros((2, length), np.int64),
                      paged_sweep_bytes=np.zeros((2, length, length + 1), np.int64), recompute=True)


# Choice codes: s (record), (v+1)·L + s (record, page variant v), k in s+1..t (checkpoint x_k),
# 4·L + k (checkpoint x_k, page x_s).

def _solve_reference(grid: _MovesGrid) -> tuple[np.ndarray, np.ndarray]:
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
            if _ceil_div(deltas[t + 1] + entry_bytes[e][s] + sweep_bytes[s][k], unit) <= m:
                found.append((sweep_cost[s][k] + best(k, t, m - checkpoint_hold[e][s], 1)[0]
                              + best(s, k - 1, m - grads[k][t], e)[0], k))
        for v in range(3):                                                       # (a')
            alone = s == t and v == 0 and late[e][s]    # page x_s out around the backward that drops it
            if record_can[v][e][s] and (s < t or alone) and paged_need[v][e][s][t] <= m:
                rest = best(s + 1, t, min(m - paged_hold[v][e][s], top), child_entry[s])[0] if s < t else 0.0
                found.append(((turn[s] + record_cost[v][s]) + rest, (v + 1) * length + s))
        if value_can[e][s] and grid.recompute:                                   # (b')
            for k in range(s + 1, t + 1):
                if _ceil_div(deltas[t + 1] + paged_sweep[e][s][k], unit) <= m:
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
                            cost[e, _row(s, s + span), m], choice[e, _row(s, s + span), m] = value, code
    return cost, choice


def _solve_fast(grid: _MovesGrid) -> tuple[np.ndarray, np.ndarray]:
    try:
        from ._dp_kernel import solve_table
    except ImportError:
        logger.warning("numba is not installed: solving the checkpointing table in pure Python (slow)")
        return _solve_reference(grid)
    g = grid.base
    return solve_table(g.needed, grid.turn_cost, grid.sweep_cost, g.child_entry, g.record_need_units,
                              g.record_hold_units, g.checkpoint_hold_units, g.entry_bytes, g.sweep_bytes,
                              g.delta_bytes, g.grad_units, g.unit_bytes, g.max_units, grid.value_paging_cost,
                              grid.value_can_page, grid.record_can_page, grid.record_paging_cost,
                              grid.record_hold_units, grid.record_need_units, grid.late, grid.checkpoint_hold_units,
                              grid.paged_sweep_bytes, grid.recompute)


def _rebuild(grid: _MovesGrid, choice: np.ndarray, units: int) -> tuple[Op, ...]:
    """Replay the choices from ``P(0, L-1, 0)`` (explicit stack: chains outgrow Python's recursion)."""
    g = grid.base
    length = g.length
    ops: list[Op] = []
    stack: list[tuple[int, int, int, int] | Op] = [(0, length - 1, units, 0)]
    while stack:
        task = stack.pop()
        if not isinstance(task, tuple):
            ops.append(task)
            continue
        s, t, m, e = task
        code = int(choice[e, _row(s, t), m])
        if code < 0:
            raise AssertionError(f"rebuild reached an infeasible sub-problem P({s}, {t}, {e}) in {m} units")
        kind, k = divmod(code, length)
        if k == s and kind < 4:            # (a) / (a'): what runs later is pushed first
            variant = RECORD_VARIANTS[kind - 1] if kind else None
            value_late = variant in ("value", "both") and bool(grid.late[e, s])
            if value_late:
                stack.append(PageIn(s))
            stack.append(Backward(s))
            if variant in ("internals", "both"):
                stack.append(PageInRecord(s))
            if variant in ("value", "both") and not value_late:
                stack.append(PageIn(s))
            if s < t:
                hold = int(g.record_hold_units[e, s]) if kind == 0 else int(grid.record_hold_units[kind - 1, e, s])
                stack.append((s + 1, t, min(m - hold, g.max_units), int(g.child_entry[s])))
            ops.append(Forward(s, Keep.ALL))
            if variant in ("value", "both"):
                ops.append(PageOut(s))
            if variant in ("internals", "both"):
                ops.append(PageOutRecord(s))
        else:                              # (b) / (b')
            paged = kind == 4
            stack.append((s, k - 1, m - int(g.grad_units[k, t]), e))
            if paged:
                stack.append(PageIn(s))
            hold = int(grid.checkpoint_hold_units[e, s]) if paged else int(g.checkpoint_hold_units[e, s])
            stack.append((k, t, min(m - hold, g.max_units), 1))
            ops.append(Forward(s, Keep.INPUT))
            if paged:
                ops.append(PageOut(s))
            ops += [Forward(j, Keep.NONE) for j in range(s + 1, k)]
    return tuple(ops)


def _infeasible(chain: Chain, budget_bytes: int, slots: int) -> InfeasibleBudgetError:
    """The error for a table with no feasible entry: below the exact minimum, or lost to rounding."""
    minimum = exact_minimum_bytes(chain)
    if budget_bytes < minimum:
        return _below_exact_minimum(chain, budget_bytes, minimum)
    name = chain.name or "this chain"
    activation = budget_bytes - chain.resident_bytes
    largest_unit_bytes = max(1, (budget_bytes - minimum) // chain.length)
    return InfeasibleBudgetError(
        f"{budget_bytes} bytes is at least the exact minimum {minimum} of {name} but too close to it for a "
        f"grid of {slots} slots (each stage may lose a slot to rounding); use slots >= "
        f"{_ceil_div(activation, largest_unit_bytes)} or a larger budget",
        minimum_bytes=minimum, budget_bytes=budget_bytes)


def _below_exact_minimum(chain: Chain, budget_bytes: int, minimum_bytes: int) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(f"no checkpointing schedule of {chain.name or 'this chain'} fits in {budget_bytes} "
                                 f"bytes: it needs at least {minimum_bytes} bytes", minimum_bytes=minimum_bytes,
                                 budget_bytes=budget_bytes)


def _check_options(slots: int, solver: str) -> None:
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if solver not in ("fast", "reference"):
        raise ValueError(f"unknown solver {solver!r}; valid: fast, reference")


def _solve_grid(grid: _MovesGrid, solver: str) -> tuple[np.ndarray, np.ndarray]:
    """``(top, choice)``: the best value of the whole chain per memory unit, and the choice table."""
    cost, choice = (_solve_fast if solver == "fast" else _solve_reference)(grid)
    return cost[0, _row(0, grid.base.length - 1)].copy(), choice


def _step_bytes(chain: Chain) -> int:
    """What the optimizer step needs whatever the schedule: resident state, all gradients, workspace."""
    return chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes


def _check_length(chain: Chain) -> None:
    """Refuse chains whose move codes (up to ``5 L``) overflow the int16 choice table."""
    longest = (2**15 - 1) // 5
    if chain.length > longest:
        raise ValueError(f"a chain of {chain.length} stages is too long for the table (at most {longest})")


# --- the recurrence in bytes, without a grid -------------------------------------------------

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


def _record_move(costs: _Costs, fronts: dict[tuple[int, int, int], _Front], turn_s: float, e: int, s: int,
                 t: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps of move (a): record ``s``, then ``P(s+1, t)`` beside the record."""
    need = costs.record_peak(e, s, t)
    if s == t:
        return np.array([need], np.int64), np.array([turn_s])
    stage = costs.chain.stages[s]
    child = fronts[0 if stage.output_saved else 1, s + 1, t]
    return np.maximum(need, child.need_bytes + costs.record_hold(e, s)), turn_s + child.time_s


def _checkpoint_move(costs: _Costs, fronts: dict[tuple[int, int, int], _Front], sweep_s: float, e: int, s: int,
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

    The moves and sums of ``_solve_reference`` without the grid: a step function per
    sub-problem instead of a row of units, so no schedule of the class is lost to rounding.
    """
    costs, length, needed = _Costs.of(chain), chain.length, _needed(chain)
    turn = [stage.fwd_time_s + stage.bwd_time_s for stage in chain.stages]
    sweep = _sweep_time_s(chain).tolist()
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
    """``_rebuild`` in bytes: replay the steps' moves from ``P(0, L-1, 0)``."""
    costs = _Costs.of(chain)
    ops: list[Op] = []
    stack: list[tuple[int, int, int, int] | Op] = [(0, chain.length - 1, activation_bytes, 0)]
    while stack:
        task = stack.pop()
        if not isinstance(task, tuple):
            ops.append(task)
            continue
        s, t, m, e = task
        front = fronts[e, s, t]
        step = int(front.index(m))
        if step < 0:
            raise AssertionError(f"rebuild reached an infeasible sub-problem P({s}, {t}, {e}) in {m} bytes")
        k = int(front.code[step])
        if k == s:                         # (a): what runs later is pushed first
            stack.append(Backward(s))
            if s < t:
                stack.append((s + 1, t, m - costs.record_hold(e, s), 0 if chain.stages[s].output_saved else 1))
            ops.append(Forward(s, Keep.ALL))
        else:                              # (b)
            stack.append((s, k - 1, m - costs.grads(k, t), e))
            stack.append((k, t, m - costs.entry(e, s), 1))
            ops.append(Forward(s, Keep.INPUT))
            ops += [Forward(j, Keep.NONE) for j in range(s + 1, k)]
    return tuple(ops)


# --- the table and the public functions -------------------------------------------------------

class BudgetTable:
    """What a solved table answers about budgets, whatever it minimises (time here, energy in ``paging.py``).

    A subclass provides ``chain``, ``max_memory_bytes``, ``grid`` and ``top_values``, the best
    value of the whole chain per memory unit (inf where nothing fits).
    """

    chain: Chain
    max_memory_bytes: int
    grid: _MovesGrid
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
        return _step_bytes(self.chain)

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


@dataclass(frozen=True, eq=False)
class OptimalTable(BudgetTable):
    """The solved table of one chain for every budget up to ``max_memory_bytes``.

    It keeps what rebuilding needs: ``choice[e, row(s, t), m]``, the decision reaching the
    least time of sub-chain ``s..t`` in ``m`` memory units (NOTE [ The optimal DP's
    sub-problem ]), and ``top_time_s[m]``, the least time of the whole chain. The times of
    the sub-chains (8 bytes per entry against 2) are dropped once solved.

    Example:
        >>> from edgetrain.chain import Chain
        >>> table = solve(Chain.uniform(10), 20)
        >>> table.time_s(20), table.min_memory_bytes
        (20.0, 5)
    """

    chain: Chain
    max_memory_bytes: int
    slots: int
    grid: _MovesGrid
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
        costs = _Costs.of(self.chain)
        clamped = sum(max(0, -costs.record_hold(e, s)) for s in range(self.chain.length) for e in (0, 1))
        exact = self.unit_bytes == _common_unit_bytes(self.chain)
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
        ops = _rebuild(self.grid, self.choice, self._top_units(memory_bytes))
        return Schedule(ops, self.chain.length, strategy="optimal",
                        params={"slots": self.slots, "budget_bytes": memory_bytes, "unit_bytes": self.unit_bytes})


def solve(chain: Chain, max_memory_bytes: int, *, slots: int = 500, solver: Solver = "fast") -> OptimalTable:
    """Solve the optimal-checkpointing table of ``chain`` once for every budget up to ``max_memory_bytes``.

    Args:
        chain: the cost model.
        max_memory_bytes: the largest budget the table answers for: the whole peak of a step
            as :func:`~edgetrain.schedule.simulate` reports it (weights, optimizer state,
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
        >>> from edgetrain.chain import Chain
        >>> table = solve(Chain.uniform(8), 12)
        >>> [table.time_s(b) for b in (5, 6, 12)]
        [36.0, 24.0, 16.0]
    """
    _check_options(slots, solver)
    activation_bytes = max_memory_bytes - chain.resident_bytes
    if activation_bytes < 0:
        raise _infeasible(chain, max_memory_bytes, slots)
    _check_length(chain)
    grid = _without_paging(_discretise(chain, activation_bytes, slots))
    table = OptimalTable(chain, max_memory_bytes, slots, grid, *_solve_grid(grid, solver))
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
        >>> from edgetrain.chain import Chain
        >>> from edgetrain.schedule import simulate
        >>> stats = simulate(Chain.uniform(8), optimal(Chain.uniform(8), 6))
        >>> stats.peak_bytes <= 6, stats.time_s
        (True, 24.0)
    """
    return solve(chain, memory_bytes, slots=slots).schedule(memory_bytes)


@dataclass(frozen=True, eq=False)
class ExactTable:
    """The optimal DP of one chain for every budget up to ``max_memory_bytes``, counted in bytes.

    The same recurrence and moves as :class:`OptimalTable` with no memory grid: each
    sub-problem's least time is a step function of its memory, so no schedule of the class is
    lost to rounding, however close the budget is to the least one. It costs more than a table
    of a few hundred slots (the steps of a sub-problem can number thousands), so :func:`plan`
    solves it only where a table cannot vouch for its answer.

    Example:
        >>> from edgetrain.chain import Chain
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
        return max(self.chain.resident_bytes + int(self._top.need_bytes[0]), _step_bytes(self.chain))

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
        return Schedule(ops, self.chain.length, strategy="optimal", params={"budget_bytes": memory_bytes, "exact": True})

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
    _check_length(chain)
    minimum = exact_minimum_bytes(chain)
    if max_memory_bytes < minimum:
        raise _below_exact_minimum(chain, max_memory_bytes, minimum)
    return ExactTable(chain, max_memory_bytes, _solve_fronts(chain, max_memory_bytes - chain.resident_bytes))
