"""``paging-dp``: the optimal-checkpointing DP with paging to storage, minimising energy (or time).

POFO (Beaumont, Eyraud-Dubois, Shilova, "Optimal GPU-CPU offloading strategies for deep neural
network training", Euro-Par 2020) adds offloading to the heterogeneous-chain DP of
``optimal.py``; POET (Patil et al., ICML 2022) prices recomputation and paging in *energy* on
small devices. This module is the same dynamic programme as ``optimal.py`` (read NOTE [ The
optimal DP's sub-problem ] in ``grid.py`` first) with two more moves and a weighted cost.

NOTE [ The paging DP ]
Besides (a) *record s* and (b) *checkpoint x_k*:

(a') *record s and page*, for ``s < t``: ``Forward(s, all)``, then ``PageOut(s)`` and/or
     ``PageOutRecord(s)``, ``P(s+1, t)``, the matching page-ins, ``Backward(s)``. Three
     variants page ``x_s`` (a pinned input when ``e = 1``; when ``e = 0`` the parent's record
     keeps ``x_s`` and paging it frees memory the parent counted: a *credit*, rounded down),
     the record's internals (``saved_bytes - out_bytes``), or both. The child runs with that
     much more memory; the peaks are (a)'s plus the state when everything is paged back in
     before the backward. This is paging without recomputation: keep-all with every record
     paged is (a') all the way down.
(b') *checkpoint x_k and page out x_s* (``x_s`` held on its own, ``e = 1``, or in the parent's
     record, ``e = 0``): ``Forward(s, input)``, ``PageOut(s)``, the advances to ``x_k``,
     ``P(k, t, 1)`` with ``m`` (plus the credit), ``PageIn(s)``, ``P(s, k-1, e)`` with
     ``m - g(k..t)``. Peak of the advances (``e = 1``): ``d(t+1) + max(A(s) + A(s+1) + wf_s,
     max_{j=s+1..k-1} A(j) + A(j+1) + wf_j)``; a page-out frees ``x_s`` only when it ends
     (NOTE [ Paging time and energy ] in ``schedule.py``), a page-in needs ``A(s)`` from its
     start, which the child's entry already counts.

The cost of a schedule is ``Σ weight × time`` per kind of work: compute (every forward and
backward), page-in and page-out (``latency + bytes / throughput`` per transfer). With the
device's powers as weights it is the step's energy exactly as :func:`~edgetrain.core.simulator.simulate`
reports it (``energy_j``); with weight 1 everywhere it is the step's time. A deadline is met
by a Lagrangian weight ``λ`` on time added to every power (:func:`paging_dp` searches it): this
is exact at ``λ = 0`` (the least-energy schedule meets the deadline) and otherwise returns the
least energy among the schedules the weighted tables reach, not always the least energy under
the deadline; the ``milp`` planner is exact there.

A record's output is paged by the child that reads it (as its ``e = 0`` input); ``x_0`` (the
caller's batch) never moves. The schedules are persistent and in order, like ``optimal``'s.
Near its least budget a grid can round every schedule away: :func:`least_paging_peak` solves the
recurrence in bytes for the least budget, and :func:`paging_dp` answers every budget from it
(NOTE [ Paging near the least budget ]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...core.chain import Chain
from ...core.schedule import Schedule, keep_all
from ...core.simulator import Stats, simulate
from ...costs.energy import EnergyProfile, page_time_s
from ...errors import InfeasibleBudgetError
from .grid import (
    BudgetTable,
    Costs,
    MovesGrid,
    ceil_div,
    check_length,
    check_options,
    discretise,
    rebuild,
    replay,
    solve_grid,
    step_bytes,
)

__all__ = ["CostWeights", "PagingTable", "LeastPeak", "solve_paging", "least_paging_peak", "paging_dp"]


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


def _transfers_cost(n_bytes: int, weights: CostWeights, profile: EnergyProfile) -> float:
    """Weighted cost of writing ``n_bytes`` out and reading them back; inf for nothing to move."""
    if n_bytes <= 0:
        return math.inf
    return (weights.pageout * page_time_s(n_bytes, profile, "out")
            + weights.pagein * page_time_s(n_bytes, profile, "in"))


def _discretise_paging(chain: Chain, activation_budget_bytes: int, slots: int, weights: CostWeights,
                       profile: EnergyProfile, recompute: bool, unit_bytes: int | None = None) -> MovesGrid:
    """The arrays of NOTE [ The paging DP ]; sizes rounded so that what fits in units fits in bytes.

    Memory a move *frees* for a child (``x_s`` counted by the parent's record, ``e = 0``) is
    rounded down, memory it holds rounded up. ``unit_bytes=1`` gives them in bytes, unrounded.
    """
    base = discretise(chain, activation_budget_bytes, slots, unit_bytes)
    costs, length, unit, values = Costs.of(chain), chain.length, base.unit_bytes, chain.value_bytes
    value_cost = np.array([_transfers_cost(values[s] if s > 0 else 0, weights, profile) for s in range(length)])
    value_can = np.zeros((2, length), np.bool_)
    record_can = np.zeros((3, 2, length), np.bool_)
    record_cost = np.full((3, length), math.inf)
    record_hold = np.zeros((3, 2, length), np.int64)
    record_need = np.zeros((3, 2, length, length), np.int64)
    late = np.zeros((2, length), np.bool_)
    checkpoint_hold = np.zeros((2, length), np.int64)
    for s in range(length):
        stage = chain.stages[s]
        internals = stage.saved_bytes - stage.out_bytes
        value_can[1, s] = s > 0 and values[s] > 0
        value_can[0, s] = s > 0 and values[s] > 0 and chain.stages[s - 1].output_saved  # in the parent's record
        credit = values[s] // unit if value_can[0, s] else 0
        checkpoint_hold[0, s] = -credit
        record_cost[:, s] = (value_cost[s], _transfers_cost(internals, weights, profile),
                             value_cost[s] + _transfers_cost(internals, weights, profile))
        late[0, s] = value_can[0, s] and not stage.input_saved
        for e in (0, 1):
            value = value_can[e, s] and (e == 0 or stage.input_saved)   # e = 1: only a pinned input frees memory
            held = costs.record_hold(e, s)
            pinned = values[s] if e == 1 else 0
            record_can[:, e, s] = (value, internals > 0, value and internals > 0)
            record_hold[:, e, s] = (ceil_div(held - pinned, unit) - credit * (1 - e),
                                    ceil_div(held - internals, unit),
                                    ceil_div(held - pinned - internals, unit) - credit * (1 - e))
            for t in range(s, length):
                forward, backward, after = costs.record_peaks(e, s, t)
                page_in = held + costs.delta_bytes[s + 1] + costs.grads(s + 1, t)
                early = ceil_div(max(forward, backward, after, page_in), unit)
                if late[e, s]:   # x_s stays out through the backward: it frees the parent's bytes there too
                    freed = credit * unit
                    late_need = ceil_div(max(forward, backward - freed, after, page_in - freed), unit)
                    record_need[:, e, s, t] = (late_need, early, late_need)
                else:
                    record_need[:, e, s, t] = early
    return MovesGrid(base=base, turn_cost=weights.compute * base.turn_time_s,
                       sweep_cost=weights.compute * base.sweep_time_s, value_paging_cost=value_cost,
                       value_can_page=value_can, record_can_page=record_can, record_paging_cost=record_cost,
                       record_hold_units=record_hold, record_need_units=record_need, late=late,
                       checkpoint_hold_units=checkpoint_hold,
                       paged_sweep_bytes=np.stack([costs.sweep_bytes, _paged_sweep_bytes(chain)]), recompute=recompute)


@dataclass(frozen=True, eq=False)
class PagingTable(BudgetTable):
    """The solved paging table of one chain, device and weighting, for every budget up to ``max_memory_bytes``."""

    chain: Chain
    profile: EnergyProfile
    weights: CostWeights
    max_memory_bytes: int
    slots: int
    grid: MovesGrid
    top_cost: np.ndarray   # [max_units + 1] C(0, L-1, m, 0)
    choice: np.ndarray

    kind = "paging schedule"

    @property
    def top_values(self) -> np.ndarray:
        return self.top_cost

    def cost(self, memory_bytes: int) -> float:
        """The weighted cost (J for energy weights) of the best schedule within ``memory_bytes``."""
        return float(self.top_cost[self._top_units(memory_bytes)])

    def schedule(self, memory_bytes: int) -> Schedule:
        ops = rebuild(self.grid, self.choice, self._top_units(memory_bytes))
        return Schedule(ops, self.chain.length, strategy="paging-dp",
                        params={"slots": self.slots, "budget_bytes": memory_bytes, "unit_bytes": self.unit_bytes,
                                "weights": [self.weights.compute, self.weights.pagein, self.weights.pageout]})


def solve_paging(chain: Chain, profile: EnergyProfile, max_memory_bytes: int, *, weights: CostWeights | None = None,
                 slots: int = 500, solver: str = "fast", recompute: bool = True) -> PagingTable:
    """Solve the paging table of ``chain`` on a device for every budget up to ``max_memory_bytes``.

    Args:
        chain: the cost model, its stage times the device's (:func:`edgetrain.costs.energy.scale_chain`).
        profile: the device's energy profile (powers; paging latency and throughput).
        max_memory_bytes: the largest whole-step peak the table answers for.
        weights: cost per second of compute / page-in / page-out; default the device's
            powers, so the cost is the step's energy in J.
        slots: memory units of the grid (as :func:`~edgetrain.planners.solve`).
        solver: ``"fast"`` (numba) or ``"reference"`` (pure Python).
        recompute: False restricts the table to schedules without recomputation (records
            only, inputs paged): the paging-only baseline.

    Raises:
        InfeasibleBudgetError: nothing fits on the grid. Below the least peak of any schedule
            (:func:`least_paging_peak`), ``minimum_bytes`` is that least peak; at or above it the
            grid's rounding alone refused (NOTE [ Paging near the least budget ]), ``minimum_bytes``
            is None, and :func:`paging_dp` answers such a budget.
    """
    weights = weights or CostWeights.energy(profile)
    table = _solve_table(chain, profile, max_memory_bytes, weights, slots, solver, recompute)
    if table is None:
        least = least_paging_peak(chain, profile, weights=weights, recompute=recompute).minimum_bytes
        if max_memory_bytes < least:
            raise _below_least(chain, max_memory_bytes, least, recompute)
        raise InfeasibleBudgetError(
            f"no {_kind(recompute)} schedule of {chain.name or 'this chain'} fits in {max_memory_bytes} bytes on a "
            f"grid of {slots} slots, which rounds each local peak up; paging_dp answers any budget from the least, "
            f"{least} bytes", budget_bytes=max_memory_bytes)
    return table


def _solve_table(chain: Chain, profile: EnergyProfile, max_memory_bytes: int, weights: CostWeights, slots: int,
                 solver: str, recompute: bool) -> PagingTable | None:
    """The table of :func:`solve_paging`; None where its grid has no schedule within ``max_memory_bytes``."""
    check_options(slots, solver)
    activation_bytes = max_memory_bytes - chain.resident_bytes
    if activation_bytes < 0:
        return None
    check_length(chain)
    grid = _discretise_paging(chain, activation_bytes, slots, weights, profile, recompute)
    table = PagingTable(chain, profile, weights, max_memory_bytes, slots, grid, *solve_grid(grid, solver))
    if not np.isfinite(table.top_cost[-1]) or table.step_bytes > max_memory_bytes:
        return None
    return table


def _kind(recompute: bool) -> str:
    return "paging" if recompute else "paging-only"


def _below_least(chain: Chain, budget_bytes: int, least_bytes: int, recompute: bool) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(
        f"no {_kind(recompute)} schedule of {chain.name or 'this chain'} fits in {budget_bytes} bytes: the least "
        f"budget of any is {least_bytes} bytes", minimum_bytes=least_bytes, budget_bytes=budget_bytes)


@dataclass(frozen=True)
class LeastPeak:
    """The least budget of any schedule the paging DP builds, and a schedule of that peak (ties in peak broken by
    cost move by move, so not always the cheapest of that peak), with its cost."""

    minimum_bytes: int
    schedule: Schedule
    cost: float   # weighted as the table's: J for energy weights


def least_paging_peak(chain: Chain, profile: EnergyProfile, *, weights: CostWeights | None = None,
                      recompute: bool = True) -> LeastPeak:
    """The paging DP's least budget in bytes, without a grid, and its schedule (NOTE [ Paging near the least budget ]).

    Args: as :func:`solve_paging`'s; ``weights`` only break ties between schedules of the least peak.
    """
    weights = weights or CostWeights.energy(profile)
    check_length(chain)
    grid = _discretise_paging(chain, 0, 1, weights, profile, recompute, unit_bytes=1)
    peak, cost, code = _least_peaks(grid)
    last = chain.length - 1
    ops = replay(grid, lambda s, t, m, e: int(code[e, s, t]), 0)
    schedule = Schedule(ops, chain.length, strategy="paging-dp",
                        params={"least_peak": True, "weights": [weights.compute, weights.pagein, weights.pageout]})
    return LeastPeak(max(chain.resident_bytes + int(peak[0, 0, last]), step_bytes(chain)), schedule,
                     float(cost[0, 0, last]))


def _least_peaks(grid: MovesGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[e, s, t]``: the least peak of ``P(s, t, e)`` on a grid of 1-byte units, the least cost at it, its move.

    :func:`~edgetrain.planners.dp.grid.solve_reference`'s moves, with ``max`` for memory in place of
    ``+`` for cost; ties in memory go to the least cost, then to the smallest choice code.
    """
    g, length = grid.base, grid.base.length
    peak = np.zeros((2, length, length), np.int64)
    cost = np.zeros((2, length, length))
    code = np.full((2, length, length), -1, np.int64)
    for span in range(length):          # bottom-up: every child is solved before its parent
        for s in range(length - span):
            for e in (0, 1):
                if g.needed[e, s]:
                    peaks, costs, codes = _moves(grid, peak, cost, s, s + span, e)
                    best = np.lexsort((codes, costs, peaks))[0]
                    peak[e, s, s + span], cost[e, s, s + span], code[e, s, s + span] = (
                        peaks[best], costs[best], codes[best])
    return peak, cost, code


def _moves(grid: MovesGrid, peak: np.ndarray, cost: np.ndarray, s: int, t: int,
           e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Peak, cost and choice code of every move of ``P(s, t, e)``, its children's least peaks read from ``peak``."""
    g, length = grid.base, grid.base.length
    child = int(g.child_entry[s])
    records = [(int(g.record_need_units[e, s, t]), int(g.record_hold_units[e, s]), float(grid.turn_cost[s]), s)]
    for v in range(3):                                                                     # (a')
        alone = s == t and v == 0 and bool(grid.late[e, s])
        if grid.record_can_page[v, e, s] and (s < t or alone):
            records.append((int(grid.record_need_units[v, e, s, t]), int(grid.record_hold_units[v, e, s]),
                            float(grid.turn_cost[s] + grid.record_paging_cost[v, s]), (v + 1) * length + s))
    peaks = [max(need, hold + int(peak[child, s + 1, t])) if s < t else need for need, hold, _, _ in records]
    costs = [own + float(cost[child, s + 1, t]) if s < t else own for _, _, own, _ in records]
    found = [(np.array(peaks, np.int64), np.array(costs), np.array([r[3] for r in records], np.int64))]
    if grid.recompute and s < t:
        ks = np.arange(s + 1, t + 1)
        upper, lower = peak[1, ks, t], peak[e, s, ks - 1] + g.grad_units[ks, t]   # P(k, t, 1), P(s, k-1, e)
        advances = g.delta_bytes[t + 1] + g.entry_bytes[e, s] + g.sweep_bytes[s, ks]                # (b)
        found.append((np.maximum(advances, np.maximum(upper + g.checkpoint_hold_units[e, s], lower)),
                      grid.sweep_cost[s, ks] + cost[1, ks, t] + cost[e, s, ks - 1], ks))
        if grid.value_can_page[e, s]:                                                      # (b')
            advances = g.delta_bytes[t + 1] + grid.paged_sweep_bytes[e, s, ks]
            found.append((np.maximum(advances, np.maximum(upper + grid.checkpoint_hold_units[e, s], lower)),
                          grid.sweep_cost[s, ks] + grid.value_paging_cost[s] + cost[1, ks, t] + cost[e, s, ks - 1],
                          4 * length + ks))
    return (np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found]),
            np.concatenate([f[2] for f in found]))


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

    Every budget from the least peak of any schedule (:func:`least_paging_peak`) gets one, the
    grid's rounding notwithstanding (NOTE [ Paging near the least budget ]).

    Raises:
        InfeasibleBudgetError: the budget is below that least peak, which ``minimum_bytes`` carries.
    """
    def at(weight: float | None) -> PagingResult:
        weights = CostWeights.time() if weight is None else CostWeights.energy(profile, weight)
        schedule = _schedule_within(chain, profile, memory_bytes, weights, slots, recompute)
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


def _schedule_within(chain: Chain, profile: EnergyProfile, budget_bytes: int, weights: CostWeights, slots: int,
                     recompute: bool) -> Schedule:
    """The table's schedule at the budget; where its grid has none, the cheapest of those that fit.

    NOTE [ Paging near the least budget ]
    A table of ``slots`` units rounds each local peak up, so near its least budget its grid can
    miss every schedule that fits, and a table solved at another budget has another grid: its
    least budget can lie below a budget this one refused (a grid alone refuses 381,000 bytes on the
    test DenseNet's two-level variants, counted without kernels' scratch, and states 380,877 as the
    least). The recurrence on a grid of 1-byte
    units rounds nothing: its least peak (:func:`least_paging_peak`, ``max`` for memory in place of
    ``+`` for cost, as ``exact.exact_minimum_bytes`` for the recompute-only DP) is the least
    budget of any schedule the DP builds, and its schedule of that peak fits every budget from
    there. So where the grid at the budget has nothing, :func:`paging_dp` takes keep-all if it fits
    (no recomputation and no paging: the least cost), else the cheaper of the table solved up to
    keep-all's peak (another grid, when it has a schedule at the budget) and the least-peak
    schedule, and it refuses only budgets below the least peak, stating it. Where the grid at the
    budget answers, its answer stands: the fallback changes no figure a grid solves.
    """
    table = _solve_table(chain, profile, budget_bytes, weights, slots, "fast", recompute)
    if table is not None:
        return table.schedule(budget_bytes)
    everything = keep_all(chain.length)
    top_bytes = simulate(chain, everything).peak_bytes
    if top_bytes <= budget_bytes:
        return Schedule(everything.ops, chain.length, strategy="paging-dp",
                        params={"paging": False, "recompute": False})
    least = least_paging_peak(chain, profile, weights=weights, recompute=recompute)
    if budget_bytes < least.minimum_bytes:
        raise _below_least(chain, budget_bytes, least.minimum_bytes, recompute)
    found = [(least.cost, least.schedule)]
    top = _solve_table(chain, profile, top_bytes, weights, slots, "fast", recompute)
    if top is not None and budget_bytes >= top.min_memory_bytes:
        found.append((top.cost(budget_bytes), top.schedule(budget_bytes)))
    return min(found, key=lambda f: f[0])[1]
