"""What reading the counters at every phase boundary costs a training step (the goal: <= 3%).

:func:`edgetrain.hwcounters.phases.count_phases` alternates steps without and with the counters
read at the four phase boundaries; this prints the ratio of their medians over ``--steps`` of
each, per model, with the software setup; and, because on a loaded machine that ratio is mostly
noise, the cost of the five snapshots a step takes, timed alone (``read_cost_pct`` of a step).
On a machine without a hardware PMU only the three software counters are open, so the cost
measured is a lower bound of a board's (nine counters per thread there).

Usage::

    python benchmarks/counters_overhead.py                      # JSON on stdout
    python benchmarks/counters_overhead.py --steps 40 --models resnet18_cifar
"""

from __future__ import annotations

import argparse
import json
import time

from edgetrain.bench.stats import Spread, software_setup, spread
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="Steps with and steps without the counters.")
    parser.add_argument("--models", default=",".join(MODELS), help="Comma-separated, from: " + ", ".join(MODELS))
    args = parser.parse_args()
    read_s = read_cost_s()
    rows = []
    for model in args.models.split(","):
        batch, size = MODELS[model]
        report = count_phases(model, batch, size, steps=args.steps)
        rows.append({"model": model, "batch": batch, "size": size, "steps": args.steps,
                     "counters_open": len(report["step"]["counters"]) - len(report["unavailable"]),
                     **report["overhead"], "overhead_pct": 100.0 * (report["overhead"]["ratio"] - 1.0),
                     "read_cost_pct": 100.0 * (len(PHASES) + 1) * read_s.median / report["overhead"]["plain_step_s"]})
    print(json.dumps({"setup": software_setup(), "one_read_s": read_s.to_dict(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
