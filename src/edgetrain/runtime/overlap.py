"""When a step's page transfers may overlap its compute: the overlap plan of a paging schedule.

NOTE [ Overlap without a higher peak ]
The simulator charges paging serially: ``x_k``'s RAM is freed when ``PageOut(k)`` returns and
taken when ``PageIn(k)`` starts. :func:`plan_overlap` lets a write keep its storage while
later ops run, and a read take its bytes some ops early (prefetch), only over ops whose
simulated RAM (:func:`~edgetrain.core.simulator.memory_timeline`) plus every other transfer planned
over them leaves room for the value under the step's simulated peak. Elsewhere the executor
waits: for the write before the next op, for the read at the ``PageIn`` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.schedule import Op, PageIn, PageInRecord, PageOut, PageOutRecord
from ..core.simulator import OpMemory
from .pager import PageKey, page_key

__all__ = ["OverlapPlan", "plan_overlap"]


@dataclass(frozen=True)
class OverlapPlan:
    """When each transfer of a schedule must be settled (NOTE [ Overlap without a higher peak ]).

    ``release_before[j]`` for a ``PageOut`` or ``PageOutRecord`` at op ``j``: the op before
    which its write must have finished and its RAM been dropped (``j + 1``: no overlap).
    ``issue_before[j]`` for a ``PageIn`` or ``PageInRecord`` at op ``j``: the earliest op
    before which its read may be issued (``j``: no prefetch); it waits past that while the
    same page's write is still running.
    """

    release_before: dict[int, int] = field(default_factory=dict)
    issue_before: dict[int, int] = field(default_factory=dict)

    @classmethod
    def serial(cls, ops: Sequence[Op]) -> OverlapPlan:
        """No overlap: what the executor does without a chain to plan with."""
        return cls({j: j + 1 for j, op in enumerate(ops) if _is_write(op)},
                   {j: j for j, op in enumerate(ops) if _is_read(op)})


def _is_write(op: Op) -> bool:
    return isinstance(op, (PageOut, PageOutRecord))


def _is_read(op: Op) -> bool:
    return isinstance(op, (PageIn, PageInRecord))


def plan_overlap(ops: Sequence[Op], timeline: Sequence[OpMemory], sizes: Sequence[int],
                 record_sizes: Sequence[int] = ()) -> OverlapPlan:
    """Stretch each write forward and each read backward while the simulated RAM leaves room.

    Transfers are placed in op order; each one adds its size to the RAM of the ops it spans,
    so later transfers see the room earlier ones took. A read may be planned over its own
    page's write window (both are counted there, which over-counts): the executor issues it
    only once that write has been settled, later than planned if need be, never earlier.

    Args:
        ops: the schedule's ops.
        timeline: :func:`~edgetrain.core.simulator.memory_timeline` of the schedule.
        sizes: bytes of each value ``x_k`` (``chain.value_bytes``).
        record_sizes: bytes of each stage's record internals (``saved_bytes - out_bytes``, as
            the simulator counts them); needed when ``ops`` page records.
    """
    if len(ops) != len(timeline):
        raise ValueError("the timeline must have one entry per op")
    peak = max((m.transient_bytes for m in timeline), default=0)
    extra = [0] * len(ops)
    plan = OverlapPlan()
    written_at: dict[PageKey, int] = {}   # page -> index of its last write

    def fits(t: int, size: int) -> bool:
        return timeline[t].transient_bytes + extra[t] + size <= peak

    def size_of(key: PageKey) -> int:
        return sizes[key] if isinstance(key, int) else record_sizes[key.stage]

    for j, op in enumerate(ops):
        key = page_key(op)
        if key is None:
            continue
        size = size_of(key)
        if _is_write(op):
            end = j + 1
            while end < len(ops) and not (_is_read(ops[end]) and page_key(ops[end]) == key) and fits(end, size):
                end += 1
            for t in range(j + 1, end):
                extra[t] += size
            plan.release_before[j] = end
            written_at[key] = j
        else:
            start, earliest = j, written_at.get(key, -1) + 1
            while start - 1 >= earliest and fits(start - 1, size):
                start -= 1
            for t in range(start, j):
                extra[t] += size
            plan.issue_before[j] = start
    return plan
