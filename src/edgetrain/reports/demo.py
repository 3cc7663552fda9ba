"""``edgetrain demo``: what fits the Waggle node, then a real training run under a squeezed budget, shown.

The demo in four parts, each a function returning plain data (the command line only prints):

1. :func:`fit_on_node`: the node-fit table (:func:`~edgetrain.reports.node_fit.node_fit_rows`) for the
   Waggle node's ODROID XU4, and the squeeze it puts on ResNet-50 at batch 8 and 500 px: the share of
   what plain training needs that the node leaves beside the runtime;
2. :func:`squeeze_for`: the demo model's step profiled here, and a budget for its tensors at that
   squeeze (or 10% above the least step any schedule reaches, where the squeeze is tighter): plain
   training does not fit it, the planner's schedule does;
3. :func:`prepare_run` and :func:`summarise`: the training run itself is :func:`edgetrain.train.train`
   on that budget, then its per-epoch figures are read back from ``metrics.jsonl``;
4. :func:`write_figure`: ``demo.png``, the loss curves and the memory over one step of the plan and of
   plain training against the budget.

:func:`run` does all four; NOTE [ The demo's task ] says why the run's settings are what they are.

NOTE [ The demo's task ]
The run must show a model that has learnt, measured as any run is (eval mode, held-out split),
within about a minute of training on an idle 2-core machine. Measured here (the training loop,
one thread; held-out accuracy after the last epoch):

* The model: MobileNetV2 at 48 px, whose squeeze is the tightest the planner meets (many small
  stages), at batch 16. The demo pins the allocator as a process budget does (see
  :func:`prepare_run`), which costs a batch-32 step 1.7x (0.52 -> 0.89 s) and a batch-16 step
  1.25x (0.36 -> 0.45 s): batch 16 takes more steps in the same time, and steps are what it needs.
* The classes: the generated dataset's first 8, each one shape in a colour no other class has.
  With 10 (``--data synthetic``'s default) classes 8 and 9 repeat the colours of 1 and 2 with
  another shape, and 150 steps of 32 left them confused: 0.86-0.91 whatever the rate.
* The rate: SGD with momentum 0.9 at 0.015, cosine to 0 over the run. The former demo (batch 32,
  10 classes, 0.05, constant) ended at held-out loss 12-18 and accuracy 0.3: the weights moved so
  fast that BatchNorm's running statistics (momentum 0.1: about the last 10 batches), which eval
  mode uses, trailed them; the same weights scored loss 0.7 on batch statistics. The decay lets
  the statistics settle on the final weights. 800 samples over 3 epochs (120 steps of 16): at
  0.015 seeds 0-4 gave 0.981, 0.944, 0.963, 0.944, 0.988; seeds 0-2 at 0.01 0.969, 0.919, 0.931,
  at 0.02 0.869, 0.944, 0.950; Adam at 1e-3 and 2e-3 0.74-0.88.

The planned run's figures equal plain training's (seed 0: the same held-out losses to the last
digit with and without the budget): the executor's gradients are plain backprop's.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sysutil.fileio import read_jsonl, write_json

if TYPE_CHECKING:
    from ..core.chain import Chain
    from ..core.schedule import Schedule
    from ..train import TrainConfig, TrainSummary
    from ..train.loop import ProgressFn

__all__ = ["DemoSettings", "NodeFit", "Squeeze", "EpochFigures", "DemoRun", "DemoResult", "NODE", "FIGURE_FILE",
           "NODE_FIT_FILE", "choose_threads", "fit_on_node", "squeeze_for", "split_sizes", "check_settings",
           "prepare_run", "summarise", "write_figure", "files_of", "run"]

NODE = "odroid-xu4"
NODE_FIT_FILE = "node_fit.json"
FIGURE_FILE = "demo.png"
_VAL_FRACTION = 0.2     # held out of each class (generate_synthetic's default)
_LEAST_MARGIN = 1.10   # the budget's floor: 10% above the least step, where the node's squeeze is tighter


@dataclass(frozen=True)
class DemoSettings:
    """The demo run (NOTE [ The demo's task ]): model, batch, image side, generated samples (train + val),
    classes, epochs, optimizer and its rate (``lr_schedule``: cosine to 0), seed."""

    model: str = "mobilenet_v2"
    batch: int = 16
    image: int = 48
    samples: int = 800
    classes: int = 8
    epochs: int = 3
    optimizer: str = "sgd"
    lr: float = 0.015
    lr_schedule: str = "cosine"
    seed: int = 0


@dataclass(frozen=True)
class NodeFit:
    """Part 1: the node-fit rows (as written to ``path``) and the squeeze of the ``DEMO_SQUEEZE`` row."""

    rows: list[dict[str, Any]]
    squeeze: float
    path: Path


@dataclass(frozen=True)
class Squeeze:
    """Part 2: the demo step's plain peak, least peak and budget (tensor bytes, kernels' scratch included),
    with the chain profiled here (``chain``, not serialised)."""

    model: str
    batch: int
    image: int
    squeeze: float
    plain_peak_bytes: int
    least_peak_bytes: int
    budget_bytes: int
    chain: Chain = field(repr=False, compare=False)


@dataclass(frozen=True)
class EpochFigures:
    """One epoch of the run: the mean training loss of its steps, and the held-out loss and accuracy after it."""

    epoch: int
    train_loss: float
    val_loss: float | None
    val_accuracy: float | None


@dataclass(frozen=True)
class DemoRun:
    """Part 3: the run's summary, its epochs, its steps' losses, and the process figures beside it.

    ``process_budget_bytes`` is the process budget the step budget stands for (NOTE [ Process budget ]):
    the run's measured runtime baseline + the cushion + 1.10 x the budget; ``summary.process_peak_bytes`` is
    the kernel's count (VmHWM) over training.
    """

    summary: TrainSummary
    epochs: list[EpochFigures]
    step_losses: list[tuple[int, float]]
    steps_per_epoch: int
    process_budget_bytes: int
    run_dir: Path
    schedule: Schedule = field(repr=False, compare=False)

    @property
    def learnt(self) -> bool:
        """Whether the last epoch's held-out loss is below the first's."""
        first, last = self.epochs[0].val_loss, self.epochs[-1].val_loss
        return first is not None and last is not None and last < first


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run` returns: every part, the threads the run used, and where each file is."""

    node_fit: NodeFit
    squeeze: Squeeze
    run: DemoRun
    threads: int
    files: dict[str, Path]


def choose_threads() -> tuple[int, int, float]:
    """``(threads, cores, load)``: the intra-op threads for the run, the cores this process may use, and
    the last minute's load average.

    The cores the load leaves idle, at least one, at most PyTorch's default. OpenMP's threads wait for
    one another at every op: on a core another process holds, a MobileNetV2 step at 48 px took 7.2 s
    with two threads where one thread took 0.47 s (2 cores, another process busy on one of them).
    """
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    idle = math.floor(cores - load + 0.5)
    return max(1, min(torch.get_num_threads(), idle)), cores, load


def fit_on_node(out: Path, progress: Callable[[int, int], None] | None = None,
                configs: tuple[tuple[str, int, int], ...] | None = None) -> NodeFit:
    """Part 1: the node-fit rows for the Waggle node, written to ``out / node_fit.json``.

    ``configs``: the rows' ``(model, batch, image)`` (default ``NODE_FIT_CONFIGS``); ``DEMO_SQUEEZE`` must be one.
    """
    from ..devices import get_device
    from .node_fit import DEMO_SQUEEZE, NODE_FIT_CONFIGS, node_fit_rows

    rows = node_fit_rows(get_device(NODE), progress, NODE_FIT_CONFIGS if configs is None else configs)
    out.mkdir(parents=True, exist_ok=True)
    path = write_json(out / NODE_FIT_FILE, rows)
    squeezed = next(r for r in rows if (r["model"], r["batch"], r["size"]) == DEMO_SQUEEZE)
    squeeze = (squeezed["capacity_bytes"] - squeezed["runtime_baseline_bytes"]) / squeezed["predicted_process_bytes"]
    return NodeFit(rows=rows, squeeze=squeeze, path=path)


def squeeze_for(squeeze: float, settings: DemoSettings = DemoSettings()) -> Squeeze:
    """Part 2: the budget for the demo step's tensors: ``squeeze`` of plain training's peak, or 10% above the
    least step where that is tighter.

    The step is profiled on real tensors, as the run will be: its kernels' scratch (NOTE [ A kernel's
    scratch in the plan ]) raises the least step above the meta device's estimate.
    """
    from ..core.schedule import keep_all
    from ..core.simulator import simulate
    from ..planners.choose import least_step_bytes
    from ..profiling import chain_for

    chain = chain_for(settings.model, settings.batch, settings.image, optimizer=settings.optimizer,
                      num_classes=settings.classes, device="cpu")
    plain, least = simulate(chain, keep_all(chain.length)).peak_bytes, least_step_bytes(chain)
    budget = max(int(plain * squeeze), int(least * _LEAST_MARGIN))
    return Squeeze(model=settings.model, batch=settings.batch, image=settings.image, squeeze=squeeze,
                   plain_peak_bytes=plain, least_peak_bytes=least, budget_bytes=budget, chain=chain)


def split_sizes(settings: DemoSettings) -> tuple[int, int]:
    """The training and held-out images of the generated dataset of ``settings`` (20% of each class held out)."""
    from ..data.generated import stratified_split

    split = stratified_split(settings.samples, settings.classes, settings.seed, _VAL_FRACTION)
    return len(split["train"]), len(split["val"])


def check_settings(settings: DemoSettings) -> None:
    """Refuse, before any work, a dataset too small for a batch to train on and an image held out.

    Raises:
        EdgetrainError: naming the least ``samples`` that works.
    """
    from ..errors import EdgetrainError

    if not _trainable(settings):
        train, val = split_sizes(settings)
        least = next(n for n in itertools.count(settings.samples) if _trainable(replace(settings, samples=n)))
        raise EdgetrainError(f"--samples {settings.samples} gives {train} images to train on and {val} held out: "
                             f"the demo needs a batch of {settings.batch} and one held out; give at least {least}")


def _trainable(settings: DemoSettings) -> bool:
    """Whether the split of ``settings`` holds a batch to train on and an image held out."""
    train, val = split_sizes(settings)
    return train >= settings.batch and val > 0


def prepare_run(out: Path, squeeze: Squeeze, settings: DemoSettings = DemoSettings()) -> TrainConfig:
    """Part 3's settings: the generated dataset of ``settings`` (written under ``out / data``), the step budget
    of ``squeeze``, the run in ``out / run`` (replaced if there is one).

    The allocator is pinned for this process, as a process budget (``train --memory``) pins it (NOTE [ Returning
    freed memory ]): the demo holds its process to what the step budget stands for, and glibc's default would
    keep freed activations resident (a process peak ~20 MiB above the prediction here, for ~10-20% less step time).
    """
    from ..data import generate_synthetic
    from ..profiling.process import configure_allocator
    from ..train import TrainConfig

    check_settings(settings)
    data = generate_synthetic(out / "data" / f"synthetic-c{settings.classes}-px{settings.image}-n{settings.samples}"
                              f"-seed{settings.seed}-png", samples=settings.samples, image_size=settings.image,
                              classes=settings.classes, seed=settings.seed, val_fraction=_VAL_FRACTION)
    configure_allocator()
    return TrainConfig(model=settings.model, data=str(data), batch=settings.batch, image=settings.image,
                       step_memory=squeeze.budget_bytes, epochs=settings.epochs, optimizer=settings.optimizer,
                       lr=settings.lr, lr_schedule=settings.lr_schedule, seed=settings.seed, run_dir=out / "run",
                       overwrite=True)


def summarise(config: TrainConfig, summary: TrainSummary) -> DemoRun:
    """Part 3's figures, read back from the run directory: epochs, step losses, the schedule it ran."""
    from ..core.schedule import Schedule
    from ..train.budget import ProcessBudget
    from ..train.rundir import METRICS_FILE, PLAN_FILE

    records = read_jsonl(config.run_dir / METRICS_FILE)
    steps = [r for r in records if "loss" in r and "val_accuracy" not in r]
    epochs = []
    for record in (r for r in records if "val_accuracy" in r):
        losses = [s["loss"] for s in steps if s["epoch"] == record["epoch"]]
        epochs.append(EpochFigures(epoch=record["epoch"], train_loss=sum(losses) / max(len(losses), 1),
                                   val_loss=record["val_loss"], val_accuracy=record["val_accuracy"]))
    schedule = Schedule.from_dict(json.loads((config.run_dir / PLAN_FILE).read_text())["schedule"])
    assert summary.tensor_budget_bytes is not None   # the demo's run has a step budget
    process_budget = ProcessBudget(0, summary.runtime_baseline_bytes).predicted_process_bytes(
        summary.tensor_budget_bytes)
    return DemoRun(summary=summary, epochs=epochs, step_losses=[(s["step"], s["loss"]) for s in steps],
                   steps_per_epoch=summary.train_samples // config.batch, process_budget_bytes=process_budget,
                   run_dir=config.run_dir, schedule=schedule)


def _step_memory(chain: Chain, schedule: Schedule) -> list[int]:
    """The step's simulated RAM at every op of ``schedule`` (:func:`~edgetrain.core.simulator.memory_timeline`), then
    at the optimizer step, which :func:`~edgetrain.core.simulator.simulate` also counts."""
    from ..core.simulator import memory_timeline

    return ([m.transient_bytes for m in memory_timeline(chain, schedule)]
            + [chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes])


def write_figure(path: Path, squeeze: Squeeze, demo: DemoRun, classes: int) -> Path:
    """Part 4: ``path`` (a PNG): the run's losses and accuracy per epoch, and the memory over one step of
    plain training and of the plan against the budget.

    Raises:
        EdgetrainError: matplotlib is not installed (the ``reports`` extra).
    """
    from ..core.schedule import keep_all
    from ..errors import EdgetrainError

    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plotting needs matplotlib: pip install 'edgetrain[reports]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, mib = demo.summary, 2**20
    fig, (learn, memory) = plt.subplots(1, 2, figsize=(13, 5.4))

    per_epoch = max(demo.steps_per_epoch, 1)
    learn.plot([s / per_epoch for s, _ in demo.step_losses], [loss for _, loss in demo.step_losses],
               color="tab:blue", alpha=0.35, linewidth=1, label="training loss, each step")
    ends = [e.epoch + 1 for e in demo.epochs]
    learn.plot([e.epoch + 0.5 for e in demo.epochs], [e.train_loss for e in demo.epochs], color="tab:blue",
               marker="o", label="training loss, epoch mean")
    learn.plot(ends, [e.val_loss for e in demo.epochs], color="tab:orange", marker="s", label="held-out loss")
    final = demo.epochs[-1].val_accuracy
    learn.set(xlabel="epoch", ylabel="cross-entropy", ylim=(0, None), xlim=(0, len(demo.epochs) + 0.05),
              title=f"{squeeze.model} on {classes} generated classes"
                    + ("" if final is None else f": held-out accuracy {final:.3f}"))
    learn.set_xticks(range(len(demo.epochs) + 1))
    accuracy = learn.twinx()
    accuracy.plot(ends, [e.val_accuracy for e in demo.epochs], color="tab:green", marker="^",
                  label="held-out accuracy")
    accuracy.axhline(summary.chance_accuracy, color="tab:green", linestyle=":", linewidth=1, label="chance")
    accuracy.set(ylabel="held-out accuracy", ylim=(0, 1.02))
    handles = learn.get_legend_handles_labels()[0] + accuracy.get_legend_handles_labels()[0]
    learn.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8)
    learn.grid(True, alpha=0.3)

    plain = _step_memory(squeeze.chain, keep_all(squeeze.chain.length))
    planned = _step_memory(squeeze.chain, demo.schedule)
    memory.plot(range(len(plain)), [b / mib for b in plain], color="tab:red",
                label=f"plain training: peak {max(plain) / mib:.2f} MiB")
    memory.plot(range(len(planned)), [b / mib for b in planned], color="tab:blue",
                label=f"the plan ({summary.strategy}, ρ = {summary.recompute_factor:.2f}): peak "
                      f"{summary.predicted_peak_bytes / mib:.2f} MiB")
    memory.axhline(squeeze.budget_bytes / mib, color="black", linestyle="--", linewidth=1.2,
                   label=f"budget {squeeze.budget_bytes / mib:.2f} MiB")
    if summary.measured_peak_bytes is not None:
        memory.axhline(summary.measured_peak_bytes / mib, color="tab:blue", linestyle=":", linewidth=1,
                       label=f"measured in training: {summary.measured_peak_bytes / mib:.2f} MiB (tensors only)")
    memory.set(xlabel="op of one training step (forwards, recomputations, backwards; last: optimizer step)",
               ylabel="step memory (MiB)", ylim=(0, max(plain) / mib * 1.45),
               title=f"Memory over one step: batch {squeeze.batch}, {squeeze.image} px")
    memory.legend(loc="upper right", fontsize=8)
    memory.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(out: Path, settings: DemoSettings = DemoSettings(), *, progress: ProgressFn | None = None,
        node_progress: Callable[[int, int], None] | None = None,
        node_configs: tuple[tuple[str, int, int], ...] | None = None) -> DemoResult:
    """The whole demo into ``out``: node fit (of ``node_configs``, see :func:`fit_on_node`), squeeze, training
    run, figure; PyTorch's thread count is :func:`choose_threads`'s during the run and restored after.

    Returns:
        every part, and ``files``: ``node_fit``, ``metrics``, ``summary``, ``plan`` and ``figure`` paths.
    """
    import torch

    from ..train import train

    check_settings(settings)
    before = torch.get_num_threads()
    threads = choose_threads()[0]
    torch.set_num_threads(threads)
    try:
        node = fit_on_node(out, node_progress, node_configs)
        squeeze = squeeze_for(node.squeeze, settings)
        config = prepare_run(out, squeeze, settings)
        demo = summarise(config, train(config, progress=progress))
    finally:
        torch.set_num_threads(before)
    figure = write_figure(out / FIGURE_FILE, squeeze, demo, settings.classes)
    return DemoResult(node_fit=node, squeeze=squeeze, run=demo, threads=threads,
                      files=files_of(node, demo, figure))


def files_of(node: NodeFit, demo: DemoRun, figure: Path) -> dict[str, Path]:
    """Where the demo's files are: ``node_fit``, ``metrics``, ``summary``, ``plan``, ``figure``."""
    from ..train.rundir import METRICS_FILE, PLAN_FILE, SUMMARY_FILE

    return {"node_fit": node.path, "metrics": demo.run_dir / METRICS_FILE, "summary": demo.run_dir / SUMMARY_FILE,
            "plan": demo.run_dir / PLAN_FILE, "figure": figure}
