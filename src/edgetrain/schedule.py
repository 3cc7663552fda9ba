"""Schedules as plain data, their validation, and the simulator every planner is judged by.

A schedule is a tuple of op records over the stages of a :class:`~edgetrain.chain.Chain`
(see NOTE [ The chain memory model ] in ``chain.py``):

* ``Forward(stage, keep)`` computes ``x_{stage+1}`` from ``x_stage``.
  ``keep="none"`` runs without autograd and releases the input afterwards;
  ``keep="input"`` runs without autograd and keeps the input (a checkpoint);
  ``keep="all"`` records the stage for backward and releases the input, which stays alive
  only if the record saved it (``StageCost.input_saved``).
* ``Backward(stage)`` back-propagates a recorded stage: it needs ``δ_{stage+1}`` (the last
  stage, the loss, seeds itself), produces ``δ_stage`` (not for stage 0: the input needs no
  gradient), frees the stage's record, and releases ``x_stage`` and ``x_{stage+1}``.
* ``Discard(value)`` releases a held value ``x_value`` early.

``x_0`` is the caller's input batch: always available, never released.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Union

from .chain import Chain
from .errors import ScheduleError

__all__ = ["Keep", "Forward", "Backward", "Discard", "Op", "Schedule", "Stats", "validate", "simulate",
           "keep_all"]

SCHEDULE_VERSION = 1


class Keep(str, Enum):
    NONE = "none"
    INPUT = "input"
    ALL = "all"


@dataclass(frozen=True)
class Forward:
    stage: int
    keep: Keep = Keep.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", Keep(self.keep))


@dataclass(frozen=True)
class Backward:
    stage: int


@dataclass(frozen=True)
class Discard:
    value: int


Op = Union[Forward, Backward, Discard]


@dataclass(frozen=True)
class Schedule:
    """A planner's output: the ops of one training step for a chain of ``length`` stages."""

    ops: tuple[Op, ...]
    length: int
    strategy: str = ""
    params: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))

    def to_dict(self) -> dict[str, object]:
        return {"version": SCHEDULE_VERSION, "length": self.length, "strategy": self.strategy,
                "params": self.params, "ops": [_op_to_list(op) for op in self.ops]}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Schedule:
        version = data.get("version")
        if version != SCHEDULE_VERSION:
            raise ScheduleError(f"unsupported schedule version {version!r}; this edgetrain reads {SCHEDULE_VERSION}")
        ops = tuple(_op_from_list(item) for item in data["ops"])  # type: ignore[union-attr]
        return cls(ops=ops, length=int(data["length"]), strategy=str(data.get("strategy", "")),  # type: ignore[arg-type]
                   params=dict(data.get("params", {})))  # type: ignore[arg-type]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _op_to_list(op: Op) -> list[object]:
    if isinstance(op, Forward):
        return ["F", op.stage, op.keep.value]
    if isinstance(op, Backward):
        return ["B", op.stage]
    return ["D", op.value]


def _op_from_list(item: list[object]) -> Op:
    kind, *args = item
    try:
        if kind == "F":
            return Forward(int(args[0]), Keep(args[1]))  # type: ignore[call-overload]
        if kind == "B":
            return Backward(int(args[0]))  # type: ignore[call-overload]
        if kind == "D":
            return Discard(int(args[0]))  # type: ignore[call-overload]
    except (IndexError, ValueError) as exc:
        raise ScheduleError(f"malformed op {item!r}: {exc}") from exc
    raise ScheduleError(f"unknown op kind {kind!r} in {item!r}")


def keep_all(length: int) -> Schedule:
    """Plain backprop: record every stage, then back-propagate them all."""
    ops: list[Op] = [Forward(i, Keep.ALL) for i in range(length)]
    ops += [Backward(i) for i in reversed(range(length))]
    return Schedule(tuple(ops), length, strategy="none")


@dataclass(frozen=True)
class Stats:
    """What a schedule costs on a chain, from :func:`simulate`.

    ``forward_advances`` counts forwards that do not record (Griewank's "advances"); every
    stage is recorded exactly once, so ``forward_count = length + forward_advances``.
    """

    peak_bytes: int
    time_s: float
    forward_advances: int
    forward_count: int
    backward_count: int
    peak_op: int | None
    resident_bytes: int
    recompute_factor: float
    peak_grad_bytes: int = 0

    @property
    def activation_peak_bytes(self) -> int:
        """Peak above the resident weights, optimizer state and input."""
        return self.peak_bytes - self.resident_bytes


class _State:
    """Live values, records and gradients while a schedule runs; sizes from the chain."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.values = chain.value_bytes
        self.held: set[int] = {0}
        self.recorded: set[int] = set()
        self.done: set[int] = set()
        self.delta: int | None = chain.length  # δ_L: the loss seeds its own gradient (0 bytes)
        self.grads = 0

    def covered(self, value: int) -> bool:
        """Whether ``x_value`` is part of the record of the stage that produced it."""
        return (value - 1) in self.recorded and self.chain.stages[value - 1].output_saved

    def alive(self, value: int) -> bool:
        pinned = value in self.recorded and self.chain.stages[value].input_saved
        return value in self.held or pinned or self.covered(value)

    def memory(self) -> int:
        chain = self.chain
        mem = chain.weights_bytes + chain.optimizer_state_bytes + self.grads
        for i in self.recorded:
            stage = chain.stages[i]
            mem += stage.saved_bytes - (0 if stage.output_saved else stage.out_bytes)
        candidates = self.held | self.recorded | {i + 1 for i in self.recorded}
        mem += sum(self.values[k] for k in candidates if self.alive(k) and not self.covered(k))
        if self.delta is not None and self.delta < chain.length:
            mem += self.values[self.delta]
        return mem


def _run(chain: Chain, schedule: Schedule) -> Stats:
    """Check every op against the state and account memory and time; raise on the first bad op."""
    if schedule.length != chain.length:
        raise ScheduleError(f"schedule is for {schedule.length} stages, chain has {chain.length}")
    state = _State(chain)
    peak, peak_op, peak_grads = state.memory(), None, 0
    time_s, advances, forwards, backwards = 0.0, 0, 0, 0

    def fail(index: int, op: Op, why: str) -> ScheduleError:
        return ScheduleError(f"op {index} {op}: {why}")

    for index, op in enumerate(schedule.ops):
        before = state.memory()
        if isinstance(op, Forward):
            i = op.stage
            if not 0 <= i < chain.length:
                raise fail(index, op, f"no stage {i} in a chain of {chain.length}")
            if i in state.done:
                raise fail(index, op, f"stage {i} was already back-propagated")
            if i in state.recorded:
                raise fail(index, op, f"stage {i} is already recorded")
            if not (i in state.held or state.covered(i)):
                raise fail(index, op, f"its input x_{i} is not in memory")
            stage = chain.stages[i]
            if op.keep is Keep.ALL:
                transient = before + stage.saved_bytes + stage.rec_workspace_bytes
                state.recorded.add(i)
            else:
                transient = before + stage.out_bytes + stage.fwd_workspace_bytes
                advances += 1
            if op.keep is not Keep.INPUT and i > 0:
                state.held.discard(i)
            state.held.add(i + 1)
            time_s += stage.fwd_time_s
            forwards += 1
        elif isinstance(op, Backward):
            i = op.stage
            if not 0 <= i < chain.length:
                raise fail(index, op, f"no stage {i} in a chain of {chain.length}")
            if i in state.done:
                raise fail(index, op, f"stage {i} was already back-propagated")
            if i not in state.recorded:
                raise fail(index, op, f"stage {i} is not recorded (run Forward({i}, keep='all') first)")
            if state.delta != i + 1:
                raise fail(index, op, f"the gradient δ_{i + 1} of its output is not available")
            stage = chain.stages[i]
            grad_in = state.values[i] if i > 0 else 0
            transient = before + grad_in + stage.grad_bytes + stage.bwd_workspace_bytes
            state.recorded.discard(i)
            state.done.add(i)
            state.held.discard(i + 1)
            if i > 0:
                state.held.discard(i)
            state.delta = i if i > 0 else None
            state.grads += stage.grad_bytes
            time_s += stage.bwd_time_s
            backwards += 1
        elif isinstance(op, Discard):
            k = op.value
            if k == 0:
                raise fail(index, op, "x_0 is the caller's input and stays in memory")
            if k not in state.held:
                raise fail(index, op, f"x_{k} is not held")
            state.held.discard(k)
            transient = before
        else:
            raise fail(index, op, "unknown op type")
        transient = max(transient, state.memory())
        if transient > peak:
            peak, peak_op = transient, index
            peak_grads = state.grads
    if state.done != set(range(chain.length)):
        missing = min(set(range(chain.length)) - state.done)
        raise ScheduleError(f"schedule ends before the backward of stage {missing}")
    step_peak = (chain.weights_bytes + chain.optimizer_state_bytes + chain.input_bytes + state.grads
                 + chain.optimizer_workspace_bytes)
    if step_peak > peak:
        peak, peak_op, peak_grads = step_peak, None, state.grads
    baseline = chain.compute_time_s
    return Stats(peak_bytes=peak, time_s=time_s, forward_advances=advances,
                 forward_count=forwards, backward_count=backwards, peak_op=peak_op,
                 resident_bytes=chain.resident_bytes,
                 recompute_factor=time_s / baseline if baseline > 0 else 1.0, peak_grad_bytes=peak_grads)


def validate(chain: Chain, schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first op that cannot run, or if the step is incomplete."""
    _run(chain, schedule)


def simulate(chain: Chain, schedule: Schedule) -> Stats:
    """Peak bytes, time and forward counts of ``schedule`` on ``chain``; validates on the way.

    The peak includes everything a step holds: weights, optimizer state, the input batch,
    activations, gradients and transient workspace, and the optimizer step itself.
    """
    return _run(chain, schedule)
