"""``edgetrain train`` and ``edgetrain demo``: a training run within a memory budget, under a progress bar.

The main app registers these commands in :mod:`edgetrain.cli`; the library is imported inside each
command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ..units import format_bytes
from .common import (
    DeviceOpt,
    ModelArgOpt,
    OptimizerOpt,
    UpdateOpt,
    clean_errors,
    console,
    err_console,
    finite,
    memory_of,
    model_name,
    with_progress,
)

__all__ = ["train_command", "demo"]


@clean_errors
def train_command(
        model: str = typer.Option("resnet18", "--model", "-m", help="A model of the zoo, or your own as "
                                  "package.module:factory, a callable that returns it."),
        model_args: list[str] = ModelArgOpt,
        data: str = typer.Option("synthetic", "--data", help="'synthetic', an image folder or a CIFAR-10 folder."),
        samples: int = typer.Option(1000, "--samples", min=1, help="Size of the synthetic dataset."),
        batch: int = typer.Option(8, "--batch", "-b", min=1, help="Batch size."),
        image: int = typer.Option(64, "--image", "--size", min=1, help="Image side in pixels."),
        memory: str | None = typer.Option(None, "--memory", help="Budget for the whole training process as the "
                                          "kernel counts it (resident memory), e.g. 600MiB."),
        step_memory: str | None = typer.Option(None, "--step-memory", help="Budget for the step's tensors only "
                                               "(as `plan --memory`), not the process."),
        recompute: float | None = typer.Option(None, "--recompute", callback=finite("--recompute", 1),
                                               help="Largest recompute factor ρ >= 1."),
        device: str | None = DeviceOpt,
        strategy: str = typer.Option("auto", "--strategy", help="auto, uniform, revolve or optimal."),
        plan_file: Path | None = typer.Option(None, "--plan", help="Train from a plan made with `edgetrain plan "
                                              "... -o` (no profiling or planning here)."),
        page_dir: Path | None = typer.Option(None, "--page-dir", help="Where a paging schedule writes "
                                             "(an SD card, flash); default: a temp directory."),
        epochs: int = typer.Option(3, "--epochs", min=1, help="Passes over the training split."),
        optimizer: str = OptimizerOpt, update: str = UpdateOpt,
        lr: float | None = typer.Option(None, "--lr", callback=finite("--lr", above=0),
                                        help="Learning rate (default 0.01 SGD, 0.001 Adam)."),
        lr_schedule: str = typer.Option("constant", "--lr-schedule", help="constant, or cosine: from --lr down to "
                                        "0 at the run's last step."),
        workers: int = typer.Option(0, "--workers", min=0, help="DataLoader worker processes."),
        run_dir: Path = typer.Option(Path("runs/latest"), "--run-dir", help="Metrics, state and summary go here."),
        resume: bool = typer.Option(False, "--resume", help="Continue the run in --run-dir exactly (start it if "
                                    "there is none yet); refused if the settings differ from the run's."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run already in --run-dir."),
        replan: bool = typer.Option(False, "--replan", help="With --resume: plan again when the run's plan does "
                                    "not meet a changed --memory/--recompute (recorded in the metrics)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the data, the model and the order."),
        save_every: int = typer.Option(50, "--save-every", min=1, help="Save the training state every N steps."),
        skip_corrupt: bool = typer.Option(False, "--skip-corrupt", help="Skip and count unreadable samples."),
        step_in_backward: bool = typer.Option(False, "--step-in-backward", help="Update each parameter as soon "
                                              "as its gradient is made (one optimizer per parameter): the "
                                              "gradients never all live at once; planned so.")) -> None:
    """Train a model within a memory budget: plan, train with the plan, evaluate every epoch, save state."""
    from ..train import TrainConfig

    config = TrainConfig(model=model_name(model, model_args), data=data, samples=samples, batch=batch, image=image,
                         memory=memory,
                         step_memory=step_memory, recompute=recompute, device=device, strategy=strategy,
                         plan_file=plan_file, page_dir=page_dir, epochs=epochs, optimizer=optimizer,
                         lr=lr, lr_schedule=lr_schedule, workers=workers, run_dir=run_dir, resume=resume,
                         overwrite=overwrite, replan=replan,
                         seed=seed, save_every=save_every, skip_corrupt=skip_corrupt,
                         step_in_backward=step_in_backward, update=update)
    summary = _train_with_progress(config)
    _print_summary(summary, run_dir)


def _train_with_progress(config: Any) -> Any:
    """Train under a progress bar on stderr, shown from the first step (a refusal stays one line)."""
    from rich.progress import TimeRemainingColumn

    from ..train import train

    columns = (TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[rate]:.1f} samples/s"),
               TextColumn("peak {task.fields[peak]} (process {task.fields[process]})"), TimeRemainingColumn())
    bar = Progress(*columns, console=err_console)
    task = bar.add_task("train", total=None, epoch=0, loss=float("nan"), rate=0.0, peak="?", process="?")
    peak = {"bytes": 0}

    def on_step(metrics: Any, total: int) -> None:
        if not bar.live.is_started:
            bar.start()
        peak["bytes"] = max(peak["bytes"], metrics.peak_bytes or 0)
        bar.update(task, completed=metrics.step, total=total, epoch=metrics.epoch, loss=metrics.loss,
                   rate=metrics.samples_per_s, peak=format_bytes(peak["bytes"]) if peak["bytes"] else "?",
                   process=format_bytes(metrics.process_peak_bytes))

    try:
        return train(config, progress=on_step)
    finally:
        if bar.live.is_started:
            bar.stop()


def _print_summary(summary: Any, run_dir: Path) -> None:
    budget = "no budget" if summary.budget_bytes is None else f"budget {format_bytes(summary.budget_bytes)}"
    accuracy = "-" if summary.accuracy is None else f"{summary.accuracy:.3f}"
    val_loss = "-" if summary.val_loss is None else f"{summary.val_loss:.4f}"
    measured = "-" if summary.measured_peak_bytes is None else format_bytes(summary.measured_peak_bytes)
    if summary.update_choice is not None:
        console.print(summary.update_choice)
    console.print(f"accuracy {accuracy} (chance {summary.chance_accuracy:.3f}), val loss {val_loss}")
    console.print(f"process peak {format_bytes(summary.process_peak_bytes)} vs {budget} (predicted "
                  f"{format_bytes(summary.predicted_process_peak_bytes)}; runtime baseline "
                  f"{format_bytes(summary.runtime_baseline_bytes)})")
    tracked = ("" if summary.predicted_tracked_peak_bytes is None else
               f"{format_bytes(summary.predicted_tracked_peak_bytes)} in tensors, ")
    console.print(f"tensor peak {measured} (predicted {tracked}{format_bytes(summary.predicted_peak_bytes)} with the "
                  f"kernels' scratch); "
                  f"plan {summary.strategy}, "
                  f"ρ = {summary.recompute_factor:.3f}; {summary.steps} steps in {summary.wall_time_s:.1f} s")
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}, summary: {run_dir / 'summary.json'}")


@clean_errors
def demo(out: Path = typer.Option(Path("out/demo"), "--out", "-o", help="Where results are written."),
         samples: int = typer.Option(800, "--samples", min=1, help="Size of the generated dataset (train + val)."),
         epochs: int = typer.Option(3, "--epochs", min=1, help="Training epochs."),
         seed: int = typer.Option(0, "--seed", help="Seed of the data, the model and the order.")) -> None:
    """The main job on built-in defaults: what fits the Waggle node, then a real training run under a squeezed budget.

    Its budget: the squeeze the node puts on ResNet-50 at batch 8 and 500 px, or 10% above the least step if tighter.

    It writes the node-fit table, the run's metrics, summary and plan, and a figure (library: edgetrain.reports.demo).
    """
    import torch

    from ..reports import demo as lib

    settings = lib.DemoSettings(samples=samples, epochs=epochs, seed=seed)
    lib.check_settings(settings)
    threads, cores, load = lib.choose_threads()
    torch.set_num_threads(threads)
    console.rule(f"1. Does training fit the Waggle node's ODROID XU4 ({format_bytes(memory_of(lib.NODE))})?")
    node = with_progress("estimating", lambda progress: lib.fit_on_node(out, progress))
    _print_node_fit(node.rows)

    squeeze = lib.squeeze_for(node.squeeze, settings)
    budget, plain, least = squeeze.budget_bytes, squeeze.plain_peak_bytes, squeeze.least_peak_bytes
    console.rule(f"2. Train {settings.model} with its step's tensors within {format_bytes(budget)}")
    train_images, held_out = lib.split_sizes(settings)
    console.print(f"{settings.model}, batch {settings.batch}, {settings.image} px, {settings.epochs} epochs on "
                  f"{train_images} generated images of {settings.classes} classes (a shape in a colour each), "
                  f"{held_out} more held out; {settings.optimizer} at {settings.lr}, cosine to 0; {threads} of "
                  f"{cores} cores (load {load:.1f}).")
    why = (f"{node.squeeze:.2f} of it" if budget == int(plain * node.squeeze) else
           f"{node.squeeze:.2f} of it would be below the least step any schedule reaches ({least / plain:.2f}), so "
           f"10% above that: {budget / plain:.2f}")
    console.print(f"Plain training's step needs {format_bytes(plain)} of tensors. The node leaves ResNet-50 at batch "
                  f"8 and 500 px {node.squeeze:.2f} of what it needs beside the runtime; the same squeeze here: {why}. "
                  f"Plain training does not fit; the planner's schedule does.")
    config = lib.prepare_run(out, squeeze, settings)
    run = lib.summarise(config, _train_with_progress(config))
    summary = run.summary
    table = Table()
    for column in ("epoch", "training loss", "held-out loss", "held-out accuracy"):
        table.add_column(column, justify="right")
    for e in run.epochs:
        table.add_row(str(e.epoch + 1), f"{e.train_loss:.4f}", "-" if e.val_loss is None else f"{e.val_loss:.4f}",
                      "-" if e.val_accuracy is None else f"{e.val_accuracy:.3f}")
    console.print(table)
    first, last = run.epochs[0], run.epochs[-1]
    if last.val_accuracy is not None and last.val_loss is not None and first.val_loss is not None:
        console.print(f"held-out accuracy {last.val_accuracy:.3f} (chance {summary.chance_accuracy:.3f}); held-out "
                      f"loss {last.val_loss:.4f}, {'down' if run.learnt else 'not down'} from {first.val_loss:.4f} "
                      f"after the first epoch; {summary.steps} steps in {summary.wall_time_s:.1f} s")
        console.print("(held out = evaluated in eval mode, on BatchNorm's running statistics: they trail the weights "
                      "while the rate is high, so the first epoch scores low; the decaying rate lets them settle)")

    console.rule("3. Did the budget hold?")
    measured, tracked = summary.measured_peak_bytes, summary.predicted_tracked_peak_bytes
    if measured is not None:
        console.print(f"the step's tensors: measured peak {format_bytes(measured)}, "
                      f"{'within' if measured <= budget else 'OVER'} the budget {format_bytes(budget)} (plain "
                      f"training: {format_bytes(plain)}); the plan ({summary.strategy}, ρ = "
                      f"{summary.recompute_factor:.3f}) predicted "
                      + ("" if tracked is None else f"{format_bytes(tracked)} in tensors, ")
                      + f"{format_bytes(summary.predicted_peak_bytes)} with the kernels' scratch")
    process = summary.process_peak_bytes
    console.print(f"the process as the kernel counts it (VmHWM): peak {format_bytes(process)}, "
                  f"{'within' if process <= run.process_budget_bytes else 'OVER'} the "
                  f"{format_bytes(run.process_budget_bytes)} the step budget stands for (predicted: "
                  f"{format_bytes(summary.predicted_process_peak_bytes)}) = runtime baseline "
                  f"{format_bytes(summary.runtime_baseline_bytes)} + 16 MiB + 1.10 x the step budget. The baseline is "
                  f"this run's, measured with its model, data and kernels up (the table's is a small probe's).")

    figure = lib.write_figure(out / lib.FIGURE_FILE, squeeze, run, settings.classes)
    console.rule("4. The figure")
    console.print(f"{figure}: left, the loss of every step and of every epoch, held-out loss and accuracy; right, "
                  f"the memory over one step, plain training against the plan, and the budget")
    console.rule("5. Where everything is")
    files = lib.files_of(node, run, figure)
    for name, what in (("node_fit", "the node-fit table"), ("metrics", "every step and epoch of the run"),
                       ("summary", "the run's summary"), ("plan", "the schedule it ran"), ("figure", "the figure")):
        console.print(f"{what + ':':33} {files[name]}")


def _print_node_fit(rows: list[dict[str, Any]]) -> None:
    """The node-fit table (:func:`~edgetrain.reports.node_fit.node_fit_rows`): plain step and process, any plan."""
    baseline, usable = rows[0]["runtime_baseline_bytes"], rows[0]["os_memory_known"]
    table = Table(caption=f"process = runtime baseline {format_bytes(baseline)} (measured here) + step + cushion; "
                          + ("usable memory" if usable else
                             "the node's RAM: an upper bound, its OS's share is unknown"))
    for column in ("model", "batch", "image", "plain step", "plain process", "fits", "with plan", "ρ"):
        table.add_column(column, justify="right")
    for row in rows:
        planned, factor = "-", "-"
        if "plan" in row and row["plan"].get("feasible", True):
            planned = format_bytes(row["plan"]["predicted_process_bytes"])
            factor = f"{row['plan']['recompute_factor']:.3f}"
        elif "plan" in row:
            planned = f"no (needs {format_bytes(row['plan']['minimum_process_bytes'])})"
        table.add_row(row["model"], str(row["batch"]), str(row["size"]), format_bytes(row["total_bytes"]),
                      format_bytes(row["predicted_process_bytes"]), "[green]yes[/]" if row["fits"] else "[red]no[/]",
                      planned, factor)
    Console(width=max(console.width, 120)).print(table)
