"""The compiled (numba) solver of the checkpointing DP's table; see ``grid.py`` and ``paging.py``.

It fills the same table as ``grid.solve_reference``, bit for bit: the same additions in
the same order and the same tie-breaking (the least ``(cost, choice code)`` pair). The moves
are ``optimal``'s (a) record and (b) checkpoint, then the paged moves (a') and (b') of NOTE
[ The paging DP ] (``paging.py``), which the recompute-only planner switches off. Besides
compilation, two things make it fast:

* the innermost loop scans memory units ``m`` over contiguous rows of the sub-problems,
  through flat unsigned offsets (no per-row array views to reference-count, no
  negative-index fix-ups);
* *saturation*: from the first ``m`` where a sub-problem reaches its best cost its row is
  constant, so each candidate is constant from some ``m`` on; that constant is entered once
  as a "tail" and spread by a running minimum instead of being evaluated at every ``m``.

It runs on one thread: sub-problems of one length are independent, but a parallel region
per length costs more than it saves on a busy 2-core machine (measured: 0.08 s serial
against 1.2 s with two threads for LinearResNet-152). numba is imported here only, and this
module only when a table is solved.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["solve_table"]


@njit(cache=True, nogil=True)
def _row(s: int, t: int) -> int:
    """Row of ``P(s, t)`` in the packed triangular table (rows grouped by ``t``)."""
    return t * (t + 1) // 2 + s


@njit(cache=True, nogil=True)
def _better(value: float, index: int, best_value: float, best_index: int) -> bool:
    """Whether ``(value, index)`` is lexicographically below ``(best_value, best_index)``."""
    return value < best_value or (value == best_value and index < best_index)


@njit(cache=True, nogil=True)
def _ceil_div(n_bytes: int, unit_bytes: int) -> int:
    return -((-n_bytes) // unit_bytes)


@njit(cache=True, nogil=True)
def _finish_row(e: int, s: int, t: int, out: int, width: int, tail_cost: np.ndarray, tail_choice: np.ndarray,
                cost_s: np.ndarray, choice: np.ndarray, first: np.ndarray, saturated: np.ndarray) -> None:
    """Spread the tails over the row, then note where it becomes feasible and where it saturates."""
    last = width - 1
    run_cost, run_choice = np.inf, -1
    for m in range(width):
        if _better(tail_cost[m], tail_choice[m], run_cost, run_choice):
            run_cost, run_choice = tail_cost[m], tail_choice[m]
        if _better(run_cost, run_choice, cost_s[out + m], choice[out + m]):
            cost_s[out + m], choice[out + m] = run_cost, run_choice
    for m in range(width):
        if choice[out + m] >= 0:
            first[e, s, t] = m
            break
    if choice[out + last] >= 0:
        m = last
        while m > 0 and cost_s[out + m - 1] == cost_s[out + last]:
            m -= 1
        saturated[e, s, t] = m


@njit(cache=True, nogil=True, inline="always")
def _move(out: int, const: float, code: int, low: int, high: int, width: int, child_a: int, hold_a: int,
          child_b: int, hold_b: int, cost_s: np.ndarray, choice: np.ndarray, tail_cost: np.ndarray,
          tail_choice: np.ndarray) -> None:
    """Enter ``const + row_a[m - hold_a] + row_b[m - hold_b]`` for ``m`` in ``[low, high)`` and its tail.

    ``child_a`` / ``child_b`` are flat row offsets; ``child_b < 0`` means no second child.
    """
    last = width - 1
    # Two loops rather than a test per m: the hot loop of every table (measured: 20-30% of the solve).
    if child_b >= 0:
        for m in range(low, high):   # unsigned indices: no negative-index fix-ups in the hot loop
            at = np.uint64(out + m)
            candidate = const + cost_s[np.uint64(child_a - hold_a + m)] + cost_s[np.uint64(child_b - hold_b + m)]
            if candidate < cost_s[at]:   # earlier entries have smaller codes: strict is the tie rule
                cost_s[at] = candidate
                choice[at] = code
    else:
        for m in range(low, high):
            at = np.uint64(out + m)
            candidate = const + cost_s[np.uint64(child_a - hold_a + m)]
            if candidate < cost_s[at]:
                cost_s[at] = candidate
                choice[at] = code
    if high < width:
        candidate = const + cost_s[child_a + last]
        if child_b >= 0:
            candidate += cost_s[child_b + last]
        if _better(candidate, code, tail_cost[high], tail_choice[high]):
            tail_cost[high] = candidate
            tail_choice[high] = code


@njit(cache=True, nogil=True)
def _solve_row(e: int, s: int, t: int, turn_cost: np.ndarray, sweep_cost: np.ndarray, child_entry: np.ndarray,
               record_need_units: np.ndarray, record_hold_units: np.ndarray, checkpoint_hold_units: np.ndarray,
               entry_bytes: np.ndarray, sweep_bytes: np.ndarray, delta_bytes: np.ndarray, grad_units: np.ndarray,
               unit_bytes: int, value_paging_cost: np.ndarray, value_can_page: np.ndarray,
               record_can_page: np.ndarray, record_paging_cost: np.ndarray, record_hold_units_paged: np.ndarray,
               record_need_units_paged: np.ndarray, late: np.ndarray, checkpoint_hold_units_paged: np.ndarray,
               paged_sweep_bytes: np.ndarray, recompute: bool, rows: int, width: int,
               cost_s: np.ndarray, choice: np.ndarray, first: np.ndarray, saturated: np.ndarray) -> None:
    """Fill row ``P(s, t)`` for entry state ``e``; the rows of shorter sub-chains are final.

    ``cost_s`` and ``choice`` are the flat tables; row ``(e, r)`` starts at ``(e * rows + r) * width``
    (flat offsets rather than per-row views keep reference counting out of the loops).
    """
    length = turn_cost.shape[0]
    out = (e * rows + _row(s, t)) * width
    tail_cost = np.full(width, np.inf)
    tail_choice = np.full(width, -1, np.int32)
    none = -1
    # (a) record s
    need = record_need_units[e, s, t]
    if s < t:
        entry = child_entry[s]
        hold = record_hold_units[e, s]
        low = max(need, first[entry, s + 1, t] + hold)
        high = min(max(low, saturated[entry, s + 1, t] + hold), width)
        _move(out, turn_cost[s], s, low, high, width, (entry * rows + _row(s + 1, t)) * width, hold, none, 0,
              cost_s, choice, tail_cost, tail_choice)
    elif need < width and _better(turn_cost[s], s, tail_cost[need], tail_choice[need]):
        tail_cost[need] = turn_cost[s]
        tail_choice[need] = s
    # (b) checkpoint x_k
    hold = checkpoint_hold_units[e, s]
    for k in range(s + 1, t + 1 if recompute else s + 1):
        need = _ceil_div(delta_bytes[t + 1] + entry_bytes[e, s] + sweep_bytes[s, k], unit_bytes)
        grads = grad_units[k, t]
        low = max(need, first[1, k, t] + hold, first[e, s, k - 1] + grads)
        high = min(max(low, saturated[1, k, t] + hold, saturated[e, s, k - 1] + grads), width)
        _move(out, sweep_cost[s, k], k, low, high, width, (rows + _row(k, t)) * width, hold,
              (e * rows + _row(s, k - 1)) * width, grads, cost_s, choice, tail_cost, tail_choice)
    # (a') record s and page (v = 0) x_s, (1) the record's internals, (2) both; with no child
    #      only x_s when it stays out through the backward (late)
    for v in range(3):
        if not record_can_page[v, e, s] or record_need_units_paged[v, e, s, t] >= width:
            continue
        need = record_need_units_paged[v, e, s, t]
        if s < t:
            entry = child_entry[s]
            hold = record_hold_units_paged[v, e, s]
            low = max(need, first[entry, s + 1, t] + hold)
            high = min(max(low, saturated[entry, s + 1, t] + hold), width)
            _move(out, turn_cost[s] + record_paging_cost[v, s], (v + 1) * length + s, low, high, width,
                  (entry * rows + _row(s + 1, t)) * width, hold, none, 0, cost_s, choice, tail_cost, tail_choice)
        elif v == 0 and late[e, s]:
            candidate = turn_cost[s] + record_paging_cost[v, s]
            if _better(candidate, (v + 1) * length + s, tail_cost[need], tail_choice[need]):
                tail_cost[need] = candidate
                tail_choice[need] = (v + 1) * length + s
    # (b') checkpoint x_k, page out x_s
    if value_can_page[e, s] and recompute:
        hold = checkpoint_hold_units_paged[e, s]
        for k in range(s + 1, t + 1):
            need = _ceil_div(delta_bytes[t + 1] + paged_sweep_bytes[e, s, k], unit_bytes)
            grads = grad_units[k, t]
            low = max(need, first[1, k, t] + hold, first[e, s, k - 1] + grads)
            high = min(max(low, saturated[1, k, t] + hold, saturated[e, s, k - 1] + grads), width)
            _move(out, sweep_cost[s, k] + value_paging_cost[s], 4 * length + k, low, high, width,
                  (rows + _row(k, t)) * width, hold, (e * rows + _row(s, k - 1)) * width, grads, cost_s, choice,
                  tail_cost, tail_choice)
    _finish_row(e, s, t, out, width, tail_cost, tail_choice, cost_s, choice, first, saturated)


@njit(cache=True, nogil=True)
def solve_table(needed: np.ndarray, turn_cost: np.ndarray, sweep_cost: np.ndarray, child_entry: np.ndarray,
                       record_need_units: np.ndarray, record_hold_units: np.ndarray,
                       checkpoint_hold_units: np.ndarray, entry_bytes: np.ndarray, sweep_bytes: np.ndarray,
                       delta_bytes: np.ndarray, grad_units: np.ndarray, unit_bytes: int, max_units: int,
                       value_paging_cost: np.ndarray, value_can_page: np.ndarray, record_can_page: np.ndarray,
                       record_paging_cost: np.ndarray, record_hold_units_paged: np.ndarray,
                       record_need_units_paged: np.ndarray, late: np.ndarray, checkpoint_hold_units_paged: np.ndarray,
                       paged_sweep_bytes: np.ndarray, recompute: bool) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``cost[e, row(s, t), m]`` and ``choice[e, row(s, t), m]`` for every needed ``(e, s)``.

    The arguments are the fields of ``grid.MovesGrid`` and of its ``base`` grid (same
    names). ``choice`` holds the move codes of ``grid.py`` and ``-1`` where nothing fits
    (or where ``needed[e, s]`` is false: no schedule ever reaches that sub-problem).
    """
    length = turn_cost.shape[0]
    width = max_units + 1
    rows = length * (length + 1) // 2
    cost_s = np.full(2 * rows * width, np.inf)
    choice = np.full(2 * rows * width, -1, np.int16)
    first = np.full((2, length, length), width, np.int64)
    saturated = np.full((2, length, length), width, np.int64)
    for span in range(length):
        for s in range(length - span):
            for e in range(2):
                if not needed[e, s]:
                    continue
                _solve_row(e, s, s + span, turn_cost, sweep_cost, child_entry, record_need_units,
                           record_hold_units, checkpoint_hold_units, entry_bytes, sweep_bytes, delta_bytes,
                           grad_units, unit_bytes, value_paging_cost, value_can_page, record_can_page,
                           record_paging_cost, record_hold_units_paged, record_need_units_paged, late,
                           checkpoint_hold_units_paged, paged_sweep_bytes, recompute, rows, width, cost_s, choice,
                           first, saturated)
    return cost_s.reshape((2, rows, width)), choice.reshape((2, rows, width))
