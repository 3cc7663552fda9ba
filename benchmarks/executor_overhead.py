"""Step time of plain PyTorch against the executor running the keep-all schedule (no recomputation).

The executor runs keep-all as plain autograd (``ratio``); run op by op, as every other schedule
is, it adds two custom autograd functions and one backward call per stage (``op_by_op_ratio``).
Prints one JSON object: per model the median step times (forward, loss, backward; gradients
reset to ``None`` between steps), their spread over the repeats (``spread_s``: median, IQR, CoV)
and their ratios to plain PyTorch, whose target is <= 1.03, with the software setup.

Usage: ``python benchmarks/executor_overhead.py [--repeats N] [--threads T] [--models name:batch:size,...]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable

import torch
from _allocator import keep_freed_memory
from torch import nn

from edgetrain.bench.stats import software_setup, spread
from edgetrain.core.schedule import keep_all
from edgetrain.models import get_model_spec
from edgetrain.models.stages import training_stages
from edgetrain.runtime import Executor

log = logging.getLogger("executor_overhead")

# (model, batch, size): ResNet-18 on 224 px images, the small encoder on 128-token sequences.
CASES = (("resnet18", 8, 224), ("transformer_small", 64, 128))


def _time_s(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _zero(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def bench(name: str, batch: int, size: int, repeats: int) -> dict[str, object]:
    """Median step seconds of plain autograd and of the keep-all executor, in alternating pairs.

    Pairs alternate which runs first, so drifts in machine load (other processes, CPU
    frequency) hit both alike; ``pair_ratio`` is the median of the per-pair ratios, the
    figure least sensitive to such drift.
    """
    spec = get_model_spec(name)
    torch.manual_seed(0)
    model = spec.build()
    x, y = spec.example_input(batch, size), spec.example_target(batch)
    stages = training_stages(model)
    executor = Executor(stages, keep_all(len(stages)))
    op_by_op = Executor(stages, keep_all(len(stages)), plain_keep_all=False)

    def plain() -> None:
        _zero(model)
        nn.functional.cross_entropy(model(x), y).backward()

    def scheduled() -> None:
        _zero(model)
        executor.step(x, y)

    def stepped() -> None:
        _zero(model)
        op_by_op.step(x, y)

    runs = {"plain": plain, "executor": scheduled, "op_by_op": stepped}
    for _ in range(2):  # warm-up: allocator, kernels, lazy initialisation
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {key: [] for key in runs}
    for i in range(repeats):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))   # alternate who runs first
        for key in order:
            times[key].append(_time_s(runs[key]))
    medians = {key: statistics.median(values) for key, values in times.items()}
    log.info("%s: %s", name, ", ".join(f"{key} {value:.4f} s" for key, value in medians.items()))
    return {"model": name, "batch": batch, "size": size, "repeats": repeats, "plain_s": medians["plain"],
            "executor_s": medians["executor"], "op_by_op_s": medians["op_by_op"],
            "ratio": medians["executor"] / medians["plain"], "op_by_op_ratio": medians["op_by_op"] / medians["plain"],
            "pair_ratio": statistics.median(e / p for e, p in zip(times["executor"], times["plain"], strict=True)),
            "op_by_op_pair_ratio": statistics.median(
                e / p for e, p in zip(times["op_by_op"], times["plain"], strict=True)),
            "spread_s": {key: spread(values).to_dict() for key, values in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--models", help="comma-separated name:batch:size (default: "
                        + ",".join(f"{n}:{b}:{s}" for n, b, s in CASES) + ")")
    args = parser.parse_args()
    cases = CASES if not args.models else [(n, int(b), int(s)) for n, b, s in
                                           (item.split(":") for item in args.models.split(","))]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    keep_freed_memory()   # else a step pays page faults for the smaller step before it
    results = [bench(name, batch, size, args.repeats) for name, batch, size in cases]
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "target_ratio": 1.03,
              "setup": software_setup(), "results": results}
    print(json.dumps(report, indent=1))  # the benchmark's output is this JSON on stdout


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
