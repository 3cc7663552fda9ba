"""``paging-dp``: the optimal-checkpointing DP with paging to storage, minimising energy (or time).

POFO (Beaumont, Eyraud-Dubois, Shilova, "Optimal GPU-CPU offloading strategies for deep neural
network training", Euro-Par 2020) adds offloading to the heterogeneous-chain DP of
``optimal.py``; POET (Patil et al., ICML 2022) prices recomputation and paging in *energy* on
small devices. This module is the same dynamic programme as ``optimal.py`` (read NOTE [ The
optimal DP's sub-problem ] there first) with two more moves and a weighted cost.

NOTE [ The paging DP ]
Besides (a) *record s* and (b) *checkpoint x_k*, when ``x_s`` is held on its own (``e = 1``,
so ``s > 0``):

(a') *record s and page out its input*, for a record that keeps ``x_s`` (``is_s``) and
     ``s < t``: ``Forward(s, all)``, ``PageOut(s)``, ``P(s+1, t)``, ``PageIn(s)``,
     ``Backward(s)``. The child runs with ``A(s)`` more memory; the record's peaks are (a)'s.
     This is paging without recomputation: keep-all with every stage input paged is (a')
     all the way down.
(b') *checkpoint x_k and page out x_s*: ``Forward(s, input)``, ``PageOut(s)``, the advances
     to ``x_k``, ``P(k, t, 1)`` with all of ``m``, ``PageIn(s)``, ``P(s, k-1, 1)`` with
     ``m - g(k..t)``. Peak of the advances: ``d(t+1) + max(A(s) + A(s+1) + wf_s,
     max_{j=s+1..k-1} A(j) + A(j+1) + wf_j)``; a page-out frees ``x_s`` only when it ends
     (NOTE [ Paging time and energy ] in ``schedule.py``), a page-in needs ``A(s)`` from its
     start, which the child's entry already counts.

The cost of a schedule is ``Σ weight × time`` per kind of work: compute (every forward and
backward), page-in and page-out (``latency + bytes / throughput`` per transfer). With the
device's powers as weights it is the step's energy exactly as :func:`~edgetrain.schedule.simulate`
reports it (``energy_j``); with weight 1 everywhere it is the step's time. A deadline is met
by a Lagrangian weight ``λ`` on time added to every power (:func:`paging_dp` searches it): this
is exact at ``λ = 0`` (the least-energy schedule meets the deadline) and otherwise returns the
least energy among the schedules the weighted tables reach, not always the least energy under
the deadline; the ``milp`` planner is exact there.

Only values held on their own are paged (checkpoints and pinned stage inputs); a record's
internal tensors and outputs it keeps stay in RAM, and ``x_0`` (the caller's batch) never moves.
The schedules are persistent and in order, like ``optimal``'s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from ..chain import Chain
from ..energy import EnergyProfile, page_time_s
from ..errors import InfeasibleBudgetError
from ..schedule import Backward, Forward, Keep, Op, PageIn, PageOut, Schedule, Stats, simulate
from .optimal import _ceil_div, _Costs, _discretise, _exact_minimum_bytes, _Grid, _row

__all__ = ["CostWeights", "PagingTable", "solve_paging", "paging_dp"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostWeights:
    """What one second of each kind of work costs: W for energy, 1 for time, plus ``λ`` for a deadline."""

    compute: float
    pagein: float
    pageout: float

    @classmethod
    def energy(cls, profile: EnergyProfile, time_weight: float = 0.0) -> CostWeights:
        """The device's powers (J per second of work), each plus ``time_weight`` (the deadline's λ)."""
        return cls(profile.compute_power_w + time_weight, profile.pagein_power_w + time_weight,
                   profile.pageout_power_w + time_weight)

    @classmethod
    def time(cls) -> CostWeights:
        return cls(1.0, 1.0, 1.0)


@dataclass(frozen=True, eq=False)
class _PagingGrid:
    """``optimal``'s grid with costs in place of times and the arrays of moves (a') and (b')."""

    base: _Grid
    turn_cost: np.ndarray            # [L] weight x (f_s + b_s)
    sweep_cost: np.ndarray           # [L, L+1] weight x (f_s + ... + f_{k-1})
    pageout_cost: np.ndarray         # [L] cost of writing x_s (inf where x_s never pages)
    pagein_cost: np.ndarray          # [L]
    can_page: np.ndarray             # [2, L] whether P(s, ., e) may page x_s
    paged_record_need_units: np.ndarray   # [2, L, L] ceil of (a')'s peaks, its page-in included
    paged_record_hold_units: np.ndarray   # [2, L] what (a') holds from the child; < 0 when it frees x_s
    paged_checkpoint_hold_units: np.ndarray  # [2, L] what (b') holds from P(k, t): 0, or minus x_s
    paged_sweep_bytes: np.ndarray    # [2, L, L+1] peak of (b')'s advances above d(t+1)
    input_saved: np.ndarray          # [L] is_s: (a') with e = 1 pages a record's pinned input
    recompute: bool                  # False: records only, moves (a) and (a'): paging without recomputation


def _paged_sweep_bytes(chain: Chain) -> np.ndarray:
    length, values = chain.length, chain.value_bytes
    sweep = np.zeros((length, length + 1), np.int64)
    for s in range(length):
        peak = values[s] + values[s + 1] + chain.stages[s].fwd_workspace_bytes
        sweep[s, s + 1] = peak
        for j in range(s + 1, length):
            peak = max(peak, values[j] + values[j + 1] + chain.stages[j].fwd_workspace_bytes)
            sweep[s, j + 1] = peak
    return sweep


def _discretise_paging(chain: Chain, activation_budget_bytes: int, slots: int, weights: CostWeights,
                       profile: EnergyProfile, recompute: bool) -> _PagingGrid:
    """The arrays of NOTE [ The paging DP ]; sizes rounded so that what fits in units fits in bytes.

    Memory a move *frees* for a child (``x_s`` counted by the parent's record, ``e = 0``) is
    rounded down, memory it holds rounded up.
    """
    base = _discretise(chain, activation_budget_bytes, slots)
    costs, length, unit, values = _Costs.of(chain), chain.length, base.unit_bytes, chain.value_bytes
    pageout, pagein = np.full(length, math.inf), np.full(length, math.inf)
    can_page = np.zeros((2, length), np.bool_)
    record_need = np.zeros((2, length, length), np.int64)
    record_hold = np.zeros((2, length), np.int64)
    checkpoint_hold = np.zeros((2, length), np.int64)
    unpaged_sweep, paged_sweep = costs.sweep_bytes, _paged_sweep_bytes(chain)
    sweep = np.stack([unpaged_sweep, paged_sweep])
    for s in range(1, length):
        if values[s] == 0:
            continue
        pageout[s] = weights.pageout * page_time_s(values[s], profile, "out")
        pagein[s] = weights.pagein * page_time_s(values[s], profile, "in")
        can_page[1, s] = True
        can_page[0, s] = chain.stages[s - 1].output_saved   # x_s inside the parent's record
        credit = values[s] // unit
        record_hold[1, s] = max(0, _ceil_div(costs.record_hold(0, s), unit))
        record_hold[0, s] = max(0, _ceil_div(costs.record_hold(0, s), unit)) - credit
        checkpoint_hold[0, s] = -credit
        for e in (0, 1):
            for t in range(s, length):
                page_in = costs.record_hold(e, s) + costs.delta_bytes[s + 1] + costs.grads(s + 1, t)
                record_need[e, s, t] = _ceil_div(max(costs.record_peak(e, s, t), page_in), unit)
    return _PagingGrid(base=base, turn_cost=weights.compute * base.turn_time_s,
                       sweep_cost=weights.compute * base.sweep_time_s, pageout_cost=pageout, pagein_cost=pagein,
                       can_page=can_page, paged_record_need_units=record_need, paged_record_hold_units=record_hold,
                       paged_checkpoint_hold_units=checkpoint_hold, paged_sweep_bytes=sweep,
                       input_saved=np.array([stage.input_saved for stage in chain.stages], np.bool_),
                       recompute=recompute)


# Choices: s (record), L + s (record, page x_s), k in s+1..t (checkpoint), L + k (checkpoint, page x_s).

def _solve_reference(grid: _PagingGrid) -> tuple[np.ndarray, np.ndarray]:
    """Memoised recursion over ``C(s, t, m, e)`` with the four moves; the statement the kernel follows.

    Returns ``(cost, choice)`` indexed ``[e, row(s, t), m]``. Ties go to the smallest choice
    code (recording first, then checkpoints by increasing ``k``, then the paged moves).
    """
    g = grid.base
    length = g.length
    turn, sweep_cost = grid.turn_cost.tolist(), grid.sweep_cost.tolist()
    pageout, pagein = grid.pageout_cost.tolist(), grid.pagein_cost.tolist()
    can_page, paged_need = grid.can_page.tolist(), grid.paged_record_need_units.tolist()
    paged_hold, paged_checkpoint = grid.paged_record_hold_units.tolist(), grid.paged_checkpoint_hold_units.tolist()
    paged_sweep, top = grid.paged_sweep_bytes.tolist(), g.max_units
    stages_input_saved = grid.input_saved.tolist()
    child_entry, record_need = g.child_entry.tolist(), g.record_need_units.tolist()
    record_hold, checkpoint_hold = g.record_hold_units.tolist(), g.checkpoint_hold_units.tolist()
    entry_bytes, sweep_bytes = g.entry_bytes.tolist(), g.sweep_bytes.tolist()
    deltas, grads, unit = g.delta_bytes.tolist(), g.grad_units.tolist(), g.unit_bytes

    @cache
    def best(s: int, t: int, m: int, e: int) -> tuple[float, int]:
        if m < 0:
            return math.inf, -1
        found: list[tuple[float, int]] = []
        paging, pages = pageout[s] + pagein[s], can_page[e][s] and math.isfinite(pageout[s] + pagein[s])
        if record_need[e][s][t] <= m:                                            # (a)
            rest = best(s + 1, t, m - record_hold[e][s], child_entry[s])[0] if s < t else 0.0
            found.append((turn[s] + rest, s))
        if pages and s < t and paged_need[e][s][t] <= m and (e == 0 or stages_input_saved[s]):   # (a')
            rest = best(s + 1, t, min(m - paged_hold[e][s], top), child_entry[s])[0]
            found.append(((turn[s] + paging) + rest, length + s))
        for k in range(s + 1, t + 1 if grid.recompute else s + 1):               # (b), (b')
            lower = best(s, k - 1, m - grads[k][t], e)[0]
            if _ceil_div(deltas[t + 1] + entry_bytes[e][s] + sweep_bytes[s][k], unit) <= m:
                found.append((sweep_cost[s][k] + best(k, t, m - checkpoint_hold[e][s], 1)[0] + lower, k))
            if pages and _ceil_div(deltas[t + 1] + paged_sweep[e][s][k], unit) <= m:
                upper = best(k, t, min(m - paged_checkpoint[e][s], top), 1)[0]
                found.append(((sweep_cost[s][k] + paging) + upper + lower, length + k))
        found = [(value, code) for value, code in found if math.isfinite(value)]
        return min(found, default=(math.inf, -1))

    width = g.max_units + 1
    cost = np.full((2, length * (length + 1) // 2, width), np.inf)
    choice = np.full(cost.shape, -1, np.int32)
    for span in range(length):
        for s in range(length - span):
            for e in (0, 1):
                if g.needed[e, s]:
                    for m in range(width):
                        value, code = best(s, s + span, m, e)
                        if math.isfinite(value):
                            cost[e, _row(s, s + span), m], choice[e, _row(s, s + span), m] = value, code
    return cost, choice


def _solve_fast(grid: _PagingGrid) -> tuple[np.ndarray, np.ndarray]:
    try:
        from ._paging_kernel import solve_paging_table
    except ImportError:
        logger.warning("numba is not installed: solving the paging table in pure Python (slow)")
        return _solve_reference(grid)
    g = grid.base
    return solve_paging_table(g.needed, grid.turn_cost, grid.sweep_cost, g.child_entry, g.record_need_units,
                              g.record_hold_units, g.checkpoint_hold_units, g.entry_bytes, g.sweep_bytes,
                              g.delta_bytes, g.grad_units, g.unit_bytes, g.max_units, grid.pageout_cost,
                              grid.pagein_cost, grid.can_page, grid.paged_record_need_units,
                              grid.paged_record_hold_units, grid.paged_checkpoint_hold_units, grid.paged_sweep_bytes,
                              grid.input_saved, grid.recompute)


def _rebuild(grid: _PagingGrid, choice: np.ndarray, units: int) -> tuple[Op, ...]:
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
        paged, k = code >= length, code % length
        if k == s:                         # (a) / (a'): what runs later is pushed first
            stack.append(Backward(s))
            if paged:
                stack.append(PageIn(s))
            if s < t:
                hold = int(grid.paged_record_hold_units[e, s]) if paged else int(g.record_hold_units[e, s])
                stack.append((s + 1, t, min(m - hold, g.max_units), int(g.child_entry[s])))
            ops.append(Forward(s, Keep.ALL))
            if paged:
                ops.append(PageOut(s))
        else:                              # (b) / (b')
            stack.append((s, k - 1, m - int(g.grad_units[k, t]), e))
            if paged:
                stack.append(PageIn(s))
            hold = int(grid.paged_checkpoint_hold_units[e, s]) if paged else int(g.checkpoint_hold_units[e, s])
            stack.append((k, t, min(m - hold, g.max_units), 1))
            ops.append(Forward(s, Keep.INPUT))
            if paged:
                ops.append(PageOut(s))
            ops += [Forward(j, Keep.NONE) for j in range(s + 1, k)]
    return tuple(ops)


@dataclass(frozen=True, eq=False)
class PagingTable:
    """The solved paging table of one chain, device and weighting, for every budget up to ``max_memory_bytes``."""

    chain: Chain
    profile: EnergyProfile
    weights: CostWeights
    max_memory_bytes: int
    slots: int
    grid: _PagingGrid
    top_cost: np.ndarray   # [max_units + 1] C(0, L-1, m, 0)
    choice: np.ndarray

    @property
    def unit_bytes(self) -> int:
        return self.grid.base.unit_bytes

    @property
    def step_bytes(self) -> int:
        chain = self.chain
        return chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes

    @property
    def min_memory_bytes(self) -> int:
        """Smallest budget on this table's grid that some schedule fits in."""
        first_units = int(np.argmax(np.isfinite(self.top_cost)))
        return max(self.chain.resident_bytes + first_units * self.unit_bytes, self.step_bytes)

    def _top_units(self, memory_bytes: int) -> int:
        if memory_bytes > self.max_memory_bytes:
            raise ValueError(f"budget {memory_bytes} bytes is above the table's maximum {self.max_memory_bytes}")
        minimum = self.min_memory_bytes
        if memory_bytes < minimum:
            raise InfeasibleBudgetError(
                f"no paging schedule of {self.chain.name or 'this chain'} fits in {memory_bytes} bytes on a grid "
                f"of {self.unit_bytes}-byte units: the least is {minimum} bytes",
                minimum_bytes=minimum, budget_bytes=memory_bytes)
        return (memory_bytes - self.chain.resident_bytes) // self.unit_bytes

    def cost(self, memory_bytes: int) -> float:
        """The weighted cost (J for energy weights) of the best schedule within ``memory_bytes``."""
        return float(self.top_cost[self._top_units(memory_bytes)])

    def schedule(self, memory_bytes: int) -> Schedule:
        ops = _rebuild(self.grid, self.choice, self._top_units(memory_bytes))
        return Schedule(ops, self.chain.length, strategy="paging-dp",
                        params={"slots": self.slots, "budget_bytes": memory_bytes, "unit_bytes": self.unit_bytes,
                                "weights": [self.weights.compute, self.weights.pagein, self.weights.pageout]})


def solve_paging(chain: Chain, profile: EnergyProfile, max_memory_bytes: int, *, weights: CostWeights | None = None,
                 slots: int = 500, solver: str = "fast", recompute: bool = True) -> PagingTable:
    """Solve the paging table of ``chain`` on a device for every budget up to ``max_memory_bytes``.

    Args:
        chain: the cost model, its stage times the device's (:func:`edgetrain.energy.scale_chain`).
        profile: the device's energy profile (powers; paging latency and throughput).
        max_memory_bytes: the largest whole-step peak the table answers for.
        weights: cost per second of compute / page-in / page-out; default the device's
            powers, so the cost is the step's energy in J.
        slots: memory units of the grid (as :func:`~edgetrain.planners.solve`).
        solver: ``"fast"`` (numba) or ``"reference"`` (pure Python).
        recompute: False restricts the table to schedules without recomputation (records
            only, inputs paged): the paging-only baseline.

    Raises:
        InfeasibleBudgetError: nothing fits; ``minimum_bytes`` is a lower bound of the least
            budget (the step's resident state, gradients and optimizer workspace, or the
            least peak of any one stage's forward and backward).
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if solver not in ("fast", "reference"):
        raise ValueError(f"unknown solver {solver!r}; valid: fast, reference")
    weights = weights or CostWeights.energy(profile)
    activation_bytes = max_memory_bytes - chain.resident_bytes
    if activation_bytes < 0:
        raise _infeasible(chain, max_memory_bytes)
    grid = _discretise_paging(chain, activation_bytes, slots, weights, profile, recompute)
    cost, choice = (_solve_fast if solver == "fast" else _solve_reference)(grid)
    table = PagingTable(chain, profile, weights, max_memory_bytes, slots, grid,
                        cost[0, _row(0, chain.length - 1)].copy(), choice)
    if not np.isfinite(table.top_cost[-1]) or table.step_bytes > max_memory_bytes:
        raise _infeasible(chain, max_memory_bytes)
    return table


def _infeasible(chain: Chain, budget_bytes: int) -> InfeasibleBudgetError:
    """Below the recompute-only minimum paging may still fit; the floor it cannot go below is reported."""
    floor = max(chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes,
                chain.resident_bytes + max(_stage_floor_bytes(chain, i) for i in range(chain.length)))
    floor = min(floor, _exact_minimum_bytes(chain))
    return InfeasibleBudgetError(
        f"no paging schedule of {chain.name or 'this chain'} fits in {budget_bytes} bytes; the recompute-only "
        f"minimum is {_exact_minimum_bytes(chain)} bytes and no schedule goes below {floor} bytes",
        minimum_bytes=floor, budget_bytes=budget_bytes)


def _stage_floor_bytes(chain: Chain, i: int) -> int:
    """Activation memory recording and back-propagating stage ``i`` needs whatever else is paged."""
    stage, values = chain.stages[i], chain.value_bytes
    delta_out = values[i + 1] if i + 1 < chain.length else 0
    delta_in = values[i] if i > 0 else 0
    return max(values[i] + stage.saved_bytes + stage.rec_workspace_bytes,
               stage.saved_bytes + delta_out + delta_in + stage.bwd_workspace_bytes)


@dataclass(frozen=True)
class PagingResult:
    """The schedule ``paging_dp`` chose, what it costs, and the Lagrangian weight that reached the deadline."""

    schedule: Schedule
    stats: Stats
    time_weight: float
    deadline_met: bool


def paging_dp(chain: Chain, profile: EnergyProfile, memory_bytes: int, *, deadline_s: float | None = None,
              slots: int = 500, iterations: int = 30, recompute: bool = True) -> PagingResult:
    """The least-energy recompute + paging schedule within ``memory_bytes`` (and ``deadline_s``).

    Without a deadline, or when the least-energy schedule meets it, the result is the DP's
    optimum. Otherwise a weight ``λ`` (J/s) on time is added to every power and bisected until
    the schedule meets the deadline (NOTE [ The paging DP ]); if even the fastest schedule
    (time-only weights) misses it, that one is returned with ``deadline_met=False``.

    Raises:
        InfeasibleBudgetError: nothing fits in the budget.
    """
    def at(weight: float | None) -> PagingResult:
        weights = CostWeights.time() if weight is None else CostWeights.energy(profile, weight)
        table = solve_paging(chain, profile, memory_bytes, weights=weights, slots=slots, recompute=recompute)
        schedule = table.schedule(memory_bytes)
        stats = simulate(chain, schedule, profile)
        met = deadline_s is None or stats.time_s <= deadline_s * (1 + 1e-12)
        return PagingResult(replace(schedule, params={**schedule.params, "time_weight": weight}), stats,
                            math.inf if weight is None else weight, met)

    best = at(0.0)
    if best.deadline_met:
        return best
    fastest = at(None)
    if not fastest.deadline_met:
        return fastest
    low, high = 0.0, max(profile.compute_power_w, profile.pagein_power_w, profile.pageout_power_w)
    while not (found := at(high)).deadline_met:
        low, high = high, high * 4
        if high > 1e12:
            return fastest
    for _ in range(iterations):
        middle = (low + high) / 2
        trial = at(middle)
        if trial.deadline_met:
            high, found = middle, trial
        else:
            low = middle
    return found
