"""Throughput and peak memory against batch size, with and without a checkpointing plan.

Edge studies (e.g. Mwase et al., AAAI 2024, on Raspberry Pi 4) find throughput grows with the
batch until memory stops it. This sweep shows both sides for a model on this machine and where
a device's memory cuts off: the largest batch that trains plainly, and the largest that trains
with the best schedule that fits (found on the meta device by doubling then bisection, so
batches far beyond this machine's memory are answered too).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..core.optim import make_optimizer
from ..core.schedule import keep_all
from ..core.simulator import simulate
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..models import get_model_spec
from ..models.stages import training_stages
from ..planners import plan
from ..profiling.estimate import chain_for
from ..profiling.measure import step_times, train_step
from ..runtime import Executor

__all__ = ["BatchPoint", "BatchSweep", "DeviceLargestBatch", "PAPER_LARGEST_BATCH", "largest_batch",
           "largest_batches_by_device", "sweep_batches"]

# Mwase, Kahira, Zou, "An Empirical Study of Distributed Deep Learning Training on Edge", AAAI 2024: "TensorFlow
# and PyTorch are limited to batch sizes of 512 and 1024 respectively due to memory consumption", training
# ResNet-18 on CIFAR-10 on a 4 GB Raspberry Pi 4.
PAPER_LARGEST_BATCH = {"rpi4": (1024, "Mwase et al., AAAI 2024: PyTorch, ResNet-18 on CIFAR-10 (32 px), "
                                      "4 GB Raspberry Pi 4; a whole training process, batches in powers of two")}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPoint:
    """One batch size: estimated peaks, and throughput of ``runs`` separate runs (fresh model each).

    ``*_samples_per_s`` is the median of the runs, ``*_runs_samples_per_s`` every run's value
    (each the median of its timed steps), so the spread is visible; None: not run here (beyond
    ``max_run_batch``, or no schedule fits).
    """

    batch: int
    plain_peak_bytes: int
    planned_peak_bytes: int | None  # None: no schedule fits the budget
    planned_recompute_factor: float | None
    plain_samples_per_s: float | None
    planned_samples_per_s: float | None
    plain_runs_samples_per_s: tuple[float, ...] | None = None
    planned_runs_samples_per_s: tuple[float, ...] | None = None


@dataclass(frozen=True)
class DeviceLargestBatch:
    """The largest batch whose training step fits a device, plainly and with the best schedule."""

    device: str
    model: str
    image: int
    budget_bytes: int
    largest_plain_batch: int
    largest_planned_batch: int
    paper_batch: int | None  # a published largest batch on this device, if any
    paper_source: str | None


@dataclass(frozen=True)
class BatchSweep:
    model: str
    image: int
    budget_bytes: int
    points: tuple[BatchPoint, ...]
    largest_plain_batch: int
    largest_planned_batch: int

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "image": self.image, "budget_bytes": self.budget_bytes,
                "largest_plain_batch": self.largest_plain_batch, "largest_planned_batch": self.largest_planned_batch,
                "points": [asdict(p) for p in self.points]}


def _plain_peak(model: str, batch: int, image: int) -> int:
    chain = chain_for(model, batch, image)
    return simulate(chain, keep_all(chain.length)).peak_bytes


def _trainable(model: str, batch: int, image: int) -> bool:
    try:
        chain_for(model, batch, image)
    except EdgetrainError:
        return False
    return True


def _planned_fits(model: str, batch: int, image: int, budget_bytes: int) -> bool:
    try:
        plan(chain_for(model, batch, image), memory=budget_bytes)
    except InfeasibleBudgetError:
        return False
    return True


def largest_batch(fits: Callable[[int], bool], start: int = 1, limit: int = 1 << 20) -> int:
    """Largest batch for which ``fits`` holds, assuming it is monotone from ``start``; 0 if not even there."""
    if not fits(start):
        return 0
    low = start
    while low * 2 <= limit and fits(low * 2):
        low *= 2
    high = min(low * 2, limit + 1)  # fits(low) and not fits(high), or high beyond the limit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _throughputs(model_name: str, batch: int, image: int, budget_bytes: int | None, reps: int,
                 runs: int) -> tuple[float, ...]:
    """Samples per second of ``runs`` separate runs, each with its own model and warm-up."""
    return tuple(_throughput(model_name, batch, image, budget_bytes, reps) for _ in range(runs))


def _throughput(model_name: str, batch: int, image: int, budget_bytes: int | None, reps: int) -> float:
    """Samples per second of SGD steps, plain (budget None) or following the plan for the budget."""
    spec = get_model_spec(model_name)
    torch.manual_seed(0)
    model = spec.build()
    x, y = spec.example_input(batch, image), spec.example_target(batch)
    opt = make_optimizer("sgd", model.parameters())
    if budget_bytes is None:
        def step() -> None:
            train_step(model, x, y, opt)
    else:
        chain = chain_for(model_name, batch, image)
        executor = Executor(training_stages(model), plan(chain, memory=budget_bytes).schedule, chain)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            executor.step(x, y)
            opt.step()
    return batch / statistics.median(step_times(step, reps))


def sweep_batches(model: str, image: int, budget_bytes: int, *, batches: tuple[int, ...] = (),
                  max_run_batch: int = 64, reps: int = 3, runs: int = 3,
                  progress: Callable[[int, int], None] | None = None) -> BatchSweep:
    """Peak memory (estimated) and throughput (measured up to ``max_run_batch``) for each batch.

    Batches default to powers of two up to the largest plan-able one. Throughput with planning
    is measured only where plain training would not fit the budget, since below that the best
    plan is plain training itself. Each throughput is measured in ``runs`` separate runs of
    ``reps`` timed steps (median per run); the point holds every run and their median.
    """
    if runs < 1 or reps < 1:
        raise EdgetrainError(f"runs and reps must be >= 1, got runs={runs}, reps={reps}")
    smallest = 1 if _trainable(model, 1, image) else 2  # BatchNorm needs two values per channel
    largest_plain = largest_batch(lambda b: _plain_peak(model, b, image) <= budget_bytes, smallest)
    largest_planned = largest_batch(lambda b: _planned_fits(model, b, image, budget_bytes), smallest)
    if largest_planned == 0:
        raise EdgetrainError(f"{model} at {image} px does not fit the budget even at batch {smallest} "
                             "with checkpointing")
    powers = {1 << k for k in range(smallest - 1, largest_planned.bit_length())}
    sizes = batches or tuple(sorted(powers | {b for b in (largest_plain, largest_planned) if b > 0}))
    points = []
    for index, batch in enumerate(sizes):
        plain_peak = _plain_peak(model, batch, image)
        try:
            chosen = plan(chain_for(model, batch, image), memory=budget_bytes)
            planned_peak, factor = chosen.predicted_peak_bytes, chosen.recompute_factor
        except InfeasibleBudgetError:
            planned_peak, factor = None, None
        runnable = batch <= max_run_batch
        plain_runs = _throughputs(model, batch, image, None, reps, runs) if runnable else None
        needs_plan = planned_peak is not None and plain_peak > budget_bytes
        planned_runs = (_throughputs(model, batch, image, budget_bytes, reps, runs) if runnable and needs_plan
                        else plain_runs if planned_peak is not None else None)
        points.append(BatchPoint(batch, plain_peak, planned_peak, factor, _median(plain_runs), _median(planned_runs),
                                 plain_runs, planned_runs))
        log.info("batch %d: %s", batch, points[-1])
        if progress is not None:
            progress(index + 1, len(sizes))
    return BatchSweep(model, image, budget_bytes, tuple(points), largest_plain, largest_planned)


def _median(values: tuple[float, ...] | None) -> float | None:
    return None if values is None else statistics.median(values)


def largest_batches_by_device(models: tuple[str, ...], image: int,
                              budgets: dict[str, int]) -> list[DeviceLargestBatch]:
    """The largest plain and planned batch of each model within each device's budget, beside any published one.

    Args:
        models: zoo names, e.g. ``("resnet18", "resnet18_cifar")``.
        image: image side in pixels.
        budgets: device name -> the budget for a step's tensors, bytes.
    """
    rows = []
    for device, budget_bytes in budgets.items():
        paper_batch, paper_source = PAPER_LARGEST_BATCH.get(device, (None, None))
        for model in models:
            plain, planned = _largest_pair(model, image, budget_bytes)
            rows.append(DeviceLargestBatch(device, model, image, budget_bytes, plain, planned, paper_batch,
                                           paper_source))
    return rows


def _largest_pair(model: str, image: int, budget_bytes: int) -> tuple[int, int]:
    """The largest batch within ``budget_bytes`` plainly and with the best schedule."""
    smallest = 1 if _trainable(model, 1, image) else 2
    return (largest_batch(lambda b: _plain_peak(model, b, image) <= budget_bytes, smallest),
            largest_batch(lambda b: _planned_fits(model, b, image, budget_bytes), smallest))


def plot_sweep(sweep: BatchSweep, path: Path) -> None:
    """Two panels: throughput and peak memory against batch size (log-2 axis)."""
    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plotting needs matplotlib: pip install 'edgetrain[reports]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    batches = [p.batch for p in sweep.points]
    for label, rates in (("plain", [p.plain_samples_per_s for p in sweep.points]),
                         ("with plan", [p.planned_samples_per_s for p in sweep.points])):
        xs = [b for b, r in zip(batches, rates, strict=True) if r is not None]
        left.plot(xs, [r for r in rates if r is not None], marker="o", label=label)
    left.set(xscale="log", xlabel="batch size", ylabel="samples / s (this machine)", title="Throughput")
    right.plot(batches, [p.plain_peak_bytes / 2**30 for p in sweep.points], marker="o", label="plain")
    planned = [(p.batch, p.planned_peak_bytes) for p in sweep.points if p.planned_peak_bytes is not None]
    right.plot([b for b, _ in planned], [m / 2**30 for _, m in planned], marker="s", label="with plan")
    right.axhline(sweep.budget_bytes / 2**30, color="black", linestyle="--", label="budget")
    right.set(xscale="log", yscale="log", xlabel="batch size", ylabel="peak memory (GiB)", title="Peak memory")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(True, alpha=0.3)
        axis.legend()
    fig.suptitle(f"{sweep.model} at {sweep.image} px: largest batch plain {sweep.largest_plain_batch}, "
                 f"with plan {sweep.largest_planned_batch}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
