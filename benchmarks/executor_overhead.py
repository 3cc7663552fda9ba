"""Step time of plain PyTorch against the executor running the keep-all schedule (no recomputation).

The executor runs keep-all as plain autograd (``executor``); run op by op, as every other schedule
is, it adds two custom autograd functions and one backward call per stage (``op_by_op``). Each step
is forward, loss and backward, gradients reset to ``None`` between steps. Steps alternate in
triples whose order reverses from one to the next, so drifts in machine load hit all three alike;
the ratio to plain PyTorch is the median of the per-triple ratios (target: at most 1.03 for the
keep-all executor), given with its spread over the triples.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks._allocator import keep_freed_memory
from edgetrain.bench.stats import Spread, spread
from edgetrain.core.schedule import keep_all
from edgetrain.models import get_model_spec
from edgetrain.models.stages import training_stages
from edgetrain.runtime import Executor

log = logging.getLogger("executor_overhead")

TITLE = "The executor's overhead over plain PyTorch"
# (model, batch, size): the ResNets on 224 px images, the small encoder on 128-token sequences.
CASES = (("resnet18", 8, 224), ("resnet50", 8, 224), ("transformer_small", 64, 128))
QUICK_CASES = (("resnet18", 4, 96), ("transformer_small", 16, 64))
REPEATS, QUICK_REPEATS = 11, 7
# One intra-op thread: on a shared 2-core machine two threads stall whenever one is descheduled (see
# NOTE [ Time ratios on a shared CPU ] in benchmarks/planners.py), and the planner benchmark runs on one.
THREADS = 1
TARGET_RATIO = 1.03
RUNS = ("plain", "executor", "op_by_op")


def _time_s(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _zero(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def bench(name: str, batch: int, size: int, repeats: int) -> dict[str, Any]:
    """Step seconds of plain autograd, of the keep-all executor and of keep-all op by op, ``repeats`` triples."""
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
        for step in runs.values():
            step()
    times: dict[str, list[float]] = {key: [] for key in runs}
    for i in range(repeats):
        for key in RUNS if i % 2 == 0 else reversed(RUNS):   # alternate who runs first
            times[key].append(_time_s(runs[key]))
    log.info("%s: %s", name, ", ".join(f"{key} {spread(v).median:.4f} s" for key, v in times.items()))
    return {"model": name, "batch": batch, "size": size, "repeats": repeats,
            "step_s": {key: spread(values).to_dict() for key, values in times.items()},
            "ratio": {key: spread([t / p for t, p in zip(times[key], times["plain"], strict=True)]).to_dict()
                      for key in ("executor", "op_by_op")}}


def run(quick: bool) -> dict[str, Any]:
    """Every case on ``THREADS`` torch threads, with glibc keeping freed memory."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    kept = keep_freed_memory()   # else a step pays page faults for the smaller step before it
    try:
        rows = [bench(name, batch, size, QUICK_REPEATS if quick else REPEATS)
                for name, batch, size in (QUICK_CASES if quick else CASES)]
    finally:
        torch.set_num_threads(threads)
    return {"threads": THREADS, "target_ratio": TARGET_RATIO, "malloc_keeps_freed_memory": kept, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """Per model: the three step times and the two ratios to plain PyTorch, each with its spread."""
    def ratio(item: dict[str, Any]) -> str:
        s = Spread.from_dict(item)
        return f"{s.median:.3f} ({s.q1:.3f}-{s.q3:.3f}, CoV {s.cov_text})"

    rows = []
    for r in result["rows"]:
        step = {key: Spread.from_dict(r["step_s"][key]) for key in RUNS}
        rows.append(f"| {r['model']} | {r['batch']} | {r['size']} | {r['repeats']} | "
                    + " | ".join(f"{step[key].median:.4f}" for key in RUNS)
                    + f" | {ratio(r['ratio']['executor'])} | {ratio(r['ratio']['op_by_op'])} |")
    return ("The `Executor` runs the keep-all schedule as plain autograd: one graph, one backward. Run op by op "
            "(`plain_keep_all=False`), as every other schedule is, it adds two custom autograd functions and one "
            "backward call per stage. Each step is forward, loss and backward with gradients reset to `None`; the "
            "three configurations run in alternating triples whose order reverses each time, on "
            f"{result['threads']} torch thread{'s' if result['threads'] > 1 else ''}. A ratio is the median over "
            "triples of the configuration's time "
            "over plain PyTorch's in the same triple, with its quartiles and CoV; the target for the keep-all "
            f"executor is at most {result['target_ratio']}.\n\n"
            "| model | batch | size | triples | plain (s) | executor (s) | op by op (s) | executor / plain | "
            "op by op / plain |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
