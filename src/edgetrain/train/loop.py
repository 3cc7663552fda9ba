"""Train a zoo model within a memory budget: plan, execute the plan, evaluate, save state, resume.

The loop is the library behind ``edgetrain train``: it profiles the model on one batch, asks
the planner for the fastest schedule within the budget (or the least memory within a recompute
factor), runs every step through the :class:`~edgetrain.runtime.Executor` and saves crash-safe
state every few steps, so a board that loses power resumes exactly where it stopped.

NOTE [ Exact resume ]
A resumed run computes the same losses and weights as an uninterrupted one because everything
that decides the rest of the run is saved between two steps (weights, optimizer, RNG, epoch,
position in the epoch's permutation, schedule), the data order comes from (seed, epoch) alone,
DataLoader workers are seeded from a generator of their own (not the global RNG), and profiling
at start-up restores the RNG it used. Metrics lines written after the last saved state are
dropped on resume, since those steps are run again.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..chain import Chain
from ..data import CachingReader, MinIOCache, collate_skip_corrupt, first_batch, open_dataset
from ..devices import get_device
from ..errors import EdgetrainError
from ..models import check_input, get_model_spec
from ..optim import make_optimizer
from ..planners import Candidate, Plan, plan
from ..profile import LiveBytesTracker, profile
from ..runtime import Executor
from ..schedule import Schedule, keep_all, simulate, validate
from ..stages import training_stages
from ..units import parse_bytes
from .state import ResumableSampler, StateStore, TrainingState, capture_rng, restore_rng

__all__ = ["TrainConfig", "TrainSummary", "StepMetrics", "train", "evaluate"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """What to train, on what data, within what budget, and where to keep the run."""

    model: str = "resnet18"
    data: str = "synthetic"
    samples: int = 1000
    batch: int = 8
    image: int = 64
    memory: str | int | None = None
    recompute: float | None = None
    device: str | None = None
    strategy: str = "auto"
    epochs: int = 3
    optimizer: str = "sgd"
    lr: float | None = None
    workers: int = 0
    run_dir: Path = Path("runs/latest")
    data_root: Path | None = None
    resume: bool = False
    seed: int = 0
    save_every: int = 50
    keep_last: int = 2
    skip_corrupt: bool = False

    def budget_bytes(self) -> int | None:
        """The memory budget: ``memory`` if given, else the device's RAM, else none."""
        if self.memory is not None:
            return parse_bytes(self.memory)
        if self.device is not None:
            return get_device(self.device).memory_bytes
        return None


@dataclass(frozen=True)
class StepMetrics:
    """One line of ``metrics.jsonl``."""

    step: int
    epoch: int
    loss: float
    samples_per_s: float
    time_s: float
    peak_bytes: int | None = None


@dataclass(frozen=True)
class TrainSummary:
    """``summary.json``: how the run went, measured."""

    accuracy: float
    chance_accuracy: float
    val_loss: float
    measured_peak_bytes: int
    predicted_peak_bytes: int
    budget_bytes: int | None
    recompute_factor: float
    strategy: str
    wall_time_s: float
    steps: int
    epochs: int
    train_samples: int
    val_samples: int
    resumed_from_step: int | None = None
    config: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[StepMetrics, int], None]  # (metrics, total steps)


def train(config: TrainConfig, progress: ProgressFn | None = None) -> TrainSummary:
    """Train ``config.model`` on ``config.data`` within the budget; write metrics, state and summary.

    Raises:
        InfeasibleBudgetError: the budget is below what any schedule needs (with the minimum).
        EdgetrainError: bad model, data, batch or image size; a run directory to resume that has
            no saved state.
    """
    started = time.perf_counter()
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = get_model_spec(config.model)
    check_input(spec, config.batch, config.image)
    train_set, val_set, num_classes = open_dataset(
        config.data, image_size=config.image, samples=config.samples, seed=config.seed,
        root=config.data_root or run_dir / "data", skip_corrupt=config.skip_corrupt, vocab_size=spec.vocab_size)
    if len(train_set) < config.batch:
        raise EdgetrainError(f"the training split has {len(train_set)} samples, fewer than one batch of {config.batch}")

    torch.manual_seed(config.seed)
    model = spec.build(num_classes)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    store = StateStore(run_dir / "state", keep_last=config.keep_last)
    sampler = ResumableSampler(len(train_set), config.seed)
    resumed = _resume(store, config) if config.resume else None

    sample_x, sample_y = first_batch(train_set, config.batch)
    chain, chosen = _plan_training(model, sample_x, sample_y, config, resumed.schedule if resumed else None)
    executor = Executor(training_stages(model), chosen.schedule, chain)
    _write_json(run_dir / "plan.json", {"schedule": chosen.schedule.to_dict(), **chosen.to_dict()})
    log.info("plan: %s, predicted peak %d bytes, recompute factor %.3f", chosen.strategy,
             chosen.predicted_peak_bytes, chosen.recompute_factor)

    cache = _sample_cache(chosen, config)
    if cache is not None:
        train_set = train_set.with_reader(CachingReader(cache))
    epoch, step = 0, 0
    if resumed is not None:
        resumed.restore(model, optimizer, sampler=sampler)
        epoch, step = resumed.epoch, resumed.step
        _truncate_metrics(run_dir / "metrics.jsonl", resumed)
    start_step = step
    steps_per_epoch = len(train_set) // config.batch
    total_steps = steps_per_epoch * config.epochs
    measured_peak, accuracy, val_loss = 0, math.nan, math.nan
    with _MetricsLog(run_dir / "metrics.jsonl") as metrics_log:
        while epoch < config.epochs:  # the sampler is at (epoch, position): fresh, resumed or set below
            for x, y in _batches(train_set, sampler, config, epoch):
                # The tracker slows a step: measure the first steady-state step (the optimizer state
                # exists from the second step on) and the first step of every later epoch.
                measure = step == start_step + 1 or (step > start_step and step % steps_per_epoch == 0)
                metrics = _train_step(executor, model, optimizer, x, y, step + 1, epoch, measure)
                step += 1
                measured_peak = max(measured_peak, metrics.peak_bytes or 0)
                metrics_log.append(asdict(metrics))
                if progress is not None:
                    progress(metrics, total_steps)
                if step % config.save_every == 0:
                    store.save(_capture(step, epoch, model, optimizer, chosen.schedule, sampler,
                                        (step - epoch * steps_per_epoch) * config.batch))
            accuracy, val_loss = evaluate(model, val_set, config.batch)
            record = {"step": step, "epoch": epoch, "val_accuracy": accuracy, "val_loss": val_loss}
            if cache is not None:
                record.update(cache_hit_rate=cache.stats.hit_rate, cache_bytes=cache.used_bytes)
                cache.stats.reset()
            metrics_log.append(record)
            epoch += 1
            sampler.set_epoch(epoch)
            store.save(_capture(step, epoch, model, optimizer, chosen.schedule, sampler, 0))
    summary = TrainSummary(
        accuracy=accuracy, chance_accuracy=1 / num_classes, val_loss=val_loss, measured_peak_bytes=measured_peak,
        predicted_peak_bytes=chosen.predicted_peak_bytes, budget_bytes=config.budget_bytes(),
        recompute_factor=chosen.recompute_factor, strategy=chosen.strategy,
        wall_time_s=time.perf_counter() - started, steps=step, epochs=config.epochs,
        train_samples=len(train_set), val_samples=len(val_set),
        resumed_from_step=resumed.step if resumed else None,
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()})
    _write_json(run_dir / "summary.json", asdict(summary))
    return summary


def evaluate(model: nn.Module, dataset: Dataset[Any], batch: int) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on ``dataset`` in eval mode."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, y in (b for b in DataLoader(dataset, batch_size=batch, collate_fn=collate_skip_corrupt) if b):
            logits = model(x)
            loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
            total += int(y.numel())
    model.train()
    return (correct / total, loss_sum / total) if total else (math.nan, math.nan)


def _resume(store: StateStore, config: TrainConfig) -> TrainingState:
    state = store.load_latest()
    if state is None:
        raise EdgetrainError(f"--resume: no saved training state under {store.run_dir}")
    log.info("resuming from step %d (epoch %d)", state.step, state.epoch)
    return state


def _plan_training(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig,
                   saved: Schedule | None) -> tuple[Chain, Plan]:
    """Profile one batch (leaving the RNG as it was) and plan, or reuse the schedule of a resumed run."""
    rng = capture_rng()
    chain = replace(profile(model, x, y, optimizer=config.optimizer, repeats=2), name=config.model)
    restore_rng(rng)
    budget = config.budget_bytes()
    if saved is not None or (budget is None and config.recompute is None):
        schedule = saved if saved is not None else keep_all(chain.length)
        validate(chain, schedule)
        return chain, Plan(Candidate(schedule, simulate(chain, schedule)), budget, config.recompute, None)
    if config.recompute is not None:
        return chain, plan(chain, recompute=config.recompute, strategy=config.strategy)
    return chain, plan(chain, memory=budget, strategy=config.strategy)


def _sample_cache(chosen: Plan, config: TrainConfig) -> MinIOCache | None:
    """An epoch-aware cache of encoded samples in what the budget leaves beside the planned peak.

    MinIO-style (Mohan et al., VLDB 2021): the first samples that fit stay for the whole run,
    so every shuffled epoch after the first hits the cached fraction. Only without loader
    workers, which would each fill a private copy and overspend the budget.
    """
    budget = config.budget_bytes()
    if budget is None or config.workers > 0 or budget <= chosen.predicted_peak_bytes:
        return None
    return MinIOCache(capacity_bytes=budget - chosen.predicted_peak_bytes)


def _batches(dataset: Dataset[Any], sampler: ResumableSampler, config: TrainConfig,
             epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    # Workers draw their seeds from this generator, not from the global RNG the step uses.
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
    loader = DataLoader(dataset, batch_size=config.batch, sampler=sampler, num_workers=config.workers,
                        drop_last=True, generator=generator, persistent_workers=False,
                        collate_fn=collate_skip_corrupt)
    yield from (batch for batch in loader if batch is not None)  # None: every sample was corrupt and skipped


def _train_step(executor: Executor, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor, step: int, epoch: int, measure: bool) -> StepMetrics:
    start = time.perf_counter()
    peak = None
    if measure:
        with LiveBytesTracker() as tracker:
            tracker.register(model.parameters())
            tracker.register(model.buffers())
            tracker.register(t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
            tracker.register([x, y])
            loss = _step(executor, optimizer, x, y)
        peak = tracker.peak_bytes
    else:
        loss = _step(executor, optimizer, x, y)
    elapsed = time.perf_counter() - start
    return StepMetrics(step=step, epoch=epoch, loss=loss, samples_per_s=len(y) / elapsed, time_s=elapsed,
                       peak_bytes=peak)


def _step(executor: Executor, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = executor.step(x, y)
    optimizer.step()
    return float(loss)


def _capture(step: int, epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule,
             sampler: ResumableSampler, consumed: int) -> TrainingState:
    return TrainingState.capture(step=step, epoch=epoch, model=model, optimizer=optimizer, schedule=schedule,
                                 sampler=sampler.state_dict(consumed=consumed))


class _MetricsLog:
    """Append-only JSON lines, flushed per line so a crash loses at most the line being written.

    When TensorBoard is installed, every numeric field is also logged as a scalar under
    ``run_dir/tensorboard`` (x axis: the step).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.board: Any = None

    def __enter__(self) -> _MetricsLog:
        self.file = self.path.open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return self
        self.board = SummaryWriter(str(self.path.parent / "tensorboard"))
        return self

    def append(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.board is not None:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)) and value is not None:
                    self.board.add_scalar(key, value, record["step"])

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        if self.board is not None:
            self.board.close()


def _truncate_metrics(path: Path, state: TrainingState) -> None:
    """Drop metrics written after the resumed state was saved: those steps are about to run again.

    Step lines are numbered by the step they end; the evaluation of epoch ``e`` is written just
    before the state that starts epoch ``e + 1``, so it belongs to the resumed past iff
    ``e < state.epoch``.
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the crash
            continue
        past = record["epoch"] < state.epoch if "val_accuracy" in record else record["step"] <= state.step
        if past:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
