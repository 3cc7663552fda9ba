"""docs/guide/paging-energy.md's step-time table rebuilt with its spread: a paged step next to the unpaged one and the
simulator's.

For each model of ``tests/test_paging.py`` (resnet18 batch 8 at 96 px, transformer_small batch 16
at 64 tokens; one thread), the schedule is ``uniform(chain, 3)`` with every inner value paged out
over each gap where it is not needed (the test's ``with_paging``, imported from there so the
schedule is the one the tests check). Each round times ``--steps`` steps of the paged and of the
unpaged schedule, interleaved so both see the same outside load, and keeps each one's median;
the table gives the median over ``--rounds`` rounds with its IQR and CoV
(:func:`edgetrain.bench.stats.spread`). The simulated time prices paging serially at this host's
own measured write/read throughput (the step's ``write_s``/``read_s``), as
``test_step_time_against_the_simulator`` does. Prints JSON with the software setup. Needs the
``test`` extra (it imports ``tests/test_paging.py``, hence pytest).

Usage::

    python benchmarks/paging_step_time.py [--rounds 5] [--steps 3] [--models resnet18,transformer_small]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_paging import SIZES, case, median_step_s, with_paging  # the schedule and timing the tests use

from edgetrain.bench.stats import software_setup, spread
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.models.stages import training_stages
from edgetrain.planners import uniform
from edgetrain.profiling import profile
from edgetrain.runtime import Executor


def host_profile(write_bytes: int, write_s: float, read_bytes: int, read_s: float) -> EnergyProfile:
    """An energy profile whose page-out/page-in rates are this host's measured ones (the rest is irrelevant here)."""
    return EnergyProfile("host", 1e9, 1.0, 1e-6, read_bytes / max(read_s, 1e-9), 1.0,
                         1e-6, write_bytes / max(write_s, 1e-9), 1.0)


def measure(name: str, rounds: int, steps: int) -> dict[str, Any]:
    c = case(name)
    model = c.fresh_model()
    timed = profile(model, c.x, c.y, measure_time=True)
    unpaged = uniform(timed, 3)
    paged = with_paging(unpaged, timed, range(1, timed.length - 1))
    paged_s, unpaged_s, wait_s, page_s = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="edgetrain-paging-bench-") as page_dir:
        paged_executor = Executor(training_stages(model), paged, timed, page_dir=Path(page_dir))
        unpaged_executor = Executor(training_stages(model), unpaged, timed)
        median_step_s(paged_executor, c, model, 1)   # warm-up: thread pools, first allocations
        median_step_s(unpaged_executor, c, model, 1)
        for _ in range(rounds):
            paged_s.append(median_step_s(paged_executor, c, model, steps))
            unpaged_s.append(median_step_s(unpaged_executor, c, model, steps))
            stats = paged_executor.last_paging
            assert stats is not None
            wait_s.append(stats.wait_s)
            host = host_profile(stats.bytes_written, stats.write_s, stats.bytes_read, stats.read_s)
            page_s.append(simulate(timed, paged, host).page_time_s)
    simulated = simulate(timed, paged)
    ratios = [p / u for p, u in zip(paged_s, unpaged_s, strict=True)]
    return {"model": name, "batch_size": SIZES[name], "pageouts": simulated.pageout_count,
            "pageout_bytes": simulated.pageout_bytes, "paged_step_s": spread(paged_s).to_dict(),
            "unpaged_step_s": spread(unpaged_s).to_dict(), "paged_over_unpaged": spread(ratios).to_dict(),
            "simulated_compute_s": simulated.compute_time_s, "simulated_serial_paging_s": spread(page_s).to_dict(),
            "paging_wait_s": spread(wait_s).to_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="Interleaved rounds (the spread is over these).")
    parser.add_argument("--steps", type=int, default=3, help="Steps per schedule per round (their median is kept).")
    parser.add_argument("--models", default=",".join(SIZES), help=f"Comma-separated, from {', '.join(SIZES)}.")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    if args.rounds < 1 or args.steps < 1 or not set(names) <= set(SIZES):
        parser.error(f"--rounds and --steps must be >= 1, --models from {', '.join(SIZES)}")
    torch.set_num_threads(1)
    rows = [measure(name, args.rounds, args.steps) for name in names]
    print(json.dumps({"rounds": args.rounds, "steps": args.steps, "rows": rows, "setup": software_setup()}, indent=1))


if __name__ == "__main__":
    main()
