"""Step time of plain PyTorch against the executor running the keep-all schedule (no recomputation).

The executor adds one custom autograd function, one gradient edge and one backward call per
stage; this measures what that costs on a whole training step. Prints one JSON object:
per model the median step times of both (forward, loss, backward; gradients reset to
``None`` between steps) and their ratio, whose target is <= 1.03.

Usage: ``python benchmarks/executor_overhead.py [--repeats N] [--threads T]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from edgetrain.models import get_model_spec
from edgetrain.runtime import Executor
from edgetrain.schedule import keep_all
from edgetrain.stages import training_stages

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

    def plain() -> None:
        _zero(model)
        nn.functional.cross_entropy(model(x), y).backward()

    def scheduled() -> None:
        _zero(model)
        executor.step(x, y)

    for _ in range(2):  # warm-up: allocator, kernels, lazy initialisation
        plain()
        scheduled()
    plain_times, executor_times = [], []
    for i in range(repeats):
        if i % 2:
            executor_times.append(_time_s(scheduled))
            plain_times.append(_time_s(plain))
        else:
            plain_times.append(_time_s(plain))
            executor_times.append(_time_s(scheduled))
    plain_s, executor_s = statistics.median(plain_times), statistics.median(executor_times)
    pair_ratio = statistics.median(e / p for e, p in zip(executor_times, plain_times))
    log.info("%s: plain %.4f s, executor %.4f s", name, plain_s, executor_s)
    return {"model": name, "batch": batch, "size": size, "repeats": repeats, "plain_s": plain_s,
            "executor_s": executor_s, "ratio": executor_s / plain_s, "pair_ratio": pair_ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    results = [bench(name, batch, size, args.repeats) for name, batch, size in CASES]
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "target_ratio": 1.03,
              "results": results}
    print(json.dumps(report, indent=1))  # the benchmark's output is this JSON on stdout


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
