"""What reading the counters at every phase boundary costs a training step (the goal: <= 3%).

:func:`edgetrain.hwcounters.phases.count_phases` alternates steps without and with the counters read at the four phase
boundaries; the result is the ratio of their medians, per model, and, because on a loaded machine that ratio is mostly
noise, the cost of the five snapshots a step takes, timed alone (``read_cost_pct`` of a step). On a machine without a
hardware PMU only the three software counters are open, so the cost measured is a lower bound of a board's (nine
counters per thread there).
"""

from __future__ import annotations

import time
from typing import Any

from edgetrain.bench.stats import Spread, spread
from edgetrain.hwcounters.perf_event import CounterSet
from edgetrain.hwcounters.phases import PHASES, count_phases

MODELS = {"resnet18_cifar": (8, 32), "transformer_small": (4, 64)}


def read_cost_s(reads: int = 2000, batches: int = 7) -> Spread:
    """Seconds of one snapshot of every open counter, over ``batches`` batches of ``reads``: the overhead's floor."""
    per_read_s = []
    with CounterSet() as counters:
        for _ in range(batches):
            start = time.perf_counter()
            for _ in range(reads):
                counters.read()
            per_read_s.append((time.perf_counter() - start) / reads)
    return spread(per_read_s)


TITLE = "What reading the hardware counters costs a step"


def run(quick: bool) -> dict[str, Any]:
    """Steps with and without the counters read at every phase boundary, per model, and one snapshot's cost alone."""
    steps = 8 if quick else 20
    read_s = read_cost_s()
    rows = []
    for model, (batch, size) in MODELS.items():
        report = count_phases(model, batch, size, steps=steps)
        rows.append({"model": model, "batch": batch, "size": size, "steps": steps,
                     "counters_open": len(report["step"]["counters"]) - len(report["unavailable"]),
                     **report["overhead"], "overhead_pct": 100.0 * (report["overhead"]["ratio"] - 1.0),
                     "read_cost_pct": 100.0 * (len(PHASES) + 1) * read_s.median / report["overhead"]["plain_step_s"]})
    return {"one_read_s": read_s.to_dict(), "rows": rows}


def render(result: dict[str, Any]) -> str:
    """The per-model table, then the snapshot's cost."""
    rows = [f"| {r['model']} | {r['batch']} | {r['size']} | {r['steps']} | {r['counters_open']} | "
            f"{r['plain_step_s'] * 1e3:.2f} | {r['overhead_pct']:+.2f}% | {r['read_cost_pct']:.4f}% |"
            for r in result["rows"]]
    one_read = result["one_read_s"]
    return (f"{len(PHASES) + 1} snapshots of every open counter a step, at the phase boundaries "
            f"({', '.join(PHASES)}). Steps without and with the counters alternate; the overhead is the ratio of "
            "their medians, which on a shared machine is mostly the load's noise. The snapshots' cost alone, timed "
            "apart, is the overhead's floor.\n\n"
            "| model | batch | input | steps each | counters open | plain step (ms) | with counters | "
            "snapshots' cost |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"One snapshot of every open counter takes {one_read['median'] * 1e6:.1f} µs (median of {one_read['n']} "
            f"batches of 2000, IQR {one_read['iqr'] * 1e6:.1f} µs). Without a hardware PMU only software counters "
            "are open, so a board with one pays more per snapshot.")
