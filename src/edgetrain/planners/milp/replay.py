"""Replay of a training-graph schedule: the oracle for its peak RAM, time and energy.

A schedule is four boolean decision matrices ``[stage, node]`` (NOTE [ The POET MILP ] in
:mod:`edgetrain.planners.milp.solve`). :func:`schedule_from_decisions` completes the compute and paging
decisions with the least storage that runs them; :func:`simulate_graph_schedule` checks and costs
any schedule independently of the MILP that produced it.

NOTE [ Memory accounting ]
While stage ``t`` computes its nodes in index order, memory is ``resident + sum S[t,i]*mem_i``
plus every value computed so far in the stage, minus the values freed after their last reader
in the stage that are not kept for stage ``t+1``; a node's workspace is added while it runs.
A value paged in at the end of stage ``t`` (``M_in[t,i]``) is not *kept* for ``t+1``: it may be
freed after its last reader in ``t`` and read back (page out ``x``, use it, drop it, page it in
for a later backward). Page-ins land after the stage's last computation and its frees, when RAM
holds ``resident + sum S[t+1,i]*mem_i`` (kept values and page-ins): that is the start of stage
``t+1``'s accounting, which every memory row of ``t+1`` includes, so a page-in is counted from
its start. Simplifications, all over-counting (never optimistic): a value kept for the next
stage, or read by nobody in the stage, is held to the end of the stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...errors import ScheduleError
from .graph import TrainingGraph

__all__ = ["GraphStats", "GraphSchedule", "schedule_from_decisions", "simulate_graph_schedule"]


class GraphStats(NamedTuple):
    """What a replayed schedule costs: peak RAM, step time and energy by kind."""

    peak_bytes: int
    time_s: float
    energy_compute_j: float
    energy_pagein_j: float
    energy_pageout_j: float
    peak_disk_bytes: int

    @property
    def energy_j(self) -> float:
        return self.energy_compute_j + self.energy_pagein_j + self.energy_pageout_j


@dataclass(frozen=True)
class GraphSchedule:
    """Decision matrices ``[stage, node]`` of a training-graph schedule (see NOTE [ The POET MILP ])."""

    R: np.ndarray
    S: np.ndarray
    M_in: np.ndarray
    M_out: np.ndarray
    SSd: np.ndarray


def _on_disk(M_out: np.ndarray) -> np.ndarray:
    """``SSd``: a copy is on flash at the start of stage ``t`` if some earlier stage wrote it."""
    before = np.cumsum(M_out, axis=0) > 0
    disk = np.zeros_like(M_out, dtype=bool)
    disk[1:] = before[:-1]
    return disk


def _minimal_storage(tg: TrainingGraph, R: np.ndarray, M_in: np.ndarray,
                     M_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop useless recomputations, then the least ``S`` that makes the schedule runnable.

    Going backwards over the stages: a recomputation (``R[t,i]``, ``i < t``) that no later
    computation of the stage reads, that is not paged out and that stage ``t+1`` does not need
    is dropped (elementwise operators cost 0 FLOPs, so the MILP is indifferent to them). Then a
    value is needed in RAM at the start of stage ``t`` when a computation of the stage reads it
    without recomputing it first, when the stage pages it out without computing it, or when
    stage ``t+1`` needs it and the stage neither computes nor pages it in. Both steps only
    remove work and memory.

    Page-ins whose value stage ``t+1`` does not need are dropped too.

    Returns:
        ``(R, S, M_in)``.
    """
    n = len(tg.nodes)
    R, M_in = R.copy(), M_in.copy()
    S = np.zeros((n, n), dtype=bool)
    for t in range(n - 1, -1, -1):
        if t + 1 < n:
            M_in[t] &= S[t + 1]
        carry = S[t + 1] & ~M_in[t] if t + 1 < n else np.zeros(n, dtype=bool)
        for i in reversed(np.flatnonzero(R[t, :t]).tolist()):
            read = any(R[t, j] for j in tg.consumers[i] if j <= t)
            if not read and not carry[i] and not M_out[t, i]:
                R[t, i] = False
        need = (M_out[t] | carry) & ~R[t]
        for k in np.flatnonzero(R[t]):
            for d in tg.nodes[k].deps:
                if not R[t, d]:
                    need[d] = True
        S[t] = need
    return R, S, M_in


def _first_page_outs(M_in: np.ndarray, M_out: np.ndarray) -> np.ndarray:
    """Keep only the first page-out of each value, and only if a page-in follows (a copy persists)."""
    kept = np.zeros_like(M_out)
    for i in range(M_out.shape[1]):
        outs = np.flatnonzero(M_out[:, i])
        ins = np.flatnonzero(M_in[:, i])
        if len(outs) and len(ins) and ins[-1] > outs[0]:
            kept[outs[0], i] = True
    return kept


def schedule_from_decisions(tg: TrainingGraph, R: np.ndarray, M_in: np.ndarray | None = None,
                            M_out: np.ndarray | None = None) -> GraphSchedule:
    n = len(tg.nodes)
    M_in = np.zeros((n, n), dtype=bool) if M_in is None else M_in.astype(bool)
    M_out = np.zeros((n, n), dtype=bool) if M_out is None else M_out.astype(bool)
    R, _, M_in = _minimal_storage(tg, R.astype(bool), M_in, M_out)
    M_out = _first_page_outs(M_in, M_out)
    R, S, M_in = _minimal_storage(tg, R, M_in, M_out)
    return GraphSchedule(R=R, S=S, M_in=M_in, M_out=M_out, SSd=_on_disk(M_out))


def simulate_graph_schedule(tg: TrainingGraph, schedule: Any, *, memory_bytes: int | None = None) -> GraphStats:
    """Replay a schedule's decision matrices independently of the MILP; check and cost every step.

    ``schedule`` is anything with ``R``, ``S``, ``M_in``, ``M_out`` boolean ``[stage, node]`` arrays
    (a :class:`MilpResult`, a :class:`GraphSchedule`). The replay follows NOTE [ Memory
    accounting ]: at each stage start RAM holds ``S[t]``; nodes with ``R[t]`` run in index order,
    each input freed right after its last reader of the stage unless ``S[t+1]`` keeps it (a value
    paged in at the end of the stage, ``M_in[t]``, is not kept: it is freed and read back);
    page-outs need the value in RAM during the stage, page-ins a copy on flash and land after the
    stage's frees, so they are counted in the next stage's starting memory, which is checked.

    Raises:
        ScheduleError: a dependency not in RAM, a value kept that was not available, a page-in
            with nothing on flash, a stage that does not compute its own node, or (with
            ``memory_bytes``) a peak above the budget.
    """
    n = len(tg.nodes)
    R, S, M_in, M_out = (np.asarray(getattr(schedule, k), dtype=bool) for k in ("R", "S", "M_in", "M_out"))
    mem = [n_.mem_bytes for n_ in tg.nodes]
    if any(m.shape != (n, n) for m in (R, S, M_in, M_out)):
        raise ScheduleError(f"decision matrices must be {n}x{n}")
    if not R.diagonal().all() or np.triu(R, 1).any():
        raise ScheduleError("stage t must compute node t and no later node (frontier advancing)")
    available: set[int] = set()
    disk: set[int] = set()
    peak = peak_disk = 0
    for t in range(n):
        start = set(np.flatnonzero(S[t]).tolist())
        if not start <= available:
            raise ScheduleError(f"stage {t}: keeps {sorted(start - available)} which are not available")
        copies = {i: 1 for i in start}
        current = tg.resident_bytes + sum(mem[i] for i in start)
        peak = max(peak, current)   # kept values and the previous stage's page-ins, all in RAM
        computed = np.flatnonzero(R[t]).tolist()
        # A value paged in at the end of the stage is not kept through it: freed after its last reader.
        keep_next = S[t + 1] & ~M_in[t] if t + 1 < n else np.zeros(n, dtype=bool)
        for pos, k in enumerate(computed):
            missing = [d for d in tg.nodes[k].deps if d not in copies]
            if missing:
                raise ScheduleError(f"stage {t}: node {k} ({tg.nodes[k].name}) needs {missing}, not in RAM")
            copies[k] = copies.get(k, 0) + 1
            current += mem[k]
            peak = max(peak, current + tg.nodes[k].workspace_bytes)
            later = computed[pos + 1:]
            for d in tg.nodes[k].deps:
                if not keep_next[d] and not any(d in tg.nodes[j].deps for j in later):
                    current -= mem[d] * copies.pop(d)
        for i in np.flatnonzero(M_out[t]).tolist():
            if i not in start and not R[t, i]:
                raise ScheduleError(f"stage {t}: pages out {i} which is not in RAM")
            disk.add(i)
        paged_in = np.flatnonzero(M_in[t]).tolist()
        for i in paged_in:
            if i not in disk:
                raise ScheduleError(f"stage {t}: pages in {i} which is not on flash")
        peak_disk = max(peak_disk, sum(mem[i] for i in disk))
        available = start | set(computed) | set(paged_in)
    if memory_bytes is not None and peak > memory_bytes:
        raise ScheduleError(f"peak {peak} B exceeds the budget {memory_bytes} B")
    e = tg.array("energy_j")
    return GraphStats(
        peak_bytes=int(peak),
        time_s=float((R.sum(0) * tg.array("time_s")).sum() + (M_in.sum(0) * tg.array("pagein_time_s")).sum()
                     + (M_out.sum(0) * tg.array("pageout_time_s")).sum()),
        energy_compute_j=float((R.sum(0) * e).sum()),
        energy_pagein_j=float((M_in.sum(0) * tg.array("pagein_energy_j")).sum()),
        energy_pageout_j=float((M_out.sum(0) * tg.array("pageout_energy_j")).sum()),
        peak_disk_bytes=int(peak_disk))
