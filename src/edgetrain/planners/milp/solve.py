"""POET's energy-optimal rematerialisation-and-paging MILP on a training graph, solved with HiGHS.

S. G. Patil, P. Jain, P. Dutta, I. Stoica, J. Gonzalez, "POET: Training Neural Networks on Tiny
Devices with Integrated Rematerialization and Paging", ICML 2022, extends Checkmate's
"frontier-advancing" MILP (P. Jain et al., "Checkmate: Breaking the Memory Wall with Optimal
Tensor Rematerialization", MLSys 2020) with paging to flash. This module re-derives that
formulation on edgetrain's cost model (:class:`TrainingGraph`) and builds it in bulk with numpy
for HiGHS (``highspy``); ``docs/concepts/milp.md`` writes the formulation out.

NOTE [ The POET MILP ]
Nodes ``0 .. n-1`` of a :class:`TrainingGraph` are in topological order (forward nodes, then
backward nodes in reverse). There are ``T = n`` *stages*; stage ``t`` computes node ``t`` for
the first time (the frontier advances by one node a stage) and may recompute earlier forward
nodes. Decisions, one per stage ``t`` and node ``i``:

* ``R[t,i]`` compute ``i`` in stage ``t``;  ``S[t,i]`` ``i`` is in RAM when stage ``t`` starts;
* ``M_out[t,i]`` write ``i`` to flash during stage ``t``;  ``M_in[t,i]`` read it back at the end
  of stage ``t`` (it is in RAM from stage ``t+1``);  ``SSd[t,i]`` a copy is on flash when ``t``
  starts (a copy stays there once written, as in POET).

Energy = ``sum R*compute_j + M_in*pagein_j + M_out*pageout_j``. Constraint groups, each built by
one function below: ``_frontier`` (which variables exist), ``_dependencies``, ``_paging``,
``_memory`` (Checkmate's per-stage accounting with frees), ``_deadline``.

NOTE [ Structure the MILP exploits ]
* Frontier advancing: ``R[t,t] = 1`` is a constant, not a column, and ``R``/``S``/paging live in
  the lower triangle only.
* Backward nodes are computed once, in their own stage: re-running one would accumulate its
  parameter gradients twice, so it is not a legal recomputation anyway.
* Liveness: ``need_end[i]``, the last stage whose computation can read ``i`` (a forward
  consumer can itself be recomputed as late as *its* value is needed), bounds every ``S``,
  ``R``, ``M_*`` and ``SSd`` column of ``i``; paging columns exist only where a page-in can still
  be used.
* ``S``, ``SSd``, ``FREE`` and ``U`` are continuous: with ``R``, ``M_in``, ``M_out`` integral,
  the smallest ``S`` satisfying the constraints is integral and never needs more memory, so
  branching on them is wasted work (the schedule is read back with that smallest ``S``).
* ``FREE`` is bounded above only (by ``R``, ``1 - S[t+1] + M_in[t]`` and ``1 - R`` of later readers):
  freeing less than allowed only over-counts memory, so the disaggregated upper bounds are
  exact and give a tighter relaxation than Checkmate's aggregated hazard count. A value read by
  the stage's own node is never freed before it, so those ``FREE`` columns do not exist.
* Memory rows only after a computation (memory only grows there); rows are scaled by the
  budget and the deadline so coefficients are O(1).
* Write-once paging: a page-out can always move to the value's first computation (the copy
  persists and flash is not budgeted), so ``M_out[i,i]`` is the only page-out column and ``SSd``
  needs none (:func:`_paging`).
* Warm start: the cheapest of keep-everything, recompute-everything and a paging schedule that
  holds only the inputs of the node being computed (feasible at exactly the per-step lower
  bound), so with paging a time limit always returns a schedule.

The replay's memory model, which the memory rows follow, is NOTE [ Memory accounting ] in
:mod:`edgetrain.planners.milp.replay`; the training graph is :mod:`edgetrain.planners.milp.graph`,
the heuristics and warm start :mod:`edgetrain.planners.milp.warmstart`. This module re-exports
their public names, so ``edgetrain.planners.milp.solve`` is the planner's one import.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import EdgetrainError, InfeasibleBudgetError
from .graph import TrainingGraph, TrainingNode, chain_training_graph, coarsen, minimum_bytes, training_graph
from .replay import GraphSchedule, GraphStats, schedule_from_decisions, simulate_graph_schedule
from .warmstart import keep_all_schedule, paging_schedule, recompute_schedule, warm_start_schedule

if TYPE_CHECKING:
    import highspy

__all__ = ["TrainingNode", "TrainingGraph", "training_graph", "chain_training_graph", "coarsen", "milp",
           "MilpResult", "GraphStats", "GraphSchedule", "simulate_graph_schedule", "keep_all_schedule",
           "paging_schedule", "recompute_schedule",
           "minimum_bytes"]

log = logging.getLogger(__name__)

_ONE = -2      # index of a variable fixed to 1 (R[t,t]): folded into the row bounds
_ABSENT = -1   # a variable that does not exist (fixed to 0)


@dataclass(frozen=True)
class MilpResult:
    """A solved POET MILP: the schedule, its costs (from the replay) and the solver's figures.

    ``status`` is ``"optimal"`` (within ``mip_gap``) or ``"time_limit"`` (best schedule found);
    ``bound_j`` the solver's lower bound on the energy; ``mip_gap`` HiGHS's gap, relative to the
    total energy. ``constraint_groups`` counts rows per group.
    """

    status: str
    energy_j: float
    energy_compute_j: float
    energy_pagein_j: float
    energy_pageout_j: float
    time_s: float
    peak_bytes: int
    solve_time_s: float
    mip_gap: float
    n_variables: int
    n_constraints: int
    R: np.ndarray
    S: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    SSd: np.ndarray
    memory_bytes: int
    deadline_s: float | None
    objective_j: float
    bound_j: float
    n_binaries: int
    build_time_s: float
    constraint_groups: dict[str, int] = field(default_factory=dict, compare=False)


@dataclass
class _Layout:
    """Column index of every decision variable: ``-1`` absent (0), ``_ONE`` fixed to 1."""

    R: np.ndarray
    S: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    SSd: np.ndarray
    U: np.ndarray
    FREE: np.ndarray          # [stage, edge]
    src: np.ndarray           # edge sources
    dst: np.ndarray           # edge destinations
    cost: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lower: np.ndarray = field(default_factory=lambda: np.zeros(0))
    upper: np.ndarray = field(default_factory=lambda: np.zeros(0))
    integer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def n_cols(self) -> int:
        return len(self.cost)

    def allocate(self, mask: np.ndarray, *, cost: np.ndarray | float = 0.0, upper: float = 1.0,
                 integer: bool = False) -> np.ndarray:
        """Give a column to every True cell of ``mask``; return the index array (``-1`` elsewhere)."""
        index = np.full(mask.shape, _ABSENT, dtype=np.int64)
        count = int(mask.sum())
        index[mask] = np.arange(self.n_cols, self.n_cols + count)
        costs = np.broadcast_to(np.asarray(cost, dtype=float), mask.shape)[mask]
        self.cost = np.concatenate([self.cost, costs])
        self.lower = np.concatenate([self.lower, np.zeros(count)])
        self.upper = np.concatenate([self.upper, np.full(count, upper)])
        self.integer = np.concatenate([self.integer, np.full(count, integer)])
        return index


class _Rows:
    """Constraint rows gathered as COO blocks; ``_ONE`` entries move to the bounds, ``-1`` ones vanish."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.count = 0
        self.groups: dict[str, int] = {}

    def add(self, group: str, row: np.ndarray, col: np.ndarray, val: np.ndarray, lo: np.ndarray,
            hi: np.ndarray) -> None:
        """Add ``len(lo)`` rows ``lo <= sum val*x[col] <= hi``; ``row`` numbers entries 0..len(lo)-1."""
        row, col = np.asarray(row, dtype=np.int64), np.asarray(col, dtype=np.int64)
        val = np.broadcast_to(np.asarray(val, dtype=float), row.shape)
        m = len(lo)
        lo, hi = np.array(lo, dtype=float), np.array(hi, dtype=float)
        const = np.bincount(row[col == _ONE], weights=val[col == _ONE], minlength=m)
        lo, hi = lo - const, hi - const
        live = col >= 0
        row, col, val = row[live], col[live], val[live]
        used = np.bincount(row, minlength=m) > 0
        empty = ~used
        if (empty & ((lo > 1e-9) | (hi < -1e-9))).any():
            raise EdgetrainError(f"constraint group {group!r} is infeasible by construction")
        renumber = np.cumsum(used) - 1
        self.rows.append(renumber[row] + self.count)
        self.cols.append(col)
        self.vals.append(val)
        self.lo.append(lo[used])
        self.hi.append(hi[used])
        self.count += int(used.sum())
        self.groups[group] = self.groups.get(group, 0) + int(used.sum())

    def add_dense(self, group: str, cols: np.ndarray, coefs: Sequence[float] | np.ndarray, lo: float | np.ndarray,
                  hi: float | np.ndarray) -> None:
        """Rows of fixed width: ``cols`` is ``(m, k)``, ``coefs`` ``(k,)`` or ``(m, k)``."""
        m, k = cols.shape
        if m == 0:
            return
        vals = np.broadcast_to(np.asarray(coefs, dtype=float), (m, k))
        self.add(group, np.repeat(np.arange(m), k), cols.ravel(), vals.ravel(),
                 np.broadcast_to(lo, (m,)), np.broadcast_to(hi, (m,)))

    def csc(self, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, dtype=np.int64)
        cols = np.concatenate(self.cols) if self.cols else np.zeros(0, dtype=np.int64)
        vals = np.concatenate(self.vals) if self.vals else np.zeros(0)
        order = np.lexsort((rows, cols))
        start = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=n_cols))])
        return start.astype(np.int32), rows[order].astype(np.int32), vals[order]


def _frontier(tg: TrainingGraph, *, paging: bool, recompute_before_backward: bool,
              write_once: bool = True) -> _Layout:
    """Which variables exist (NOTE [ Structure the MILP exploits ]); allocate their columns.

    ``R[t,t]`` is the constant 1; ``R[t,i]`` (``i < t``) exists for forward ``i`` while
    ``t <= need_end[i]``; ``S[t,i]`` for ``i < t <= need_end[i]``. Paging of ``i`` exists where a
    page-in can still serve a reader: ``M_in`` for ``i < t < need_end[i]``; with ``write_once``
    the only page-out is ``M_out[i,i]`` and ``SSd`` has no columns (see :func:`_paging`), else
    POET's ``M_out[t,i]`` for ``i <= t <= need_end[i] - 2`` and ``SSd[t,i]`` for
    ``i < t < need_end[i]``. Objective coefficients are attached here.
    """
    n = len(tg.nodes)
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    end = np.array(tg.need_end)[None, :]
    forward = ~np.array([nd.backward for nd in tg.nodes])[None, :]
    mem = tg.array("mem_bytes")[None, :]
    first_backward = next((k for k, nd in enumerate(tg.nodes) if nd.backward), n)
    r_mask = (i < t) & (t <= end) & forward
    if not recompute_before_backward:
        r_mask &= t >= first_backward
    s_mask = (i < t) & (t <= end)
    pageable = (mem > 0) & paging
    layout = _Layout(R=np.zeros(0), S=np.zeros(0), M_in=np.zeros(0), M_out=np.zeros(0), SSd=np.zeros(0),
                     U=np.zeros(0), FREE=np.zeros(0), src=np.zeros(0), dst=np.zeros(0))
    layout.R = layout.allocate(r_mask, cost=tg.array("energy_j")[None, :], integer=True)
    np.fill_diagonal(layout.R, _ONE)
    layout.S = layout.allocate(s_mask)
    layout.M_in = layout.allocate((i < t) & (t < end) & pageable, cost=tg.array("pagein_energy_j")[None, :],
                                  integer=True)
    out_mask = (i <= t) & (t <= end - 2) & pageable
    if write_once:
        out_mask &= i == t
    layout.M_out = layout.allocate(out_mask, cost=tg.array("pageout_energy_j")[None, :], integer=True)
    layout.SSd = layout.allocate((i < t) & (t < end) & pageable & (not write_once))
    edges = [(d, k) for k, nd in enumerate(tg.nodes) for d in nd.deps]
    layout.src = np.array([e[0] for e in edges], dtype=np.int64)
    layout.dst = np.array([e[1] for e in edges], dtype=np.int64)
    return layout


def _dependencies(tg: TrainingGraph, lay: _Layout, rows: _Rows) -> None:
    """Data dependencies and the flow of RAM residency between stages.

    ``R[t,v] <= R[t,u] + S[t,u]`` for every edge ``u -> v``: an input is computed earlier in the
    stage or was in RAM at its start. ``S[t+1,i] <= S[t,i] + R[t,i] + M_in[t,i]``: a value is in
    RAM at a stage start only if it was already, was computed in the previous stage, or was paged
    in at its end.
    """
    n = len(tg.nodes)
    t = np.repeat(np.arange(n), len(lay.src))
    u = np.tile(lay.src, n)
    v = np.tile(lay.dst, n)
    rv = lay.R[t, v]
    on = rv != _ABSENT
    cols = np.stack([rv[on], lay.R[t[on], u[on]], lay.S[t[on], u[on]]], axis=1)
    rows.add_dense("dependencies", cols, [1.0, -1.0, -1.0], -np.inf, 0.0)
    tt, ii = np.nonzero(lay.S[1:] != _ABSENT)
    cols = np.stack([lay.S[tt + 1, ii], lay.S[tt, ii], lay.R[tt, ii], lay.M_in[tt, ii]], axis=1)
    rows.add_dense("residency", cols, [1.0, -1.0, -1.0, -1.0], -np.inf, 0.0)


def _paging(tg: TrainingGraph, lay: _Layout, rows: _Rows, *, write_once: bool = True) -> None:
    """Paging: what is on flash, what can be read back, what can be written.

    POET's rules: ``SSd[t+1,i] <= SSd[t,i] + M_out[t,i]`` (a copy exists once written),
    ``M_in[t,i] <= SSd[t,i]`` (read back only what is on flash), ``M_out[t,i] <= S[t,i] + R[t,i]``
    (write only what is in RAM).

    ``write_once`` (the default) uses that a copy persists and flash is not budgeted: any
    page-out of ``i`` can move to ``i``'s first computation, stage ``i`` (the value is the same,
    the cost is the same, RAM is unchanged and the copy only exists longer). So ``M_out[i,i]`` is
    the only page-out column, ``SSd[t,i] = M_out[i,i]`` for ``t > i`` needs no column, and the rows
    are just ``M_in[t,i] <= M_out[i,i]``: no loss, and none of the solutions that differ only in
    when a value was written.
    """
    if write_once:
        tt, ii = np.nonzero(lay.M_in != _ABSENT)
        rows.add_dense("page_in", np.stack([lay.M_in[tt, ii], lay.M_out[ii, ii]], axis=1), [1.0, -1.0],
                       -np.inf, 0.0)
        return
    tt, ii = np.nonzero(lay.SSd[1:] != _ABSENT)
    rows.add_dense("flash", np.stack([lay.SSd[tt + 1, ii], lay.SSd[tt, ii], lay.M_out[tt, ii]], axis=1),
                   [1.0, -1.0, -1.0], -np.inf, 0.0)
    tt, ii = np.nonzero(lay.M_in != _ABSENT)
    rows.add_dense("page_in", np.stack([lay.M_in[tt, ii], lay.SSd[tt, ii]], axis=1), [1.0, -1.0], -np.inf, 0.0)
    tt, ii = np.nonzero(lay.M_out != _ABSENT)
    rows.add_dense("page_out", np.stack([lay.M_out[tt, ii], lay.S[tt, ii], lay.R[tt, ii]], axis=1),
                   [1.0, -1.0, -1.0], -np.inf, 0.0)


def _read_back_once(lay: _Layout, rows: _Rows) -> None:
    """Each write serves one read: ``Σ_t M_in[t,i] <= Σ_t M_out[t,i]`` for every node ``i``.

    edgetrain's ``PageIn`` consumes the copy on flash (``schedule.py``), so a schedule for its
    executor reads a value back once per write; POET's copy persists and may be read many times.
    """
    for i in range(lay.M_in.shape[1]):
        reads = lay.M_in[:, i][lay.M_in[:, i] != _ABSENT]
        writes = lay.M_out[:, i][lay.M_out[:, i] != _ABSENT]
        if len(reads) == 0:
            continue
        cols = np.concatenate([reads, writes])
        vals = np.concatenate([np.ones(len(reads)), -np.ones(len(writes))])
        rows.add("read_back_once", np.zeros(len(cols), dtype=np.int64), cols, vals, np.array([-np.inf]),
                 np.array([0.0]))


def _free_variables(tg: TrainingGraph, lay: _Layout, rows: _Rows) -> None:
    """``FREE[t,e]``, edge ``e = (i, k)``: ``i`` is freed right after ``k`` runs in stage ``t``.

    Exists when ``k`` can run in stage ``t`` before the stage's own node, ``i`` holds memory and the
    stage's own node does not read ``i``. Upper bounds only (freeing less only over-counts):
    ``FREE <= R[t,k]``, ``FREE <= 1 - S[t+1,i] + M_in[t,i]`` (kept for the next stage, unless it
    is read back from flash at the end of this one), ``FREE <= 1 - R[t,j]`` for each later reader ``j``.
    """
    n = len(tg.nodes)
    mem = tg.array("mem_bytes")
    is_reader = np.zeros((n, n), dtype=bool)
    is_reader[lay.src, lay.dst] = True
    t = np.arange(n)[:, None]
    k = lay.dst[None, :]
    mask = (lay.R[:, lay.dst] >= 0) & (k < t) & (mem[lay.src] > 0)[None, :] & ~is_reader[lay.src].T
    lay.FREE = lay.allocate(mask)
    tt, ee = np.nonzero(mask)
    rows.add_dense("free_after_reader", np.stack([lay.FREE[tt, ee], lay.R[tt, lay.dst[ee]]], axis=1),
                   [1.0, -1.0], -np.inf, 0.0)
    s_next = np.full_like(tt, _ABSENT)
    inside = tt + 1 < n
    s_next[inside] = lay.S[tt[inside] + 1, lay.src[ee[inside]]]
    # A value paged in at the end of the stage is in S[t+1] without being kept through the stage:
    # it may be freed after its last reader and read back (NOTE [ Memory accounting ]).
    paged_in = lay.M_in[tt, lay.src[ee]]
    rows.add_dense("free_unless_kept", np.stack([lay.FREE[tt, ee], s_next, paged_in], axis=1), [1.0, 1.0, -1.0],
                   -np.inf, 1.0)
    pairs = [(e, j) for e, (i_, k_) in enumerate(zip(lay.src, lay.dst, strict=True))
             for j in tg.consumers[i_] if j > k_]
    if pairs:
        pe = np.array([p[0] for p in pairs])
        pj = np.array([p[1] for p in pairs])
        f = lay.FREE[:, pe]
        r = lay.R[:, pj]
        on = (f >= 0) & (r >= 0)
        rows.add_dense("free_after_last_reader", np.stack([f[on], r[on]], axis=1), [1.0, 1.0], -np.inf, 1.0)


def _memory(tg: TrainingGraph, lay: _Layout, rows: _Rows, memory_bytes: int) -> None:
    """Checkmate's per-stage memory, in units of the budget (NOTE [ Memory accounting ]).

    For the computations ``p_0 < p_1 < ...`` that can run in stage ``t``:
    ``U[t,p_0] = resident + sum_i mem_i S[t,i] + mem_{p_0} R[t,p_0]`` and
    ``U[t,p_j] = U[t,p_{j-1}] + mem_{p_j} R[t,p_j] - sum_{(i, p_{j-1})} mem_i FREE[t,i,p_{j-1}]``;
    then ``U[t,p] + workspace_p R[t,p] <= budget``.
    """
    _free_variables(tg, lay, rows)
    n = len(tg.nodes)
    scale = 1.0 / memory_bytes
    mem = tg.array("mem_bytes") * scale
    work = tg.array("workspace_bytes") * scale
    positions = lay.R != _ABSENT
    lay.U = lay.allocate(positions, upper=np.inf)
    u_up = lay.upper
    edges_by_dst: list[list[int]] = [[] for _ in range(n)]
    for e, k in enumerate(lay.dst):
        edges_by_dst[k].append(e)
    r_list, c_list, v_list, lo_list = [], [], [], []
    row = 0
    for t in range(n):
        pos = np.flatnonzero(positions[t])
        live = np.flatnonzero(lay.S[t] >= 0)
        cols = [lay.U[t, pos[0]], *lay.S[t, live], lay.R[t, pos[0]]]
        vals = [1.0, *(-mem[live]), -mem[pos[0]]]
        r_list.append(np.full(len(cols), row))
        c_list.append(cols)
        v_list.append(vals)
        lo_list.append(tg.resident_bytes * scale)
        row += 1
        for prev, p in itertools.pairwise(pos):
            frees = [e for e in edges_by_dst[prev] if lay.FREE[t, e] >= 0]
            cols = [lay.U[t, p], lay.U[t, prev], lay.R[t, p], *lay.FREE[t, frees]]
            vals = [1.0, -1.0, -mem[p], *mem[lay.src[frees]]]
            r_list.append(np.full(len(cols), row))
            c_list.append(cols)
            v_list.append(vals)
            lo_list.append(0.0)
            row += 1
    lo = np.array(lo_list)
    rows.add("memory_recurrence", np.concatenate(r_list), np.concatenate(c_list), np.concatenate(v_list), lo, lo)
    tt, kk = np.nonzero(positions)
    fixed = lay.R[tt, kk] == _ONE
    u_up[lay.U[tt[fixed], kk[fixed]]] = 1.0 - work[kk[fixed]]
    plain = ~fixed & (work[kk] == 0)
    u_up[lay.U[tt[plain], kk[plain]]] = 1.0
    other = ~fixed & (work[kk] > 0)
    pairs = np.stack([lay.U[tt[other], kk[other]], lay.R[tt[other], kk[other]]], axis=1)
    rows.add("memory_budget", np.repeat(np.arange(len(pairs)), 2), pairs.ravel(),
             np.stack([np.ones(len(pairs)), work[kk[other]]], axis=1).ravel(), np.full(len(pairs), -np.inf),
             np.ones(len(pairs)))


def _deadline(tg: TrainingGraph, lay: _Layout, rows: _Rows, deadline_s: float) -> None:
    """Step time, compute plus serial paging (NOTE [ Paging time and energy ] in schedule.py), <= deadline."""
    cols, vals = [], []
    for index, per_node in ((lay.R, tg.array("time_s")), (lay.M_in, tg.array("pagein_time_s")),
                            (lay.M_out, tg.array("pageout_time_s"))):
        on = index != _ABSENT
        cols.append(index[on])
        vals.append(np.broadcast_to(per_node[None, :], index.shape)[on] / deadline_s)
    c = np.concatenate(cols)
    rows.add("deadline", np.zeros(len(c), dtype=np.int64), c, np.concatenate(vals), np.array([-np.inf]),
             np.array([1.0]))


def _column_values(tg: TrainingGraph, lay: _Layout, sched: GraphSchedule, memory_bytes: int) -> np.ndarray | None:
    """The full column vector of a schedule (for a warm start), or None if the layout cannot hold it."""
    x = np.zeros(lay.n_cols)
    for index, matrix in ((lay.R, sched.R), (lay.S, sched.S), (lay.M_in, sched.M_in), (lay.M_out, sched.M_out),
                          (lay.SSd, sched.SSd)):
        on = matrix.astype(bool)
        fixed = index == _ONE
        if index is lay.SSd:
            on &= index >= 0  # a copy kept on flash past its last page-in has no column (and needs none)
        elif (on & (index == _ABSENT)).any():
            return None
        cells = on & ~fixed
        x[index[cells]] = 1.0
    n = len(tg.nodes)
    mem = tg.array("mem_bytes") / memory_bytes
    for t in range(n):
        pos = np.flatnonzero(lay.R[t] != _ABSENT)
        u = tg.resident_bytes / memory_bytes + mem[sched.S[t]].sum()
        for j, p in enumerate(pos):
            if j > 0:
                prev = pos[j - 1]
                for e in np.flatnonzero((lay.dst == prev) & (lay.FREE[t] >= 0)):
                    i = lay.src[e]
                    later = any(sched.R[t, c] for c in tg.consumers[i] if c > prev)
                    kept = t + 1 < n and sched.S[t + 1, i] and not sched.M_in[t, i]
                    if sched.R[t, prev] and not later and not kept:
                        x[lay.FREE[t, e]] = 1.0
                        u -= mem[i]
            u += mem[p] * sched.R[t, p]
            x[lay.U[t, p]] = u
    return x


def _highs(tg: TrainingGraph, lay: _Layout, rows: _Rows, *, time_limit_s: float, mip_gap: float,
           offset: float) -> highspy.Highs:
    try:
        import highspy
    except ImportError:
        raise EdgetrainError("the MILP planner needs HiGHS: pip install 'edgetrain[plan]'") from None

    h = highspy.Highs()
    for key, setting in (("output_flag", False), ("threads", 1), ("time_limit", float(time_limit_s)),
                         ("mip_rel_gap", float(mip_gap)), ("random_seed", 0)):
        h.setOptionValue(key, setting)
    lp = highspy.HighsLp()
    lp.num_col_ = lay.n_cols
    lp.num_row_ = rows.count
    lp.col_cost_ = lay.cost
    lp.col_lower_ = lay.lower
    lp.col_upper_ = lay.upper
    lp.row_lower_ = np.concatenate(rows.lo) if rows.lo else np.zeros(0)
    lp.row_upper_ = np.concatenate(rows.hi) if rows.hi else np.zeros(0)
    lp.offset_ = offset
    start, index, value = rows.csc(lay.n_cols)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = lay.n_cols
    lp.a_matrix_.num_row_ = rows.count
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                       for b in lay.integer]
    h.passModel(lp)
    return h


def _check_request(tg: TrainingGraph, memory_bytes: int, deadline_s: float | None) -> int:
    lower = minimum_bytes(tg)
    if memory_bytes < lower:
        raise InfeasibleBudgetError(
            f"budget {memory_bytes} B is below the {lower} B that the largest single step needs (resident "
            f"{tg.resident_bytes} B plus one node's inputs, output and workspace)",
            minimum_bytes=lower, budget_bytes=memory_bytes)
    if deadline_s is not None and deadline_s < tg.compute_time_s * (1 - 1e-12):
        raise EdgetrainError(f"deadline {deadline_s:.6g} s is below {tg.compute_time_s:.6g} s, the time of "
                             "computing every node once")
    return lower


def milp(tg: TrainingGraph, memory_bytes: int, *, deadline_s: float | None = None, time_limit_s: float = 60.0,
         mip_gap: float = 1e-4, paging: bool = True, warm_start: Any = None,
         recompute_before_backward: bool = True, write_once: bool = True,
         read_back_once: bool = False) -> MilpResult:
    """The least-energy schedule of ``tg`` within ``memory_bytes`` (and ``deadline_s``): POET's MILP.

    Args:
        tg: the training graph (:func:`training_graph`, :func:`chain_training_graph`).
        memory_bytes: RAM budget, resident bytes included.
        deadline_s: limit on compute plus paging time of the step; none by default.
        time_limit_s: HiGHS's wall-clock limit; at the limit the best schedule found is returned.
        mip_gap: relative optimality gap at which HiGHS stops, relative to the *total* energy
            (POET's objective). One pass of compute dominates it, so 1e-4 can leave a good share
            of the recomputation-plus-paging energy on the table; ask for 1e-6 or less to compare
            schedules that differ by little.
        paging: allow paging to flash (POET); False gives Checkmate's energy-weighted MILP.
        warm_start: a schedule (anything with ``R``, ``M_in``, ``M_out``) to start from; None
            tries keep-everything and :func:`paging_schedule`; False starts from nothing.
        recompute_before_backward: allow recomputation in the forward phase too (Checkmate
            does); False removes those columns.
        write_once: page a value out only in its own stage (lossless, see :func:`_paging`);
            False keeps POET's page-out at any stage, for comparison.
        read_back_once: each write serves one read back (:func:`_read_back_once`), as edgetrain's
            executor pages; POET's default lets a copy on flash be read many times.

    Returns:
        A :class:`MilpResult` whose costs are those of :func:`simulate_graph_schedule`.

    Raises:
        InfeasibleBudgetError: the budget is below :func:`minimum_bytes` (checked before
            solving), or HiGHS proves no schedule fits; ``minimum_bytes`` carries the bound.
        EdgetrainError: a deadline below one pass of compute, or no schedule found in time.
    """
    t0 = time.perf_counter()
    lower = _check_request(tg, memory_bytes, deadline_s)
    lay = _frontier(tg, paging=paging, recompute_before_backward=recompute_before_backward, write_once=write_once)
    rows = _Rows()
    _dependencies(tg, lay, rows)
    if paging:
        _paging(tg, lay, rows, write_once=write_once)
        if read_back_once:
            _read_back_once(lay, rows)
    _memory(tg, lay, rows, memory_bytes)
    if deadline_s is not None:
        _deadline(tg, lay, rows, deadline_s)
    # The one-pass energy is a constant offset. It stays in HiGHS's objective: the gap is then
    # relative to the total energy (POET's objective), and HiGHS's heuristics find far better
    # incumbents with it (ResNet-18 at 60% without paging: 2172 J in 7 s with the offset, stuck at
    # 2541 J for 60 s without it).
    h = _highs(tg, lay, rows, time_limit_s=time_limit_s, mip_gap=mip_gap, offset=tg.compute_energy_j)
    start = warm_start_schedule(tg, memory_bytes, deadline_s, paging, warm_start, write_once)
    if start is not None:
        x = _column_values(tg, lay, start, memory_bytes)
        if x is None:
            log.warning("warm start does not fit the MILP's variables; solving without it")
        else:
            import highspy

            sol = highspy.HighsSolution()
            sol.col_value = x.tolist()
            sol.value_valid = True
            h.setSolution(sol)
    build_time = time.perf_counter() - t0
    t1 = time.perf_counter()
    h.run()
    solve_time = time.perf_counter() - t1
    return _result(tg, lay, rows, h, memory_bytes, deadline_s, lower, solve_time, build_time)


def _result(tg: TrainingGraph, lay: _Layout, rows: _Rows, h: highspy.Highs, memory_bytes: int,
            deadline_s: float | None, lower: int, solve_time: float, build_time: float) -> MilpResult:
    import highspy

    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        raise InfeasibleBudgetError(
            f"no schedule fits {memory_bytes} B" + (f" within {deadline_s:.6g} s" if deadline_s else "")
            + f"; the largest single step alone needs {lower} B", minimum_bytes=lower, budget_bytes=memory_bytes)
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        raise EdgetrainError(f"HiGHS found no schedule within the time limit (status "
                             f"{h.modelStatusToString(status)}); raise time_limit_s or the budget")
    x = np.asarray(h.getSolution().col_value)

    def pick(index: np.ndarray) -> np.ndarray:
        out = index == _ONE
        on = index >= 0
        out[on] = x[index[on]] > 0.5
        return out

    sched = schedule_from_decisions(tg, pick(lay.R), pick(lay.M_in), pick(lay.M_out))
    stats = simulate_graph_schedule(tg, sched)
    return MilpResult(
        status="optimal" if status == highspy.HighsModelStatus.kOptimal else "time_limit",
        energy_j=stats.energy_j, energy_compute_j=stats.energy_compute_j, energy_pagein_j=stats.energy_pagein_j,
        energy_pageout_j=stats.energy_pageout_j, time_s=stats.time_s, peak_bytes=stats.peak_bytes,
        solve_time_s=solve_time, mip_gap=float(info.mip_gap), n_variables=lay.n_cols, n_constraints=rows.count,
        R=sched.R, S=sched.S, M_in=sched.M_in, M_out=sched.M_out, SSd=sched.SSd, memory_bytes=memory_bytes,
        deadline_s=deadline_s, objective_j=float(info.objective_function_value), bound_j=float(info.mip_dual_bound),
        n_binaries=int(lay.integer.sum()), build_time_s=build_time, constraint_groups=dict(rows.groups))
