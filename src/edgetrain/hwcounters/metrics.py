"""Counter metrics (IPC, L1D miss ratio, branch-miss ratio) per PMU, from our counters or a ``perf stat -x,`` output.

``perf stat -x,`` writes one line per event, fields separated by the given character
(tools/perf/Documentation/perf-stat.txt, "CSV FORMAT"): counter value, unit, event, the
counter's run time, the percentage of the measurement it ran, then optionally a metric value and
its unit. The value is ``<not supported>`` for an event the PMU does not have and ``<not
counted>`` for one that never got a counter. On a board with two PMUs (big.LITTLE) events read
``armv7_cortex_a15/cycles/``; the PMU is the part before the first ``/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EdgetrainError

__all__ = ["PerfStatRow", "RATIOS", "metrics_by_pmu", "parse_perf_stat", "perf_stat_metrics", "split_label"]

# metric -> (numerator event, denominator event)
RATIOS = {"ipc": ("instructions", "cycles"), "l1d_miss_ratio": ("L1-dcache-load-misses", "L1-dcache-loads"),
          "branch_miss_ratio": ("branch-misses", "branches")}
_NOT = ("<not supported>", "<not counted>")


@dataclass(frozen=True)
class PerfStatRow:
    """One line of ``perf stat -x,``: ``value`` is None when the status says it was not counted."""

    event: str
    pmu: str
    value: float | None
    unit: str
    run_time_ns: int | None
    running_pct: float | None
    status: str  # "counted", "<not supported>" or "<not counted>"


def split_label(label: str) -> tuple[str, str]:
    """``"armv7_cortex_a15/cycles/"`` -> ``("armv7_cortex_a15", "cycles")``; ``"cycles"`` -> ``("", "cycles")``;
    a ``:u`` modifier is dropped."""
    label = label.split(":", 1)[0]
    if "/" in label:
        pmu, event = label.split("/")[:2]
        return pmu, event
    return "", label


def parse_perf_stat(text: str, separator: str = ",") -> list[PerfStatRow]:
    """The event lines of a ``perf stat -x<separator>`` output (comments and blank lines skipped).

    Raises:
        EdgetrainError: a line with fewer than 3 fields or a value that is neither a number nor a status.
    """
    rows = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(separator)
        if len(fields) < 3:
            raise EdgetrainError(f"perf stat line {number}: expected 'value{separator}unit{separator}event...', "
                                 f"got {line!r}")
        value_text, unit, label = fields[0].strip(), fields[1].strip(), fields[2].strip()
        pmu, event = split_label(label)
        status = value_text if value_text in _NOT else "counted"
        try:
            value = None if status != "counted" else float(value_text)
            run_time = int(fields[3]) if len(fields) > 3 and fields[3].strip() else None
            running = float(fields[4]) if len(fields) > 4 and fields[4].strip() else None
        except ValueError:
            raise EdgetrainError(f"perf stat line {number}: not a number in {line!r}") from None
        rows.append(PerfStatRow(event, pmu, value, unit, run_time, running, status))
    return rows


def _ratio(values: Mapping[str, float | None], why: Mapping[str, str], top: str, bottom: str) -> Any:
    for event in (top, bottom):
        if values.get(event) is None:
            return why.get(event, f"unavailable: {event} not measured")
    denominator = values[bottom]
    if not denominator:
        return f"unavailable: {bottom} counted 0"
    numerator = values[top]
    assert numerator is not None
    return numerator / denominator


def metrics_by_pmu(values: Mapping[str, float | None], why: Mapping[str, str] | None = None) -> dict[str, Any]:
    """IPC, L1D miss ratio and branch-miss ratio per PMU from counts keyed by perf labels.

    ``values`` maps ``"cycles"`` or ``"pmu/cycles/"`` to a count (``None`` when not counted),
    ``why`` a label to why it is missing. A ratio whose events are missing is the reason, as text,
    starting ``unavailable:``.

    Example:
        >>> metrics_by_pmu({"instructions": 3e9, "cycles": 2e9})[""]["ipc"]
        1.5
    """
    why = why or {}
    by_pmu: dict[str, dict[str, float | None]] = {}
    reasons: dict[str, dict[str, str]] = {}
    for label, value in values.items():
        pmu, event = split_label(label)
        by_pmu.setdefault(pmu, {})[event] = value
        if label in why:
            reasons.setdefault(pmu, {})[event] = why[label]
    hardware = {event for pair in RATIOS.values() for event in pair}
    return {pmu: {metric: _ratio(events, reasons.get(pmu, {}), *pair) for metric, pair in RATIOS.items()}
            for pmu, events in by_pmu.items() if hardware & set(events)}


def perf_stat_metrics(text: str) -> dict[str, Any]:
    """:func:`metrics_by_pmu` of a ``perf stat -x,`` output; an uncounted event's reason is its status."""
    rows = parse_perf_stat(text)
    labels = {(f"{r.pmu}/{r.event}/" if r.pmu else r.event): r for r in rows}
    return metrics_by_pmu({label: r.value for label, r in labels.items()},
                          {label: f"unavailable: {r.status}" for label, r in labels.items() if r.value is None})
