"""Profiled stage times summed against the measured plain training step, per model.

The profiler's timed chain is what the planners price recomputation with; its stages' forward +
backward times should add up to the step they come from. Each round profiles the model (median
of ``REPEATS`` timings per stage) and then times ``STEPS`` plain steps (forward, loss,
backward; the first dropped), interleaved so that both see the same outside load; the ratio
profiled / measured is reported per round with its median, IQR and CoV (edgetrain.bench.stats). Torch runs on one
thread, as on a single-core share of a board.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from edgetrain.bench.stats import Spread, spread
from edgetrain.models import get_model_spec
from edgetrain.profiling.profiler import profile

CASES = [("mobilenet_v2", 8, 64), ("resnet18", 8, 64), ("transformer_small", 8, 64)]
REPEATS = 5
STEPS = 5
THREADS = 1

TITLE = "The profiler's stage times against a measured step"


def plain_step_s(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Median wall time of a plain forward + cross-entropy + backward, the first step dropped."""
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def run(quick: bool) -> dict[str, Any]:
    """Per model and round, the profiled chain's forward + backward time over the measured plain step's."""
    rounds = 2 if quick else 5
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        rows = []
        for name, batch, size in CASES:
            spec = get_model_spec(name)
            torch.manual_seed(0)
            model = spec.build().train()
            x, y = spec.example_input(batch, size), spec.example_target(batch)
            ratios = []
            for _ in range(rounds):
                chain = profile(model, x, y, repeats=REPEATS)
                ratios.append(chain.compute_time_s / plain_step_s(model, x, y, STEPS))
            rows.append({"model": name, "batch": batch, "size": size, "profiled_over_measured": ratios,
                         "spread": spread(ratios).to_dict()})
    finally:
        torch.set_num_threads(threads)
    return {"threads": THREADS, "rounds": rounds, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """One row per model: the ratio's median, quartiles and CoV over the rounds."""
    rows = [f"| {r['model']} | {r['batch']} | {r['size']} | {r['spread']['median']:.3f} | "
            f"{r['spread']['q1']:.3f}-{r['spread']['q3']:.3f} | {Spread.from_dict(r['spread']).cov_text} |"
            for r in result["rows"]]
    return ("The planners price recomputation with the profiled chain's stage times, so the stages' forward + "
            "backward times should add up to the step they come from. Each round profiles the model (the median of "
            f"{REPEATS} timings per stage) and then times {STEPS} plain steps (forward, cross-entropy, backward; the "
            "first dropped), interleaved so that both see the same outside load; torch on "
            f"{result['threads']} thread, {result['rounds']} rounds.\n\n"
            "| model | batch | input | profiled / measured (median) | quartiles | CoV |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows))
