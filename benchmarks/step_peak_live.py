"""What is alive at a training step's tensor peak, by the c10 allocator's records: where a peak comes from.

For one model and one setting of ``benchmarks/compile_budget.py`` (``eager``, ``inductor:B``,
``edgetrain:least``, ``edgetrain+compile:least``, ``edgetrain:R`` ...), this runs three steps, then
records one more under ``torch.profiler`` with ``profile_memory`` and prints the step's tensor peak
(the most bytes held above the step's start, as ``compile_budget.py`` reports it), the ops running at
that moment, and the allocations still alive then, largest first, each with the ops that made it
(its innermost enclosing op events). With ``--timeline N`` it also prints every allocation or free of
at least N bytes in order, with the running total, the peak marked ``*``.

    python benchmarks/step_peak_live.py --model mobilenet_v3_small --setting inductor:1.0 [--top 15]
        [--timeline 1000000]

A free is matched to the latest live allocation of the same size (the records carry no address that
outlives a profiler session reliably), so with many equal sizes an allocation's op may be another's
of that size; sizes and the totals are exact.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

KiB = 1024


@dataclass
class Event:
    """One allocation (``nbytes`` > 0) or free (< 0) of the step, with the ops enclosing it."""

    at_ns: int
    nbytes: int
    ops: str


def recorded_events(step: Any) -> list[Event]:
    """The step's allocations and frees in time order, each with its enclosing ops (innermost last)."""
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
    """The index of the event at which the running total is highest (the first such)."""
    held = most = 0
    at = 0
    for index, event in enumerate(events):
        held += event.nbytes
        if held > most:
            most, at = held, index
    return at


def live_at(events: list[Event], index: int) -> list[Event]:
    """The allocations made up to ``index`` and not freed by then (a free matched to the latest live one of its
    size)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a compile_budget.py model name")
    parser.add_argument("--setting", required=True, help="a compile_budget.py setting (not a matched one)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--top", type=int, default=15, help="how many live allocations to list")
    parser.add_argument("--timeline", type=int, default=0, help="also list every event of at least this many bytes")
    args = parser.parse_args()
    from compile_budget import setting_step
    step, _ = setting_step(args.setting, args.model, args.batch, args.image, None)
    for _ in range(3):
        step()
    events = recorded_events(step)
    at = peak_index(events)
    peak = sum(event.nbytes for event in events[:at + 1])
    print(f"{args.model} {args.setting}: step tensor peak {peak / 2**20:.3f} MiB ({peak} bytes)")
    print(f"at the peak: {events[at].ops}")
    print(f"alive at the peak, largest {args.top}:")
    for event in live_at(events, at)[:args.top]:
        print(f"  {event.nbytes / KiB:10.1f} KiB  {event.ops}")
    if args.timeline:
        print(f"events of at least {args.timeline} bytes (KiB, running MiB):")
        held = 0
        for index, event in enumerate(events):
            held += event.nbytes
            if abs(event.nbytes) >= args.timeline:
                print(f"{'*' if index == at else ' '} {event.nbytes / KiB:+10.1f} {held / 2**20:8.3f}  {event.ops}")


if __name__ == "__main__":
    main()
