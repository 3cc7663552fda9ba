"""Profiled stage times summed against the measured plain training step, per model, as JSON lines.

The profiler's timed chain is what the planners price recomputation with; its stages' forward +
backward times should add up to the step they come from. Each round profiles the model (median
of ``--repeats`` timings per stage) and then times ``--steps`` plain steps (forward, loss,
backward; the first dropped), interleaved so that both see the same outside load; the ratio
profiled / measured is reported per round with its median, IQR and CoV (edgetrain.bench.stats).

Run: .venv/bin/python benchmarks/profile_time_accuracy.py [--threads 1] [--rounds 3] [--out out/profile_time.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from edgetrain.bench.stats import spread
from edgetrain.models import get_model_spec
from edgetrain.profiling.profiler import profile

CASES = [("mobilenet_v2", 8, 64), ("resnet18", 8, 64), ("transformer_small", 8, 64)]


def plain_step_s(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Median wall time of a plain forward + cross-entropy + backward, the first step dropped."""
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timings per stage in each profile")
    parser.add_argument("--steps", type=int, default=5, help="plain steps timed in each round")
    parser.add_argument("--out", type=Path, default=Path("out/profile_time.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, batch, size in CASES:
        spec = get_model_spec(name)
        torch.manual_seed(0)
        model = spec.build().train()
        x, y = spec.example_input(batch, size), spec.example_target(batch)
        ratios = []
        for _ in range(args.rounds):
            chain = profile(model, x, y, repeats=args.repeats)
            ratios.append(chain.compute_time_s / plain_step_s(model, x, y, args.steps))
        rows.append({"model": name, "batch": batch, "size": size, "threads": args.threads,
                     "profiled_over_measured": [round(r, 4) for r in ratios], "spread": spread(ratios).to_dict()})
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
