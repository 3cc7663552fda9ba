"""The simulator is the oracle every planner is judged by: check it against hand-computed cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgetrain import Backward, Chain, Discard, Forward, Keep, Schedule, ScheduleError, StageCost, keep_all, simulate
from edgetrain.core.schedule import PageIn, PageInRecord, PageOut, PageOutRecord
from edgetrain.core.simulator import memory_timeline


def ops(*items: Forward | Backward | Discard) -> tuple[Forward | Backward | Discard, ...]:
    return tuple(items)


def test_keep_all_on_unit_chain_counts_every_activation_and_one_gradient() -> None:
    # x_0 (1) + five recorded stages (1 each) + δ_4 from the loss's backward = 7.
    stats = simulate(Chain.uniform(5), keep_all(5))
    assert stats.peak_bytes == 7
    assert stats.time_s == 10.0
    assert stats.forward_advances == 0
    assert stats.recompute_factor == 1.0


def test_checkpointed_schedule_is_cheaper_in_memory_and_counts_advances() -> None:
    chain = Chain.uniform(5)
    schedule = Schedule(ops(
        Forward(0, Keep.INPUT), Forward(1), Forward(2, Keep.INPUT), Forward(3, Keep.ALL), Forward(4, Keep.ALL),
        Backward(4), Backward(3), Forward(2, Keep.ALL), Backward(2),
        Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1), Backward(0)), 5)
    stats = simulate(chain, schedule)
    # Peak at Backward(4): x_0, x_2 (checkpoint), x_3 (kept by stage 3's record), the records of
    # stages 3 and 4 (holding x_4 and the loss), and the new gradient δ_4: 6 units, not keep-all's 7.
    assert stats.peak_bytes == 6
    assert stats.peak_op == 5
    assert stats.forward_advances == 3
    assert stats.forward_count == 8
    assert stats.time_s == 13.0
    assert stats.recompute_factor == pytest.approx(1.3)


def test_gradients_and_optimizer_state_are_counted() -> None:
    chain = Chain.uniform(3, param_bytes=10).with_optimizer("sgd")
    stats = simulate(chain, keep_all(3))
    # Resident: weights 30 + momentum 30 + x_0 1. The backward of stage 0 holds its record (1)
    # and δ_1 (1) while its gradients (10) join the 20 of stages 1 and 2.
    assert chain.resident_bytes == 61
    assert stats.peak_bytes == 61 + 1 + 1 + 30
    assert stats.peak_grad_bytes == 30


def test_the_loss_held_to_the_step_end_adds_its_bytes_at_every_op_and_to_the_optimizer_step() -> None:
    """``loss_held_bytes`` (the loss a step returns and its seed gradient) sits with the resident state:
    every op's memory, and the optimizer step's, is exactly that much more."""
    schedule = Schedule(ops(
        Forward(0, Keep.INPUT), Forward(1), Forward(2, Keep.INPUT), Forward(3, Keep.ALL), Forward(4, Keep.ALL),
        Backward(4), Backward(3), Forward(2, Keep.ALL), Backward(2),
        Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1), Backward(0)), 5)
    plain = Chain.uniform(5, param_bytes=10).with_optimizer("sgd")
    held = replace(plain, loss_held_bytes=8)
    assert held.resident_bytes == plain.resident_bytes + 8
    for chosen in (schedule, keep_all(5)):
        before, after = memory_timeline(plain, chosen), memory_timeline(held, chosen)
        assert [m.transient_bytes + 8 for m in before] == [m.transient_bytes for m in after]
        assert [m.after_bytes + 8 for m in before] == [m.after_bytes for m in after]
        assert simulate(held, chosen).peak_bytes == simulate(plain, chosen).peak_bytes + 8
    # the optimizer step's peak (weights, momentum, x_0, every gradient) as the step's peak
    weighty = replace(plain, optimizer_workspace_bytes=1000)
    assert simulate(replace(weighty, loss_held_bytes=8), keep_all(5)).peak_bytes == 50 + 50 + 1 + 50 + 1000 + 8


def test_generator_states_are_held_from_a_recomputed_stages_first_forward_to_its_recorded_one() -> None:
    """NOTE [ Generator states in the plan ]: stages 0, 1, 2 are forwarded twice. At Forward(2, ALL) (op 7) the
    states of stages 0 and 1 are still held, stage 2's too, and its replay copies the current state: 4 states of
    100 bytes over x_0, x_2, x_3 and δ_3; without states the peak is 6 (Backward(4))."""
    schedule = Schedule(ops(
        Forward(0, Keep.INPUT), Forward(1), Forward(2, Keep.INPUT), Forward(3, Keep.ALL), Forward(4, Keep.ALL),
        Backward(4), Backward(3), Forward(2, Keep.ALL), Backward(2),
        Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1), Backward(0)), 5)
    drawing = replace(Chain.uniform(5), rng_state_bytes=100)
    stats = simulate(drawing, schedule)
    assert (stats.peak_bytes, stats.peak_op) == (4 + 4 * 100, 7)
    # after each op: values and δ, then the states held (0; 0, 1; 0, 1, 2 until stage 2's record; 0, 1; 1; none)
    assert [m.after_bytes for m in memory_timeline(drawing, schedule)] == [
        2 + 100, 2 + 200, 3 + 300, 4 + 300, 5 + 300, 5 + 300, 3 + 300, 4 + 200, 2 + 200, 3 + 100, 4, 3, 1]
    assert simulate(drawing, keep_all(5)).peak_bytes == 7   # nothing recomputed, nothing replayed
    assert simulate(Chain.uniform(5), schedule).peak_bytes == 6   # a chain without states
    deterministic = replace(drawing, stages=tuple(replace(s, uses_rng=False) for s in drawing.stages))
    assert simulate(deterministic, schedule).peak_bytes == 6
    assert drawing.rng_reserve_bytes == 6 * 100 and deterministic.rng_reserve_bytes == 0


def test_unsaved_values_die_with_the_next_forward() -> None:
    # Stage 1 neither keeps its input nor is x_1 kept by stage 0: plain backprop frees x_1.
    stages = (StageCost("a", 1, 1, out_bytes=100, saved_bytes=100, output_saved=False),
              StageCost("b", 1, 1, out_bytes=100, saved_bytes=100, input_saved=False),
              StageCost("loss", 1, 1, out_bytes=1, saved_bytes=1))
    chain = Chain(stages=stages, input_bytes=0)
    pinned = Chain(stages=tuple(StageCost(s.name, 1, 1, s.out_bytes, s.saved_bytes) for s in stages), input_bytes=0)
    assert simulate(pinned, keep_all(3)).peak_bytes - simulate(chain, keep_all(3)).peak_bytes == 100


@pytest.mark.parametrize("bad, message", [
    (ops(Forward(1, Keep.ALL)), "input x_1 is not in memory"),
    (ops(Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(0)), "gradient δ_1"),
    (ops(Forward(0), Backward(0)), "not recorded"),
    (ops(Forward(0, Keep.ALL), Forward(0, Keep.ALL)), "already recorded"),
    (ops(Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1), Backward(1)), "already back-propagated"),
    (ops(Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1)), "ends before the backward of stage 0"),
    (ops(Discard(0)), "caller's input"),
    (ops(Forward(0, Keep.INPUT), Discard(1), Discard(1)), "op 2 Discard(value=1): x_1 is not held"),
    (ops(Forward(5, Keep.ALL)), "no stage 5"),
])
def test_validation_names_the_bad_op(bad: tuple[Forward | Backward | Discard, ...], message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simulate(Chain.uniform(2), Schedule(bad, 2))


def test_schedule_round_trips_through_json(tmp_path) -> None:
    schedule = Schedule(ops(Forward(0, Keep.INPUT), Discard(1), Forward(0, Keep.ALL), Forward(1, Keep.ALL),
                            Backward(1), Backward(0)), 2, strategy="hand", params={"note": 1})
    path = tmp_path / "s.json"
    schedule.save(path)
    loaded = Schedule.load(path)
    assert loaded == schedule
    assert loaded.strategy == "hand" and loaded.params == {"note": 1}
    assert simulate(Chain.uniform(2), loaded).forward_advances == 1


def test_unknown_schedule_version_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="version"):
        Schedule.from_dict({"version": 99, "length": 1, "ops": []})


def test_chain_round_trips_through_json(tmp_path) -> None:
    chain = Chain.uniform(4, act_bytes=3, param_bytes=2).with_optimizer("adam")
    chain.save(tmp_path / "c.json")
    assert Chain.load(tmp_path / "c.json") == chain


VALID = {"version": 2, "length": 2, "strategy": "hand", "params": {},
         "ops": [["F", 0, "all"], ["F", 1, "all"], ["B", 1], ["B", 0]]}


def with_op(index: int, op: object) -> dict[str, object]:
    ops = list(VALID["ops"])  # type: ignore[call-overload]
    ops[index] = op
    return {**VALID, "ops": ops}


@pytest.mark.parametrize(("data", "message"), [
    ([1, 2], "a schedule is a JSON object, got list"),
    ({k: v for k, v in VALID.items() if k != "ops"}, "schedule is missing key 'ops'"),
    ({k: v for k, v in VALID.items() if k != "length"}, "schedule is missing key 'length'"),
    ({**VALID, "extra": 1}, "schedule has unknown key 'extra'; valid keys: length, ops, params, strategy, version"),
    ({**VALID, "version": True}, "unsupported schedule version True; this edgetrain reads 1, 2"),
    ({**VALID, "length": 2.0}, "schedule 'length' must be a positive integer, got 2.0"),
    ({**VALID, "length": "2"}, "schedule 'length' must be a positive integer, got '2'"),
    ({**VALID, "length": 0}, "schedule 'length' must be a positive integer, got 0"),
    ({**VALID, "strategy": 3}, "schedule 'strategy' must be a string, got 3"),
    ({**VALID, "params": []}, "schedule 'params' must be an object, got []"),
    ({**VALID, "ops": {"F": 0}}, "schedule 'ops' must be a list, got dict"),
    (with_op(1, ["F", 1.5, "all"]), "schedule op 1: the stage or value must be a non-negative integer, got 1.5"),
    (with_op(1, ["F", "1", "all"]), "schedule op 1: the stage or value must be a non-negative integer, got '1'"),
    (with_op(2, ["B", True]), "schedule op 2: the stage or value must be a non-negative integer, got True"),
    (with_op(3, ["B", -1]), "schedule op 3: the stage or value must be a non-negative integer, got -1"),
    (with_op(0, ["F", 0, "most"]), "schedule op 0: keep must be one of none, input, all, got 'most'"),
    (with_op(0, ["F", 0]), "schedule op 0: 'F' takes 2 argument(s), got ['F', 0]"),
    (with_op(2, ["B", 1, "all"]), "schedule op 2: 'B' takes 1 argument(s), got ['B', 1, 'all']"),
    (with_op(2, ["X", 1]), "schedule op 2: unknown op kind 'X'; valid kinds: F, B, D, O, I, OR, IR"),
    (with_op(2, []), "schedule op 2: expected a list [kind, stage, ...], got []"),
    (with_op(2, "B1"), "schedule op 2: expected a list [kind, stage, ...], got 'B1'"),
])
def test_malformed_schedule_is_refused_by_name(data: object, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule.from_dict(data)
    assert str(caught.value) == message


def test_malformed_json_file_is_refused_with_its_position(tmp_path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"version": 2, "length": 2,\n "ops": [}')
    with pytest.raises(ScheduleError) as caught:
        Schedule.load(path)
    assert str(caught.value) == f"{path}: not valid JSON (Expecting value at line 2, column 10)"


def test_every_op_kind_round_trips_exactly(tmp_path) -> None:
    schedule = Schedule(ops(Forward(0, Keep.INPUT), PageOut(0), Forward(1, Keep.NONE), Discard(2), PageIn(0),
                            Forward(0, Keep.ALL), PageOutRecord(0), PageInRecord(0), Forward(1, Keep.ALL),
                            Backward(1), Backward(0)), 2, strategy="hand", params={"budget_bytes": 7})
    path = tmp_path / "s.json"
    schedule.save(path)
    loaded = Schedule.load(path)
    assert loaded.ops == schedule.ops and loaded.length == 2
    assert loaded.strategy == "hand" and loaded.params == {"budget_bytes": 7}
    assert loaded.to_dict() == schedule.to_dict()
