"""Heuristic schedules of a training graph, and the MILP's warm start among them.

Keep-everything, recompute-everything and a paging schedule at the per-step lower bound: each is
feasible somewhere, the cheapest that fits the budget and deadline starts HiGHS (NOTE [ Structure
the MILP exploits ] in :mod:`edgetrain.planners.milp.solve`), so with paging a time limit always
returns a schedule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ScheduleError
from .graph import TrainingGraph
from .replay import GraphSchedule, schedule_from_decisions, simulate_graph_schedule

__all__ = ["keep_all_schedule", "paging_schedule", "recompute_schedule", "warm_start_schedule"]


def keep_all_schedule(tg: TrainingGraph) -> GraphSchedule:
    """Every node once, every value kept until its last reader: plain backprop, the 100% budget."""
    return schedule_from_decisions(tg, np.eye(len(tg.nodes), dtype=bool))


def paging_schedule(tg: TrainingGraph) -> GraphSchedule:
    """Every node once; a value is in RAM only for the stages that read it, on flash in between.

    A value read again after a gap is written to flash in its own stage and read back at the end
    of the stage before each reader that follows a gap. Its peak is :func:`minimum_bytes`
    exactly, which is why that bound is tight when paging is allowed.
    """
    n = len(tg.nodes)
    R = np.eye(n, dtype=bool)
    M_in = np.zeros((n, n), dtype=bool)
    M_out = np.zeros((n, n), dtype=bool)
    for i, readers in enumerate(tg.consumers):
        for c in readers:
            if c - 1 != i and (c - 1) not in readers:
                M_in[c - 1, i] = True
                M_out[i, i] = True
    return schedule_from_decisions(tg, R, M_in, M_out)


def recompute_schedule(tg: TrainingGraph) -> GraphSchedule:
    """No paging and nothing stored for backward: each backward stage recomputes its forward inputs.

    The forward phase keeps a value only until its last forward reader; backward stage ``t``
    recomputes, from the resident inputs, every forward node its forward dependencies need
    (values freed after their last reader in the stage). The most energy, little memory: a
    feasible start for tight budgets without paging.
    """
    n = len(tg.nodes)
    R = np.eye(n, dtype=bool)
    for t, node in enumerate(tg.nodes):
        if not node.backward:
            continue
        todo = [d for d in node.deps if not tg.nodes[d].backward]
        while todo:
            i = todo.pop()
            if not R[t, i]:
                R[t, i] = True
                todo.extend(tg.nodes[i].deps)
    return schedule_from_decisions(tg, R)


def warm_start_schedule(tg: TrainingGraph, memory_bytes: int, deadline_s: float | None, paging: bool,
                        given: Any, write_once: bool) -> GraphSchedule | None:
    """The best built-in schedule that meets the budget and deadline (or the caller's).

    With ``write_once`` every page-out moves to the value's own stage (lossless: see ``_paging`` in
    :mod:`edgetrain.planners.milp.solve`).
    """
    if given is False:
        return None
    candidates = [given] if given is not None else [keep_all_schedule(tg), recompute_schedule(tg)] + (
        [paging_schedule(tg)] if paging else [])
    best, best_energy = None, math.inf
    for cand in candidates:
        M_out = np.asarray(cand.M_out, dtype=bool)
        if write_once:
            M_out = np.diag(M_out.any(axis=0))
        sched = schedule_from_decisions(tg, np.asarray(cand.R), np.asarray(cand.M_in), M_out)
        if not paging and (sched.M_in.any() or sched.M_out.any()):
            continue
        try:
            stats = simulate_graph_schedule(tg, sched, memory_bytes=memory_bytes)
        except ScheduleError:
            continue
        if deadline_s is not None and stats.time_s > deadline_s:
            continue
        if stats.energy_j < best_energy:
            best, best_energy = sched, stats.energy_j
    return best
