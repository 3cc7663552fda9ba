"""The compiled (numba) solver of the optimal-checkpointing table; see ``optimal.py``.

It fills the same table as ``optimal._solve_reference``, bit for bit: the same additions in
the same order and the same tie-breaking (the least ``(time, choice)`` pair). Besides
compilation, two things make it fast:

* the innermost loop scans memory units ``m`` over contiguous rows of the two sub-problems,
  through flat unsigned offsets (no per-row array views to reference-count, no
  negative-index fix-ups);
* *saturation*: from the first ``m`` where a sub-problem reaches its best time its row is
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


@njit(cache=True, nogil=True)
def _solve_row(e: int, s: int, t: int, turn_time_s: np.ndarray, sweep_time_s: np.ndarray,
               child_entry: np.ndarray, record_need_units: np.ndarray, record_hold_units: np.ndarray,
               checkpoint_hold_units: np.ndarray, entry_bytes: np.ndarray, sweep_bytes: np.ndarray,
               delta_bytes: np.ndarray, grad_units: np.ndarray, unit_bytes: int, rows: int, width: int,
               cost_s: np.ndarray, choice: np.ndarray, first: np.ndarray, saturated: np.ndarray) -> None:
    """Fill row ``P(s, t)`` for entry state ``e``; the rows of shorter sub-chains are final.

    ``cost_s`` and ``choice`` are the flat tables; row ``(e, r)`` starts at ``(e * rows + r) * width``
    (flat offsets rather than per-row views keep reference counting out of the loops).
    """
    last = width - 1
    out = (e * rows + _row(s, t)) * width
    tail_cost = np.full(width, np.inf)
    tail_choice = np.full(width, -1, np.int32)
    # (a) record stage s
    low = record_need_units[e, s, t]
    if s < t:
        entry = child_entry[s]
        hold = record_hold_units[e, s]
        low = max(low, first[entry, s + 1, t] + hold)
        high = min(max(low, saturated[entry, s + 1, t] + hold), width)
        child = (entry * rows + _row(s + 1, t)) * width - hold
        for m in range(low, high):
            cost_s[out + m] = turn_time_s[s] + cost_s[child + m]
            choice[out + m] = s
        if high < width:
            tail_cost[high] = turn_time_s[s] + cost_s[child + hold + last]
            tail_choice[high] = s
    elif low < width:
        tail_cost[low] = turn_time_s[s] + 0.0
        tail_choice[low] = s
    # (b) checkpoint x_k
    hold = checkpoint_hold_units[e, s]
    for k in range(s + 1, t + 1):
        need = _ceil_div(delta_bytes[t + 1] + entry_bytes[e, s] + sweep_bytes[s, k], unit_bytes)
        grads = grad_units[k, t]
        low = max(need, first[1, k, t] + hold, first[e, s, k - 1] + grads)
        high = min(max(low, saturated[1, k, t] + hold, saturated[e, s, k - 1] + grads), width)
        upper = (rows + _row(k, t)) * width - hold
        lower = (e * rows + _row(s, k - 1)) * width - grads
        advance_s = sweep_time_s[s, k]
        for m in range(low, high):   # unsigned indices: no negative-index fix-ups in the hot loop
            at = np.uint64(out + m)
            candidate = advance_s + cost_s[np.uint64(upper + m)] + cost_s[np.uint64(lower + m)]
            if candidate < cost_s[at]:   # earlier entries have smaller choices: strict is the tie rule
                cost_s[at] = candidate
                choice[at] = k
        if high < width:
            candidate = advance_s + cost_s[upper + hold + last] + cost_s[lower + grads + last]
            if _better(candidate, k, tail_cost[high], tail_choice[high]):
                tail_cost[high] = candidate
                tail_choice[high] = k
    _finish_row(e, s, t, out, width, tail_cost, tail_choice, cost_s, choice, first, saturated)


@njit(cache=True, nogil=True)
def solve_table(needed: np.ndarray, turn_time_s: np.ndarray, sweep_time_s: np.ndarray, child_entry: np.ndarray,
                record_need_units: np.ndarray, record_hold_units: np.ndarray, checkpoint_hold_units: np.ndarray,
                entry_bytes: np.ndarray, sweep_bytes: np.ndarray, delta_bytes: np.ndarray,
                grad_units: np.ndarray, unit_bytes: int, max_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``cost_s[e, row(s, t), m]`` and ``choice[e, row(s, t), m]`` for every needed ``(e, s)``.

    The arguments are the fields of ``optimal._Grid`` (same names). ``choice`` is ``s`` for
    "record stage s", ``k > s`` for "checkpoint x_k", and ``-1`` where nothing fits (or where
    ``needed[e, s]`` is false: no schedule ever reaches that sub-problem).
    """
    length = turn_time_s.shape[0]
    width = max_units + 1
    rows = length * (length + 1) // 2
    cost_s = np.full(2 * rows * width, np.inf)
    choice = np.full(2 * rows * width, -1, np.int16)
    first = np.full((2, length, length), width, np.int64)      # least feasible m of P(s, t)
    saturated = np.full((2, length, length), width, np.int64)  # least m with the row's best time
    for span in range(length):
        for s in range(length - span):
            for e in range(2):
                if not needed[e, s]:
                    continue
                _solve_row(e, s, s + span, turn_time_s, sweep_time_s, child_entry, record_need_units,
                           record_hold_units, checkpoint_hold_units, entry_bytes, sweep_bytes, delta_bytes,
                           grad_units, unit_bytes, rows, width, cost_s, choice, first, saturated)
    return cost_s.reshape((2, rows, width)), choice.reshape((2, rows, width))
