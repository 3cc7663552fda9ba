"""Schedules as plain data: the ops, their JSON and compact forms, and plain backprop (:func:`keep_all`).

The simulator that validates a schedule and counts what it costs is :mod:`edgetrain.core.simulator`.

A schedule is a tuple of op records over the stages of a :class:`~edgetrain.core.chain.Chain`
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
* ``PageOut(value)`` writes ``x_value`` to storage (flash, an SD card) and frees its RAM; the
  value stays *alive*: a record that saved it, or a later forward, needs it back first.
* ``PageIn(value)`` reads a paged-out ``x_value`` back into RAM and deletes its copy on disk.
* ``PageOutRecord(stage)`` / ``PageInRecord(stage)`` do the same for a record's own saved
  tensors (``saved_bytes - out_bytes``: what autograd keeps besides the stage's input and
  output, e.g. a convolution's output inside a block); ``Backward(stage)`` needs them in RAM.

``x_0`` is the caller's input batch: always available, never released, never paged.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..sysutil.fileio import write_atomic

if TYPE_CHECKING:
    pass

__all__ = ["Keep", "Forward", "Backward", "Discard", "PageOut", "PageIn", "PageOutRecord", "PageInRecord", "Op",
           "Schedule", "keep_all"]

SCHEDULE_VERSION = 2
READABLE_VERSIONS = (1, 2)   # version 1 had no paging ops


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


@dataclass(frozen=True)
class PageOut:
    value: int


@dataclass(frozen=True)
class PageIn:
    value: int


@dataclass(frozen=True)
class PageOutRecord:
    stage: int


@dataclass(frozen=True)
class PageInRecord:
    stage: int


Op = Forward | Backward | Discard | PageOut | PageIn | PageOutRecord | PageInRecord


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
    def from_dict(cls, data: object) -> Schedule:
        """Read :meth:`to_dict` output back, strictly.

        Raises:
            ScheduleError: anything malformed (a missing or unknown key, a wrong type, an
                unknown op kind, a stage that is not a non-negative integer); the message names it.
        """
        if not isinstance(data, dict):
            raise ScheduleError(f"a schedule is a JSON object, got {type(data).__name__}")
        _check_keys(data)
        version = data["version"]
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise ScheduleError(f"unsupported schedule version {version!r}; this edgetrain reads "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
        length, strategy, params, items = (data["length"], data.get("strategy", ""), data.get("params", {}),
                                           data["ops"])
        if not _is_index(length) or length < 1:
            raise ScheduleError(f"schedule 'length' must be a positive integer, got {length!r}")
        if not isinstance(strategy, str):
            raise ScheduleError(f"schedule 'strategy' must be a string, got {strategy!r}")
        if not isinstance(params, dict):
            raise ScheduleError(f"schedule 'params' must be an object, got {params!r}")
        if not isinstance(items, list):
            raise ScheduleError(f"schedule 'ops' must be a list, got {type(items).__name__}")
        ops = tuple(_op_from_list(index, item) for index, item in enumerate(items))
        return cls(ops=ops, length=length, strategy=strategy, params=dict(params))

    def save(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """Read a schedule saved by :meth:`save`; raises :class:`ScheduleError` on malformed JSON or content."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ScheduleError(
                f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
        return cls.from_dict(data)

    def to_bytes(self) -> bytes:
        """The compact form a device receives, as POET sends its schedule tables.

        Six header bytes (magic, version, length), then one byte per op: a 4-bit kind and a
        4-bit stage or value index; indices of 15 and above take two more bytes. Strategy and
        params are left out: the ops and the length are all an executor needs.
        """
        body = b"".join(_pack_op(op) for op in self.ops)
        return _COMPACT_MAGIC + struct.pack("<BBH", SCHEDULE_VERSION, 0, self.length) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Schedule:
        """Read :meth:`to_bytes` output back; raises :class:`ScheduleError` on anything malformed."""
        if len(data) < 6 or data[:2] != _COMPACT_MAGIC:
            raise ScheduleError("not a compact edgetrain schedule (bad magic)")
        version, _, length = struct.unpack("<BBH", data[2:6])
        if version not in READABLE_VERSIONS:
            raise ScheduleError(f"unsupported compact schedule version {version}")
        ops, at = [], 6
        while at < len(data):
            op, at = _unpack_op(data, at)
            ops.append(op)
        return cls(tuple(ops), length, strategy="compact")


_COMPACT_MAGIC = b"ES"
# kind codes of the compact form: forward by keep, then the one-index ops
_COMPACT_KINDS: tuple[tuple[type, Keep | None], ...] = (
    (Forward, Keep.NONE), (Forward, Keep.INPUT), (Forward, Keep.ALL), (Backward, None), (Discard, None),
    (PageOut, None), (PageIn, None), (PageOutRecord, None), (PageInRecord, None))
_ESCAPE = 15


def _op_index(op: Op) -> int:
    return op.value if isinstance(op, (Discard, PageOut, PageIn)) else op.stage


def _pack_op(op: Op) -> bytes:
    """One op: ``kind << 4 | index`` when ``index < 15``; else ``kind << 4 | 15`` and a uint16 index."""
    keep = op.keep if isinstance(op, Forward) else None
    kind = _COMPACT_KINDS.index((type(op), keep))
    index = _op_index(op)
    if index < _ESCAPE:
        return bytes([kind << 4 | index])
    if index >= 2**16:
        raise ScheduleError(f"op {op}: index {index} is too large for the compact form")
    return bytes([kind << 4 | _ESCAPE]) + struct.pack("<H", index)


def _unpack_op(data: bytes, at: int) -> tuple[Op, int]:
    kind, index = data[at] >> 4, data[at] & 15
    at += 1
    if index == _ESCAPE:
        if at + 2 > len(data):
            raise ScheduleError("compact schedule ends inside an op")
        (index,) = struct.unpack("<H", data[at:at + 2])
        at += 2
    if kind >= len(_COMPACT_KINDS):
        raise ScheduleError(f"unknown compact op kind {kind}")
    op_type, keep = _COMPACT_KINDS[kind]
    return (Forward(index, keep) if keep is not None else op_type(index)), at


def _op_to_list(op: Op) -> list[object]:
    if isinstance(op, Forward):
        return ["F", op.stage, op.keep.value]
    if isinstance(op, Backward):
        return ["B", op.stage]
    if isinstance(op, PageOut):
        return ["O", op.value]
    if isinstance(op, PageIn):
        return ["I", op.value]
    if isinstance(op, PageOutRecord):
        return ["OR", op.stage]
    if isinstance(op, PageInRecord):
        return ["IR", op.stage]
    return ["D", op.value]


_REQUIRED_KEYS = frozenset({"version", "length", "ops"})
_OPTIONAL_KEYS = frozenset({"strategy", "params"})
# kind -> op type, for the kinds whose one argument is an index
_INDEX_OPS: dict[str, type[Backward | Discard | PageOut | PageIn | PageOutRecord | PageInRecord]] = {
    "B": Backward, "D": Discard, "O": PageOut, "I": PageIn, "OR": PageOutRecord, "IR": PageInRecord}


def _check_keys(data: dict[object, object]) -> None:
    missing = sorted(_REQUIRED_KEYS - data.keys())
    if missing:
        raise ScheduleError(f"schedule is missing key {missing[0]!r}")
    extra = sorted(map(repr, data.keys() - _REQUIRED_KEYS - _OPTIONAL_KEYS))
    if extra:
        raise ScheduleError(f"schedule has unknown key {extra[0]}; valid keys: "
                            f"{', '.join(sorted(_REQUIRED_KEYS | _OPTIONAL_KEYS))}")


def _is_index(value: object) -> bool:
    """A JSON integer >= 0: not a bool (a Python int), a float or a string."""
    return type(value) is int and value >= 0


def _op_from_list(index: int, item: object) -> Op:
    """Op ``index`` of a schedule file: ``[kind, stage]`` or ``["F", stage, keep]``."""
    if not isinstance(item, list) or not item:
        raise ScheduleError(f"schedule op {index}: expected a list [kind, stage, ...], got {item!r}")
    kind, *args = item
    if kind != "F" and kind not in _INDEX_OPS:
        raise ScheduleError(f"schedule op {index}: unknown op kind {kind!r}; valid kinds: "
                            f"{', '.join(['F', *_INDEX_OPS])}")
    arity = 2 if kind == "F" else 1
    if len(args) != arity:
        raise ScheduleError(f"schedule op {index}: {kind!r} takes {arity} argument(s), got {item!r}")
    if not _is_index(args[0]):
        raise ScheduleError(f"schedule op {index}: the stage or value must be a non-negative integer, "
                            f"got {args[0]!r}")
    if kind != "F":
        return _INDEX_OPS[kind](args[0])
    if args[1] not in tuple(keep.value for keep in Keep):
        raise ScheduleError(f"schedule op {index}: keep must be one of "
                            f"{', '.join(keep.value for keep in Keep)}, got {args[1]!r}")
    return Forward(args[0], Keep(args[1]))


def keep_all(length: int) -> Schedule:
    """Plain backprop: record every stage, then back-propagate them all."""
    ops: list[Op] = [Forward(i, Keep.ALL) for i in range(length)]
    ops += [Backward(i) for i in reversed(range(length))]
    return Schedule(tuple(ops), length, strategy="none")
