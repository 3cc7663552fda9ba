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
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..core.chain import Chain
from ..core.optim import TrainingOptimizer, make_optimizer, set_learning_rate
from ..core.schedule import Schedule, keep_all
from ..core.simulator import simulate, validate
from ..data import CachingReader, FileDataset, MinIOCache, collate_skip_corrupt, first_batch, open_dataset
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..models import get_model_spec
from ..models.factory import check_factory_call, is_factory_name
from ..models.stages import training_stages
from ..models.traced import model_call
from ..models.update import apply_update
from ..planners import Candidate, Plan, plan
from ..profiling import LiveBytesTracker, profile
from ..profiling.cache import default_profile_cache
from ..profiling.process import configure_allocator, read_process_memory, reset_peak, return_freed_memory
from ..runtime import Executor
from ..runtime.step_in_backward import StepInBackward, shared_gradient_bytes
from ..sysutil.fileio import LeftAsItWas, to_json, write_atomic, write_json
from ..sysutil.processes import worker_dies_with_parent
from ..units import format_bytes
from .auto_update import resolve_update
from .budget import FIRST_STEP_BYTES, ProcessBudget, measure_runtime_baseline, split_process_budget
from .config import TrainConfig
from .rundir import (
    LOCK_FILE,
    METRICS_FILE,
    PLAN_FILE,
    RUN_FILE,
    STATE_DIR,
    SUMMARY_FILE,
    RunDirectory,
    RunIdentity,
    RunMismatchError,
)
from .state import ResumableSampler, StateStore, TrainingState, capture_rng, restore_rng

__all__ = ["TrainSummary", "StepMetrics", "train", "evaluate", "profile_batch", "choose_plan",
           "MetricsLog", "truncate_metrics", "Opening", "open_run", "open_run_data"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepMetrics:
    """One line of ``metrics.jsonl``."""

    step: int
    epoch: int
    loss: float
    samples_per_s: float
    time_s: float
    peak_bytes: int | None = None
    process_peak_bytes: int = 0


@dataclass(frozen=True)
class TrainSummary:
    """``summary.json``: how the run went, measured. ``None`` where a figure does not exist
    (no validation samples, no step measured)."""

    accuracy: float | None
    chance_accuracy: float
    val_loss: float | None
    measured_peak_bytes: int | None
    predicted_peak_bytes: int
    budget_bytes: int | None
    tensor_budget_bytes: int | None
    process_peak_bytes: int
    runtime_baseline_bytes: int
    predicted_process_peak_bytes: int
    recompute_factor: float
    strategy: str
    wall_time_s: float
    steps: int
    epochs: int
    train_samples: int
    val_samples: int
    resumed_from_step: int | None = None
    skipped_samples: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    # the plan's peak as the tracker counts a step (measured_peak_bytes): without the kernels' scratch, which only the
    # allocator's records see (NOTE [ A kernel's scratch in the plan ] in chain.py); None in summaries from before it
    predicted_tracked_peak_bytes: int | None = None
    update: str | None = None          # the scheme that trained: ``auto``'s pick, or the one given
    update_choice: str | None = None   # why ``auto`` picked it (``AutoChoice.explain`` in train/contribution.py)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TrainSummary:
        """A summary read back from ``summary.json`` (unknown keys of newer versions ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in names})


ProgressFn = Callable[[StepMetrics, int], None]  # (metrics, total steps)


@dataclass
class Opening:
    """How a run starts: afresh, from a saved state, or not at all (already finished)."""

    finished: TrainSummary | None = None
    state: TrainingState | None = None
    replaces: bool = False  # --overwrite: the run there is removed at the first write, not before the checks
    schedule: Schedule | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    update: str | None = None   # the scheme a resumed ``--update auto`` run chose at its start


def train(config: TrainConfig, progress: ProgressFn | None = None) -> TrainSummary:
    """Train ``config.model`` on ``config.data`` within the budget; write metrics, state and summary.

    Every setting is checked before any work, the run directory is locked for the whole run,
    and ``resume`` continues only the same run (see NOTE [ Run directory protocol ]); resuming a
    finished run returns its saved summary and changes no file.

    Raises:
        InfeasibleBudgetError: the budget is below what any schedule needs (with the minimum).
        RunLockedError: another process is training into ``run_dir``.
        RunMismatchError: ``resume`` with settings that differ from the run's.
        EdgetrainError: bad model, data, batch or image size; a fresh run into a directory that
            holds one without ``overwrite``.
    """
    config.check()
    undo = LeftAsItWas(config.run_dir, own=(LOCK_FILE,))
    with RunDirectory(config.run_dir) as run, undo:
        opening = open_run(run, config)
        if opening.finished is not None:
            log.info("the run in %s is finished; nothing to do", run.path)
            undo.commit()
            return opening.finished
        run.claim()
        return _run(run, config, opening, progress, undo)


def open_run(run: RunDirectory, config: TrainConfig) -> Opening:
    """Decide how the run starts; refuse (before any write) what would mix two runs."""
    identity = config.identity()
    if not config.resume:
        if run.holds_a_run():
            if not config.overwrite:
                raise EdgetrainError(f"run directory {run.path} already holds a run; pass --resume to continue it, "
                                     "--overwrite to replace it, or another --run-dir")
            return Opening(replaces=True)
        return Opening()
    saved = run.saved_identity()
    if saved is None:
        if run.holds_a_run():
            raise RunMismatchError(f"{run.path} holds a run without {RUN_FILE} (from an older edgetrain), whose "
                                   "settings cannot be checked; start it again with --overwrite")
        log.info("nothing to resume in %s: starting the run", run.path)
        return Opening()
    changes = identity.identity_changes(saved)
    if changes:
        raise RunMismatchError(f"--resume: the run in {run.path} has other settings ({'; '.join(changes)}); resume "
                               "with the run's settings, or start again with --overwrite")
    finished = run.finished_summary(config.epochs)
    if finished is not None:
        return Opening(finished=TrainSummary.from_dict(finished))
    state = StateStore(run.file(STATE_DIR), keep_last=config.keep_last).load_latest()
    if state is None:  # killed before the first save: nothing trained is kept
        return Opening()
    return _resumed(run, config, saved, state)


def _resumed(run: RunDirectory, config: TrainConfig, saved: RunIdentity, state: TrainingState) -> Opening:
    """Resume from ``state``; a changed request keeps the saved plan only if that plan meets it."""
    changes = config.identity().request_changes(saved)
    figures = run.saved_plan()
    chosen = None if figures is None else figures.get("update")
    if not changes or figures is None:
        return Opening(state=state, schedule=state.schedule, update=chosen)
    unmet = _unmet(figures, config.identity().request)
    record = {"step": state.step, "epoch": state.epoch, "changes": changes}
    if not unmet:
        return Opening(state=state, schedule=state.schedule, events=[{**record, "event": "request_changed"}],
                       update=chosen)
    if not config.replan:
        raise RunMismatchError(f"--resume: the request changed ({'; '.join(changes)}) and the run's plan does not "
                               f"meet it ({'; '.join(unmet)}); resume with the run's settings, or pass --replan")
    return Opening(state=state, schedule=None, events=[{**record, "event": "replanned", "unmet": unmet}],
                   update=chosen)


def _unmet(figures: dict[str, Any], request: dict[str, Any]) -> list[str]:
    """What of ``request`` a plan with these predicted figures does not meet."""
    unmet = []
    budget, peak = request.get("budget_bytes"), int(figures["predicted_process_bytes"])
    if budget is not None and peak > budget:
        unmet.append(f"predicted process peak {format_bytes(peak)} > budget {format_bytes(budget)}")
    step_budget = request.get("step_budget_bytes")
    if step_budget is not None and int(figures["predicted_peak_bytes"]) > step_budget:
        unmet.append(f"predicted step peak {format_bytes(figures['predicted_peak_bytes'])} > step budget "
                     f"{format_bytes(step_budget)}")
    limit, factor = request.get("recompute"), float(figures["recompute_factor"])
    if limit is not None and factor > limit * (1 + 1e-12):
        unmet.append(f"recompute factor {factor:.3f} > {limit}")
    if request.get("strategy") not in ("auto", figures["strategy"]):
        unmet.append(f"strategy {figures['strategy']} is not {request.get('strategy')}")
    return unmet


def _run(run: RunDirectory, config: TrainConfig, opening: Opening, progress: ProgressFn | None,
         undo: LeftAsItWas) -> TrainSummary:
    """Open the data, profile, plan: all that can refuse the run, with nothing of the run written (``undo``
    removes a data cache made on the way); then write the run's identity and plan, and train."""
    started = time.perf_counter()
    if config.budget_bytes() is not None:  # pinning costs step time: only where a process budget must hold
        configure_allocator()  # NOTE [ Returning freed memory ]
    identity = config.identity()
    spec = get_model_spec(config.model)
    train_set, val_set, num_classes = open_run_data(config, run.path)
    if is_factory_name(config.model) and config.data != "synthetic":   # a folder's classes, known once it is open
        check_factory_call(config.model, config.batch, config.image, num_classes)
    if len(train_set) < config.batch:
        raise EdgetrainError(f"the training split has {len(train_set)} samples, fewer than one batch of {config.batch}")

    scheme, update_choice = resolve_update(spec, num_classes, train_set, config, opening.update)
    torch.manual_seed(config.seed)
    model = spec.build(num_classes)
    apply_update(model, scheme)   # before the stages: a frozen start folds into the first stage that trains
    sampler = ResumableSampler(len(train_set), config.seed)

    sample_x, sample_y = first_batch(train_set, config.batch)
    stages = training_stages(model, sample=sample_x)   # the sample: a model only torch.export captures
    call = model_call(stages)
    if call is not None:   # one input: its side values (NOTE [ Side inputs ] in models/call.py) are the same each batch
        call.bind((sample_x,), {})
    shipped = None if config.plan_file is None else config.shipped_plan()
    if shipped is not None:
        shipped.check_matches(num_classes=num_classes)
    chain = shipped.chain if shipped is not None else profile_batch(model, sample_x, sample_y, config)
    optimizer = _optimizer(config, model, stages)   # after profiling: its backwards must step nothing
    if config.step_in_backward:
        chain = chain.with_step_in_backward(shared_gradient_bytes(stages))
    epoch, step, resumed_at = 0, 0, None
    if opening.state is not None:  # after profiling (NOTE [ Exact resume ]); the loaded copy is then dropped
        opening.state.restore(model, optimizer, sampler=sampler)
        epoch, step = opening.state.epoch, opening.state.step
        resumed_at, opening.state = (step, epoch), None
    optimizer_state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    baseline = measure_runtime_baseline(model, sample_x, sample_y, *optimizer_state)
    if shipped is not None:  # planned elsewhere: no step has run yet to bring up the runtime's caches
        baseline += FIRST_STEP_BYTES
    process_bytes = config.budget_bytes()
    budget = None if process_bytes is None else split_process_budget(process_bytes, baseline)
    saved = opening.schedule if opening.schedule is not None else None if shipped is None else shipped.schedule
    chosen = choose_plan(chain, config, budget, saved)
    del sample_x, sample_y
    executor = Executor(stages, chosen.schedule, chain, page_dir=config.page_dir)
    undo.commit()
    if opening.replaces:
        run.remove_run()
    store = StateStore(run.file(STATE_DIR), keep_last=config.keep_last)
    # measured by the tracker, not by the allocator's records: a torch.profiler session around a step held ~30 MiB
    # of the process's memory (MobileNetV2 at batch 32, 48 px), which a process budget would pay
    predicted_tracked = simulate(chain.without_scratch(), chosen.schedule).peak_bytes
    write_json(run.file(PLAN_FILE), {"schedule": chosen.schedule.to_dict(), **chosen.to_dict()})
    run.record(identity, {**_plan_figures(chosen, baseline), "update": scheme})
    predicted_process = ProcessBudget(0, baseline).predicted_process_bytes(chosen.predicted_peak_bytes)
    log.info("plan: %s, predicted tensor peak %d bytes, process %d bytes, recompute factor %.3f", chosen.strategy,
             chosen.predicted_peak_bytes, predicted_process, chosen.recompute_factor)

    cache = _sample_cache(chosen, budget, config)
    if cache is not None:
        train_set = train_set.with_reader(CachingReader(cache))
    past = truncate_metrics(run.file(METRICS_FILE), resumed_at)
    start_step = step
    total_steps = config.total_steps(len(train_set))
    measured_peak = max((int(r["peak_bytes"]) for r in past if r.get("peak_bytes")), default=0)
    process_peak = max((int(r["process_peak_bytes"]) for r in past if r.get("process_peak_bytes")), default=0)
    return_freed_memory()
    reset_peak()  # from here on the kernel's high-water mark is training's
    last_eval: dict[str, Any] = next((r for r in reversed(past) if "val_accuracy" in r), {})
    accuracy, val_loss = last_eval.get("val_accuracy"), last_eval.get("val_loss")
    with MetricsLog(run.file(METRICS_FILE)) as metrics_log:
        for event in opening.events:
            metrics_log.append(event)
        while epoch < config.epochs:  # the sampler is at (epoch, position): fresh, resumed or set below
            consumed = sampler.position
            epoch_start = step
            for batch in _batches(train_set, sampler, config, epoch):
                consumed += config.batch  # the loader takes whole batches of indices, corrupt ones included
                if batch is None:
                    continue
                # The tracker slows a step: measure the first step that has optimizer state (the
                # second of a fresh run, the first of a resumed one; the only one of a one-step
                # session) and the first of every later epoch.
                measure = step == min(max(start_step, 1), total_steps - 1) or (step > start_step and
                                                                                step == epoch_start)
                set_learning_rate(optimizer, config.learning_rate_at(step, total_steps))
                metrics = _train_step(executor, model, optimizer, *batch, step + 1, epoch, measure)
                step += 1
                measured_peak = max(measured_peak, metrics.peak_bytes or 0)
                process_peak = max(process_peak, metrics.process_peak_bytes)
                metrics_log.append(asdict(metrics))
                if progress is not None:
                    progress(metrics, total_steps)
                if step % config.save_every == 0:
                    store.save(_capture(step, epoch, model, optimizer, chosen.schedule, sampler, consumed))
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
        accuracy=accuracy, chance_accuracy=1 / num_classes, val_loss=val_loss,
        measured_peak_bytes=measured_peak or None, predicted_peak_bytes=chosen.predicted_peak_bytes,
        budget_bytes=process_bytes,
        tensor_budget_bytes=config.step_budget_bytes() if budget is None else budget.tensor_bytes,
        process_peak_bytes=max(process_peak, read_process_memory().peak_rss_bytes), runtime_baseline_bytes=baseline,
        predicted_process_peak_bytes=predicted_process,
        recompute_factor=chosen.recompute_factor, strategy=chosen.strategy,
        wall_time_s=time.perf_counter() - started, steps=step, epochs=config.epochs,
        train_samples=len(train_set), val_samples=len(val_set),
        resumed_from_step=None if resumed_at is None else resumed_at[0],
        skipped_samples=train_set.corrupt_count + val_set.corrupt_count,
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        predicted_tracked_peak_bytes=predicted_tracked, update=scheme, update_choice=update_choice)
    write_json(run.file(SUMMARY_FILE), asdict(summary))
    return summary


def _plan_figures(chosen: Plan, baseline_bytes: int) -> dict[str, Any]:
    """What ``run.json`` keeps of the plan, to judge a changed request on resume without profiling."""
    return {"strategy": chosen.strategy, "predicted_peak_bytes": chosen.predicted_peak_bytes,
            "predicted_process_bytes": ProcessBudget(0, baseline_bytes).predicted_process_bytes(
                chosen.predicted_peak_bytes),
            "recompute_factor": chosen.recompute_factor, "predicted_time_s": chosen.predicted_time_s}


def evaluate(model: nn.Module, dataset: Dataset[Any], batch: int) -> tuple[float | None, float | None]:
    """Accuracy and mean cross-entropy on ``dataset`` in eval mode; None for an empty dataset."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, y in (b for b in DataLoader(dataset, batch_size=batch, collate_fn=collate_skip_corrupt) if b):
            logits = model(x)
            loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
            total += int(y.numel())
    model.train()
    return (correct / total, loss_sum / total) if total else (None, None)


def open_run_data(config: TrainConfig, run_path: Path) -> tuple[FileDataset, FileDataset, int]:
    """The run's training and validation splits and number of classes: ``config.data`` as the model reads it,
    generated (or found) under ``config.data_root``, else under ``run_path / "data"``."""
    return open_dataset(config.data, image_size=config.image, samples=config.samples, seed=config.seed,
                        root=config.data_root or run_path / "data", skip_corrupt=config.skip_corrupt,
                        vocab_size=get_model_spec(config.model).vocab_size)


def profile_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TrainConfig) -> Chain:
    """Profile one batch, leaving the RNG as it was (NOTE [ Exact resume ])."""
    rng = capture_rng()
    chain = replace(profile(model, x, y, optimizer=config.optimizer, repeats=2,
                            step_in_backward=config.step_in_backward, cache=default_profile_cache()),
                    name=config.model)
    restore_rng(rng)
    return chain


def choose_plan(chain: Chain, config: TrainConfig, budget: ProcessBudget | None, saved: Schedule | None) -> Plan:
    """The fastest schedule within the tensor budget (least memory within ρ), or the resumed run's schedule.

    Raises:
        InfeasibleBudgetError: in process terms (NOTE [ Process budget ]): the least step does not fit
            beside the runtime baseline, or a resumed schedule no longer does.
    """
    tensor_bytes = config.step_budget_bytes() if budget is None else budget.tensor_bytes
    if saved is not None or (tensor_bytes is None and config.recompute is None):
        schedule = saved if saved is not None else keep_all(chain.length)
        validate(chain, schedule)
        chosen = Plan(Candidate(schedule, simulate(chain, schedule)), tensor_bytes, config.recompute, None)
        if budget is not None and chosen.predicted_peak_bytes > budget.tensor_bytes:
            raise budget.infeasible(chosen.predicted_peak_bytes)
        if tensor_bytes is not None and chosen.predicted_peak_bytes > tensor_bytes:
            raise InfeasibleBudgetError(f"the plan's predicted step peak {format_bytes(chosen.predicted_peak_bytes)} "
                                        f"is above --step-memory {format_bytes(tensor_bytes)}",
                                        minimum_bytes=chosen.predicted_peak_bytes, budget_bytes=tensor_bytes)
        return chosen
    if config.recompute is not None:
        return plan(chain, recompute=config.recompute, strategy=config.strategy, jit=False)
    if budget is None:
        return plan(chain, memory=tensor_bytes, strategy=config.strategy, jit=False)
    try:
        return plan(chain, memory=max(budget.tensor_bytes, 1), strategy=config.strategy, jit=False)
    except InfeasibleBudgetError as exc:
        if exc.minimum_bytes is None:
            raise
        raise budget.infeasible(exc.minimum_bytes) from None


def _sample_cache(chosen: Plan, budget: ProcessBudget | None, config: TrainConfig) -> MinIOCache | None:
    """An epoch-aware cache of encoded samples in what the budget leaves beside the planned step.

    MinIO-style (Mohan et al., VLDB 2021): the first samples that fit stay for the whole run,
    so every shuffled epoch after the first hits the cached fraction. Only without loader
    workers, which would each fill a private copy and overspend the budget.
    """
    if budget is None or config.workers > 0:
        return None
    spare = budget.process_bytes - budget.predicted_process_bytes(chosen.predicted_peak_bytes)
    return MinIOCache(capacity_bytes=spare) if spare > 0 else None


def _batches(dataset: Dataset[Any], sampler: ResumableSampler, config: TrainConfig,
             epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor] | None]:
    """The epoch's batches from the sampler's position; None for one that skipped corrupt samples
    left with fewer than two (BatchNorm cannot train on one sample)."""
    # Workers draw their seeds from this generator, not from the global RNG the step uses.
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
    loader = DataLoader(dataset, batch_size=config.batch, sampler=sampler, num_workers=config.workers,
                        drop_last=True, generator=generator, persistent_workers=False,
                        collate_fn=collate_skip_corrupt, worker_init_fn=worker_dies_with_parent)
    for batch in loader:
        yield batch if batch is not None and len(batch[1]) >= 2 else None


def _optimizer(config: TrainConfig, model: nn.Module, stages: list[nn.Module]) -> TrainingOptimizer:
    """The run's optimizer: one over the model, or one per parameter stepped in the backward of ``stages``."""
    if not config.step_in_backward:
        return make_optimizer(config.optimizer, model.parameters(), config.lr)
    return StepInBackward(stages, lambda params: make_optimizer(config.optimizer, params, config.lr),
                          config.optimizer)


def _train_step(executor: Executor, model: nn.Module, optimizer: TrainingOptimizer, x: torch.Tensor,
                y: torch.Tensor, step: int, epoch: int, measure: bool) -> StepMetrics:
    start = time.perf_counter()
    peak = None
    if measure:
        with LiveBytesTracker() as tracker:
            tracker.register_training_state(model, optimizer, x, y)
            loss = _step(executor, optimizer, x, y)
        peak = tracker.peak_bytes
    else:
        loss = _step(executor, optimizer, x, y)
    elapsed = time.perf_counter() - start
    return StepMetrics(step=step, epoch=epoch, loss=loss, samples_per_s=len(y) / elapsed, time_s=elapsed,
                       peak_bytes=peak, process_peak_bytes=read_process_memory().peak_rss_bytes)


def _step(executor: Executor, optimizer: TrainingOptimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = executor.step(x, y)
    optimizer.step()
    return float(loss)


def _capture(step: int, epoch: int, model: nn.Module, optimizer: TrainingOptimizer, schedule: Schedule,
             sampler: ResumableSampler, consumed: int) -> TrainingState:
    return TrainingState.capture(step=step, epoch=epoch, model=model, optimizer=optimizer, schedule=schedule,
                                 sampler=sampler.state_dict(consumed=consumed))


class MetricsLog:
    """Append-only JSON lines, flushed per line so a crash loses at most the line being written.

    When TensorBoard is installed, every numeric field is also logged as a scalar under
    ``run_dir/tensorboard`` (x axis: the step).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.board: Any = None

    def __enter__(self) -> MetricsLog:
        self.file = self.path.open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return self
        self.board = SummaryWriter(str(self.path.parent / "tensorboard"))
        return self

    def append(self, record: dict[str, Any]) -> None:
        self.file.write(to_json(record) + "\n")
        self.file.flush()
        if self.board is not None:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)) and value is not None:
                    self.board.add_scalar(key, value, record["step"])

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        if self.board is not None:
            self.board.close()


def truncate_metrics(path: Path, resumed_at: tuple[int, int] | None) -> list[dict[str, Any]]:
    """Drop metrics written after the resumed state ``(step, epoch)`` was saved (all without one): those
    steps are about to run again. Returns the records kept.

    Step lines are numbered by the step they end; the evaluation of epoch ``e`` is written just
    before the state that starts epoch ``e + 1``, so it belongs to the resumed past iff
    ``e < state.epoch``.
    """
    if not path.exists():
        return []
    kept: list[tuple[str, dict[str, Any]]] = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the crash
            continue
        if resumed_at is None:
            continue
        step, epoch = resumed_at
        past = record["epoch"] < epoch if "val_accuracy" in record else record["step"] <= step
        if past:
            kept.append((line, record))
    write_atomic(path, "".join(line + "\n" for line, _ in kept))
    return [record for _, record in kept]
