"""The compiled (numba) solver of the paging table; see ``paging.py``.

It is ``_optimal_kernel.py``'s loop (same saturation trick: a candidate that is constant from
some memory on is entered once as a "tail" and spread by a running minimum) with costs in
place of times and the paged moves of NOTE [ The paging DP ], evaluated after the unpaged
ones and in increasing choice code so that, as in ``paging._solve_reference``, ties go to the
smallest code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._optimal_kernel import _better, _ceil_div, _finish_row, _row

__all__ = ["solve_paging_table"]


@njit(cache=True, nogil=True)
def _move(out: int, const: float, code: int, low: int, high: int, width: int, child_a: int, hold_a: int,
          child_b: int, hold_b: int, cost_s: np.ndarray, choice: np.ndarray, tail_cost: np.ndarray,
          tail_choice: np.ndarray) -> None:
    """Enter ``const + row_a[m - hold_a] + row_b[m - hold_b]`` for ``m`` in ``[low, high)`` and its tail.

    ``child_a`` / ``child_b`` are flat row offsets; ``child_b < 0`` means no second child.
    """
    last = width - 1
    for m in range(low, high):
        at = np.uint64(out + m)
        candidate = const + cost_s[np.uint64(child_a - hold_a + m)]
        if child_b >= 0:
            candidate += cost_s[np.uint64(child_b - hold_b + m)]
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
    elif need < width:
        if _better(turn_cost[s], s, tail_cost[need], tail_choice[need]):
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
def solve_paging_table(needed: np.ndarray, turn_cost: np.ndarray, sweep_cost: np.ndarray, child_entry: np.ndarray,
                       record_need_units: np.ndarray, record_hold_units: np.ndarray,
                       checkpoint_hold_units: np.ndarray, entry_bytes: np.ndarray, sweep_bytes: np.ndarray,
                       delta_bytes: np.ndarray, grad_units: np.ndarray, unit_bytes: int, max_units: int,
                       value_paging_cost: np.ndarray, value_can_page: np.ndarray, record_can_page: np.ndarray,
                       record_paging_cost: np.ndarray, record_hold_units_paged: np.ndarray,
                       record_need_units_paged: np.ndarray, late: np.ndarray, checkpoint_hold_units_paged: np.ndarray,
                       paged_sweep_bytes: np.ndarray, recompute: bool) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``cost[e, row(s, t), m]`` and ``choice[e, row(s, t), m]`` (codes as in ``paging.py``)."""
    length = turn_cost.shape[0]
    width = max_units + 1
    rows = length * (length + 1) // 2
    cost_s = np.full(2 * rows * width, np.inf)
    choice = np.full(2 * rows * width, -1, np.int32)
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
