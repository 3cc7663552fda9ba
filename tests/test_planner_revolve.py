"""Tests of the Revolve planner: Griewank's closed form, an independent DP, and schedule invariants.

Golden numbers come from two sources that do not share code: Griewank's closed form
``t(l, s) = r*l - C(s+r, s+1)`` and the classic recurrence for the minimal number of
advances, solved here by brute force over every split.
"""

from __future__ import annotations

from functools import cache
from math import comb

import pytest

from edgetrain.core.chain import Chain
from edgetrain.core.schedule import Backward, Forward, Keep, Op, Schedule
from edgetrain.core.simulator import simulate, validate
from edgetrain.planners.revolve import revolve, revolve_advances, revolve_repetitions

DENSE_LENGTHS = [*range(1, 151), 200, 317, 500]
ALL_SLOTS = range(1, 31)


def count_advances(ops: tuple[Op, ...]) -> int:
    """Forwards that do not record, counted straight from the ops (no simulator)."""
    return sum(1 for op in ops if type(op) is Forward and op.keep is not Keep.ALL)


def first_sweep_saves(ops: tuple[Op, ...]) -> int:
    """Checkpoints stored before the first backward (``x_0`` included when it is advanced from)."""
    saves = 0
    for op in ops:
        if isinstance(op, Backward):
            break
        if isinstance(op, Forward) and op.keep is Keep.INPUT:
            saves += 1
    return saves


def max_live_checkpoints(ops: tuple[Op, ...]) -> int:
    """Peak count of checkpoints: ``x_0`` always, ``x_k`` from ``Forward(k, INPUT)`` to ``Backward(k)``."""
    live, most = {0}, 1
    for op in ops:
        if isinstance(op, Forward) and op.keep is Keep.INPUT:
            live.add(op.stage)
        elif isinstance(op, Backward) and op.stage > 0:
            live.discard(op.stage)
        most = max(most, len(live))
    return most


@cache
def dp_advances(length: int, slots: int) -> int:
    """Minimal advances by the recurrence ``t(l,s) = min_j [j + t(l-j, s-1) + t(j, s)]``.

    Advance ``j`` stages from the held ``x_0`` and store ``x_j`` (one more slot), reverse the
    upper ``l - j`` stages with the ``s - 1`` slots left (``x_j`` in one of them), drop
    ``x_j`` and reverse the lower ``j`` stages with all ``s`` slots again.
    """
    if length == 1:
        return 0
    if slots == 1:
        return length * (length - 1) // 2
    return min(j + dp_advances(length - j, slots - 1) + dp_advances(j, slots)
               for j in range(1, length))


# --- the closed form ---------------------------------------------------------------------------

@pytest.mark.parametrize(("length", "slots", "expected"), [
    (1, 1, 0), (1, 5, 0), (2, 1, 1), (10, 1, 45), (10, 2, 20), (10, 3, 15), (10, 9, 9), (10, 50, 9),
])
def test_closed_form_hand_values(length: int, slots: int, expected: int) -> None:
    """By hand: (10, 2) has r = 3 since C(5, 2) = 10, so t = 3*10 - C(5, 3) = 20;
    (10, 3) has r = 2 since C(5, 3) = 10, so t = 2*10 - C(5, 4) = 15."""
    assert revolve_advances(length, slots) == dp_advances(length, slots) == expected


def test_closed_form_matches_dp_recurrence() -> None:
    for length in range(1, 61):
        for slots in range(1, 9):
            assert revolve_advances(length, slots) == dp_advances(length, slots), (length, slots)


def test_closed_form_limits() -> None:
    for length in range(1, 200):
        assert revolve_advances(length, 1) == length * (length - 1) // 2
        assert revolve_advances(length, max(length - 1, 1)) == length - 1


def test_repetition_number_is_minimal() -> None:
    for length in range(1, 300):
        for slots in range(1, 12):
            r = revolve_repetitions(length, slots)
            assert comb(slots + r, slots) >= length
            assert r == 0 or comb(slots + r - 1, slots) < length


# --- the schedule reaches the closed form ------------------------------------------------------

@pytest.mark.parametrize("length", DENSE_LENGTHS)
def test_advances_equal_closed_form_dense(length: int) -> None:
    chain = Chain.uniform(length)
    for slots in ALL_SLOTS:
        ops = revolve(chain, slots).ops
        assert count_advances(ops) == revolve_advances(length, slots), slots


@pytest.mark.slow
def test_advances_equal_closed_form_full_grid() -> None:
    for length in range(1, 501):
        chain = Chain.uniform(length)
        for slots in ALL_SLOTS:
            advances = count_advances(revolve(chain, slots).ops)
            assert advances == revolve_advances(length, slots), (length, slots)


@pytest.mark.parametrize("length", range(1, 61))
def test_schedules_validate_and_simulate(length: int) -> None:
    chain = Chain.uniform(length)
    for slots in ALL_SLOTS:
        schedule = revolve(chain, slots)
        validate(chain, schedule)
        stats = simulate(chain, schedule)
        advances = count_advances(schedule.ops)
        assert stats.forward_advances == advances
        assert stats.forward_count == length + advances
        assert stats.backward_count == length
        assert stats.time_s == 2 * length + advances  # unit costs: each advance is one time unit


# --- invariants ----------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [1, 2, 3, 4, 7, 16, 33, 60, 152])
def test_every_stage_recorded_once_right_before_its_backward(length: int) -> None:
    for slots in (1, 2, 3, 5, 8, 30):
        ops = revolve(Chain.uniform(length), slots).ops
        turns = [(i, op.stage) for i, op in enumerate(ops) if isinstance(op, Forward) and op.keep is Keep.ALL]
        assert sorted(stage for _, stage in turns) == list(range(length))
        assert all(ops[i + 1] == Backward(stage) for i, stage in turns)
        backwards = [op.stage for op in ops if isinstance(op, Backward)]
        assert backwards == list(reversed(range(length)))


@pytest.mark.parametrize("length", range(1, 61))
def test_checkpoints_fill_the_slots(length: int) -> None:
    """Like pyrevolve's invariant: the first sweep stores ``min(slots, l - 1)`` checkpoints.

    ``x_0`` counts as one (it is advanced from with ``Keep.INPUT``); ``x_{l-1}`` is never
    stored since the first turn consumes it. No more than ``slots`` are ever held at once.
    """
    chain = Chain.uniform(length)
    for slots in ALL_SLOTS:
        ops = revolve(chain, slots).ops
        assert first_sweep_saves(ops) == min(slots, length - 1)
        assert max_live_checkpoints(ops) <= slots


@pytest.mark.parametrize("length", [*range(1, 41), 64, 100, 152])
def test_more_slots_fewer_advances_more_memory(length: int) -> None:
    chain = Chain.uniform(length)
    stats = [simulate(chain, revolve(chain, slots)) for slots in range(1, min(length, 30) + 2)]
    advances = [s.forward_advances for s in stats]
    peaks = [s.peak_bytes for s in stats]
    assert advances == sorted(advances, reverse=True)
    assert peaks == sorted(peaks)


@pytest.mark.parametrize("length", range(2, 61))
def test_peak_on_uniform_chain(length: int) -> None:
    """Peak of ``Chain.uniform(l)`` (1 byte per value, record and gradient) is ``min(s, l-2) + 4``.

    Backward(k) of a stage below the top holds: the live checkpoints (``x_0`` among them),
    ``x_k`` when it is not itself a checkpoint, stage ``k``'s record, the incoming gradient
    ``δ_{k+1}`` and the new ``δ_k``: at most ``slots + 4``. It is reached as soon as all
    slots are full when the first non-checkpoint stage below the top is reversed; with
    ``slots >= l - 2`` at most ``l - 2`` checkpoints are still live then, which is plain
    backprop's ``l + 2``.
    """
    chain = Chain.uniform(length)
    for slots in ALL_SLOTS:
        assert simulate(chain, revolve(chain, slots)).peak_bytes == min(slots, length - 2) + 4, slots


@pytest.mark.parametrize("length", [1, 5, 40])
def test_each_stage_advanced_at_most_r_times(length: int) -> None:
    """Griewank's repetition number bounds how often any one stage is advanced."""
    for slots in range(1, 12):
        ops = revolve(Chain.uniform(length), slots).ops
        per_stage = [0] * length
        for op in ops:
            if isinstance(op, Forward) and op.keep is not Keep.ALL:
                per_stage[op.stage] += 1
        assert max(per_stage) <= revolve_repetitions(length, slots)


# --- API -----------------------------------------------------------------------------------------

def test_strategy_and_params() -> None:
    schedule = revolve(Chain.uniform(12), 4)
    assert schedule.strategy == "revolve"
    assert schedule.params == {"slots": 4}
    assert schedule.length == 12


def test_schedule_round_trips_through_json() -> None:
    schedule = revolve(Chain.uniform(20), 3)
    assert Schedule.from_dict(schedule.to_dict()) == schedule


@pytest.mark.parametrize("slots", [0, -1])
def test_rejects_fewer_than_one_slot(slots: int) -> None:
    with pytest.raises(ValueError, match="slots must be >= 1"):
        revolve(Chain.uniform(5), slots)
    with pytest.raises(ValueError, match="slots must be >= 1"):
        revolve_advances(5, slots)


def test_long_chain_with_many_slots_does_not_recurse() -> None:
    chain = Chain.uniform(3000)
    assert count_advances(revolve(chain, 3000).ops) == 2999
