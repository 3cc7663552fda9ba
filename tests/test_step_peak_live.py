"""``edgetrain.profiling.peak_live``: the peak of a step's allocation records and what is alive at it."""

from __future__ import annotations

from edgetrain.profiling.peak_live import Event, live_at, peak_index


def test_the_peak_is_the_highest_running_total_and_what_lives_there_is_what_was_not_freed() -> None:
    # Prepare: a (4 bytes, op a), b (8, op b), a second 4 (op c), the first free of 4, then d (6): totals 4 12 16 12 18
    events = [Event(1, 4, "a"), Event(2, 8, "b"), Event(3, 4, "c"), Event(4, -4, ""), Event(5, 6, "d"),
              Event(6, -8, ""), Event(7, -6, "")]
    # Execute
    at = peak_index(events)
    live = live_at(events, at)
    # Assert: the peak (18) at d; the free of 4 took the latest 4 (c's), so a, b and d live, largest first
    assert at == 4 and sum(e.nbytes for e in events[:at + 1]) == 18
    assert [(e.nbytes, e.ops) for e in live] == [(8, "b"), (6, "d"), (4, "a")]
