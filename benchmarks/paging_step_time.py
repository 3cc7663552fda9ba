"""A paged step's time next to the unpaged one and the simulator's: the step-time figures of the paging guide.

For each model of :data:`edgetrain.runtime.paging_cases.SIZES` (resnet18 batch 8 at 96 px,
transformer_small batch 16 at 64 tokens; one thread), the schedule is ``uniform(chain, 3)`` with
every inner value paged out over each gap where it is not needed
(:func:`~edgetrain.runtime.paging_cases.with_paging`, the schedule ``tests/test_paging.py`` checks).
Each round times ``STEPS`` steps of the paged and of the unpaged schedule, interleaved so both see
the same outside load, and keeps each one's median; the table gives the median over the rounds with
its IQR and CoV. The simulated time prices paging serially at this host's own measured write/read
throughput (the step's ``write_s``/``read_s``), as ``test_step_time_against_the_simulator`` does.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from edgetrain.bench.stats import Spread, spread
from edgetrain.core.simulator import simulate
from edgetrain.models.stages import training_stages
from edgetrain.planners import uniform
from edgetrain.profiling import profile
from edgetrain.runtime import Executor
from edgetrain.runtime.paging_cases import SIZES, case, host_paging_profile, median_step_s, with_paging

log = logging.getLogger("paging_step_time")

TITLE = "Paged step time"
ROUNDS, QUICK_ROUNDS = 7, 3   # interleaved rounds: the spread is over these
STEPS = 3                     # steps per schedule per round: their median is the round's figure
QUICK_MODELS = ("transformer_small",)


def measure(name: str, rounds: int, steps: int) -> dict[str, Any]:
    """``rounds`` interleaved rounds of the paged and the unpaged ``uniform3`` step of model ``name``."""
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
        for index in range(rounds):
            first, second = (paged_s, unpaged_s) if index % 2 == 0 else (unpaged_s, paged_s)
            for times in (first, second):   # who runs first alternates
                executor = paged_executor if times is paged_s else unpaged_executor
                times.append(median_step_s(executor, c, model, steps))
            stats = paged_executor.last_paging
            assert stats is not None
            wait_s.append(stats.wait_s)
            page_s.append(simulate(timed, paged, host_paging_profile(stats)).page_time_s)
    simulated = simulate(timed, paged)
    ratios = [p / u for p, u in zip(paged_s, unpaged_s, strict=True)]
    log.info("%s: paged / unpaged %.3f", name, spread(ratios).median)
    return {"model": name, "batch": SIZES[name][0], "size": SIZES[name][1], "pageouts": simulated.pageout_count,
            "pageout_bytes": simulated.pageout_bytes, "paged_step_s": spread(paged_s).to_dict(),
            "unpaged_step_s": spread(unpaged_s).to_dict(), "paged_over_unpaged": spread(ratios).to_dict(),
            "simulated_compute_s": simulated.compute_time_s, "simulated_serial_paging_s": spread(page_s).to_dict(),
            "paging_wait_s": spread(wait_s).to_dict()}


def run(quick: bool) -> dict[str, Any]:
    """Every model (the quick run: the small encoder alone) on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rounds = QUICK_ROUNDS if quick else ROUNDS
    try:
        rows = [measure(name, rounds, STEPS) for name in (QUICK_MODELS if quick else tuple(SIZES))]
    finally:
        torch.set_num_threads(threads)
    return {"rounds": rounds, "steps": STEPS, "threads": 1, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """One row per model: page-outs, the two step times, their ratio, and the serial paging the simulator prices."""
    rows = []
    for r in result["rows"]:
        paged, unpaged = Spread.from_dict(r["paged_step_s"]), Spread.from_dict(r["unpaged_step_s"])
        ratio, serial = Spread.from_dict(r["paged_over_unpaged"]), Spread.from_dict(r["simulated_serial_paging_s"])
        wait = Spread.from_dict(r["paging_wait_s"])
        rows.append(f"| {r['model']} | {r['batch']} | {r['size']} | {r['pageouts']} | {r['pageout_bytes'] / 1e6:.2f} | "
                    f"{unpaged.median:.4f} | {paged.median:.4f} | {ratio.median:.3f} ({ratio.q1:.3f}-{ratio.q3:.3f}, "
                    f"CoV {ratio.cov_text}) | {serial.median / r['simulated_compute_s']:+.1%} | {wait.median:.4f} |")
    return ("`uniform(chain, 3)` with every inner value paged out over each gap where it is not needed, against the "
            f"same schedule without paging, on {result['threads']} torch thread. Each of {result['rounds']} rounds "
            f"times {result['steps']} steps of each, interleaved (who runs first alternates), and keeps each one's "
            "median; a ratio is paged over unpaged in the same round, given as the median over rounds with its "
            "quartiles and CoV. *Serial paging* is what the simulator prices for the page transfers at this "
            "host's own measured write and read throughput, as a share of the simulated compute; *waited* is what "
            "the paged step stood still for its I/O.\n\n"
            "| model | batch | size | page-outs | paged MB | unpaged step (s) | paged step (s) | paged / unpaged | "
            "serial paging / compute | waited (s) |\n|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
