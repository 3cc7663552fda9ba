"""What is alive at a training step's tensor peak, by the c10 allocator's records: where a peak comes from.

:func:`recorded_events` runs one step under ``torch.profiler`` with ``profile_memory`` and returns its allocations
and frees in time order, each with the ops enclosing it; :func:`peak_index` finds the step's tensor peak (the most
bytes held above the step's start, as :func:`edgetrain.runtime.compiled.measured_step_peak_bytes` reports it) and
:func:`live_at` the allocations still alive there. :func:`peak_live` puts the three together.

A free is matched to the latest live allocation of the same size (the records carry no address that outlives a
profiler session reliably), so with many equal sizes an allocation's op may be another's of that size; sizes and the
totals are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Event", "PeakLive", "live_at", "peak_index", "peak_live", "recorded_events"]


@dataclass(frozen=True)
class Event:
    """One allocation (``nbytes`` > 0) or free (< 0) of the step, with the ops enclosing it (innermost last)."""

    at_ns: int
    nbytes: int
    ops: str


@dataclass(frozen=True)
class PeakLive:
    """A step's tensor peak above its start, the ops running at it, and the allocations alive there, largest first."""

    peak_bytes: int
    ops_at_peak: str
    live: list[Event]
    events: int


def recorded_events(step: Callable[[], None]) -> list[Event]:
    """The allocations and frees of one ``step()`` in time order, each with its enclosing ops (the innermost four)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    ops = [e for e in events if e.name() != "[memory]" and e.end_ns() > e.start_ns()]

    def enclosing(at_ns: int) -> str:
        inside = sorted((o for o in ops if o.start_ns() <= at_ns <= o.end_ns()), key=lambda o: o.start_ns())
        return " > ".join(o.name() for o in inside[-4:]) or "(no op: made outside the dispatcher)"
    return [Event(e.start_ns(), e.nbytes(), enclosing(e.start_ns())) for e in events if e.name() == "[memory]"]


def peak_index(events: list[Event]) -> int:
    """The index of the event at which the running total is highest (the first such; 0 for no rise)."""
    held = most = 0
    at = 0
    for index, event in enumerate(events):
        held += event.nbytes
        if held > most:
            most, at = held, index
    return at


def live_at(events: list[Event], index: int) -> list[Event]:
    """The allocations made up to ``index`` and not freed by then (a free matched to the latest live one of its
    size), largest first."""
    live: list[Event] = []
    for event in events[:index + 1]:
        if event.nbytes > 0:
            live.append(event)
            continue
        for j in range(len(live) - 1, -1, -1):
            if live[j].nbytes == -event.nbytes:
                del live[j]
                break
    return sorted(live, key=lambda e: -e.nbytes)


def peak_live(step: Callable[[], None]) -> PeakLive:
    """One ``step()`` recorded: its tensor peak above its start, the ops at that moment and what is alive there.

    Run a few steps first: the first allocates what lives between steps (optimizer state), and compiles under
    ``torch.compile``.
    """
    events = recorded_events(step)
    at = peak_index(events)
    peak = max(0, sum(event.nbytes for event in events[:at + 1]))
    return PeakLive(peak, events[at].ops if events else "", live_at(events, at) if peak else [], len(events))
