"""``edgetrain bench``: systems measurements on this machine (batch sweep, data stalls, the device's figures,
hardware counters, the versioned training profile).

The main app registers ``bench_app`` in :mod:`edgetrain.cli`; the library is imported inside each
command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import EdgetrainError
from ..sysutil.fileio import to_json, write_atomic, write_json
from ..units import format_bytes
from .common import ModelOpt, SizeOpt, clean_errors, console, err_console, finite, memory_of, with_progress

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Systems measurements on this machine.", no_args_is_help=True)
T = TypeVar("T")


def _with_phases(work: Callable[[Callable[[str, int, int], None]], T]) -> T:
    """Run ``work(progress)`` under a progress bar on stderr; ``progress(phase, done, total)`` names and advances it."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None, visible=False)
        return work(lambda phase, done, total: bar.update(task, description=phase, completed=done, total=total,
                                                          visible=True))


@bench_app.command("batch")
@clean_errors
def bench_batch(model: str = ModelOpt, image: int = SizeOpt,
                device: str = typer.Option("odroid-xu4", "--device", "-d", help="Whose memory is the budget."),
                memory: str | None = typer.Option(None, "--memory", help="Budget instead of the device's memory."),
                max_run_batch: int = typer.Option(64, "--max-run-batch", min=1,
                                                  help="Largest batch actually run here."),
                reps: int = typer.Option(3, "--reps", min=1, help="Timed steps per run (median)."),
                runs: int = typer.Option(3, "--runs", min=1, help="Separate runs per point (median and range)."),
                largest_on: str = typer.Option(
                    "", "--largest-on", help="Devices, comma-separated (e.g. rpi4): the largest batch whose whole "
                    "training process fits each, for the model and its CIFAR-stem variant, beside published ones."),
                out: Path = typer.Option(Path("out/bench_batch"), "--out", "-o", help="Output directory."),
                as_json: bool = typer.Option(False, "--json", help="Print the sweep as JSON.")) -> None:
    """Throughput and peak memory vs batch size, with and without planning, and the largest batch that fits."""
    from ..devices import get_device
    from ..reports.batch_sweep import largest_batches_by_device, plot_sweep, sweep_batches
    from ..train.budget import device_tensor_budget
    from ..units import parse_bytes

    budget = parse_bytes(memory) if memory is not None else memory_of(device)
    targets = [get_device(name.strip()) for name in largest_on.split(",") if name.strip()]
    sweep = with_progress("batch sizes", lambda progress: sweep_batches(
        model, image, budget, max_run_batch=max_run_batch, reps=reps, runs=runs, progress=progress))
    variants = ("resnet18", "resnet18_cifar") if model in ("resnet18", "resnet18_cifar") else (model,)
    largest = with_progress("largest batch per device", lambda _: largest_batches_by_device(
        variants, image, {t.name: device_tensor_budget(t) for t in targets})) if targets else []
    report = {**sweep.to_dict(), "largest_by_device": [dataclasses.asdict(row) for row in largest]}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "bench_batch.json", json.dumps(report, indent=1))
    plot_sweep(sweep, out / "bench_batch.png")
    if as_json:
        typer.echo(json.dumps(report))
        return
    table = Table(title=f"{model} at {image} px, budget {format_bytes(budget)}")
    for column in ("batch", "plain peak", "planned peak", "ρ", f"plain samples/s (median, min-max of {runs} runs)",
                   "planned samples/s"):
        table.add_column(column, justify="right")
    for p in sweep.points:
        table.add_row(str(p.batch), format_bytes(p.plain_peak_bytes),
                      "-" if p.planned_peak_bytes is None else format_bytes(p.planned_peak_bytes),
                      "-" if p.planned_recompute_factor is None else f"{p.planned_recompute_factor:.3f}",
                      _rate_spread(p.plain_runs_samples_per_s), _rate_spread(p.planned_runs_samples_per_s))
    console.print(table)
    for row in largest:
        paper = "" if row.paper_batch is None else f"; published: {row.paper_batch} ({row.paper_source})"
        console.print(f"{row.model} at {row.image} px on {row.device} (step budget {format_bytes(row.budget_bytes)} = "
                      f"memory less the runtime baseline measured here and a cushion): largest batch plain "
                      f"{row.largest_plain_batch}, with planning {row.largest_planned_batch}{paper}")
    console.print(f"largest batch within {format_bytes(budget)}: plain {sweep.largest_plain_batch}, "
                  f"with planning {sweep.largest_planned_batch}; wrote {out / 'bench_batch.json'} and "
                  f"{out / 'bench_batch.png'}")


def _rate_spread(runs: tuple[float, ...] | None) -> str:
    """'median (min-max)' of per-run throughputs, or '-' when not run."""
    if runs is None:
        return "-"
    return f"{statistics.median(runs):.1f} ({min(runs):.1f}-{max(runs):.1f})"


@bench_app.command("data")
@clean_errors
def bench_data(model: str = typer.Option("resnet18", "--model", "-m", help="Model whose step is the compute."),
               data: str = typer.Option("synthetic", "--data", help="'synthetic' or a dataset folder."),
               samples: int = typer.Option(512, "--samples", min=1, help="Size of the synthetic dataset."),
               image: int = typer.Option(64, "--image", "--size", min=1, help="Image side in pixels."),
               batch: int = typer.Option(16, "--batch", "-b", min=1, help="Batch size."),
               workers: str = typer.Option("0,1,2", "--workers", help="Loader worker counts to try, e.g. 0,1,2."),
               batches: int = typer.Option(10, "--batches", min=1, help="Timed batches per run (median)."),
               device: str | None = typer.Option(None, "--device", "-d",
                                                 help="Emulate this device's storage read bandwidth."),
               data_root: Path = typer.Option(Path("out/data"), "--data-root", help="Where synthetic data goes."),
               as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Data-stall analysis: fetch / pre-process / compute per batch for 0..N loader workers."""
    from ..data import analyze_stalls, make_step_fn, open_dataset, stall_table
    from ..devices import get_device
    from ..models import check_input, get_model_spec

    try:
        counts = tuple(int(w) for w in workers.split(","))
    except ValueError:
        raise EdgetrainError(f"--workers takes comma-separated integers, got {workers!r}") from None
    spec = get_model_spec(model)
    check_input(spec, batch, image)
    train_set, _, classes = open_dataset(data, image_size=image, samples=samples, root=data_root,
                                         vocab_size=spec.vocab_size)
    net = spec.build(classes)
    read_bps = get_device(device).storage_read_bps if device else None
    report = with_progress("worker counts", lambda progress: analyze_stalls(
        make_step_fn(net), train_set, batch, workers=counts, batches=batches, read_bps=read_bps))
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        Console(width=max(console.width, 140)).print(stall_table(report))


@bench_app.command("device")
@clean_errors
def bench_device(
        name: str = typer.Option("this-board", "--name", help="The device's name in the file, e.g. odroid-xu4 "
                                 "(a shipped name is replaced wherever the file is used)."),
        page_dir: Path = typer.Option(Path("."), "--page-dir", help="Directory on the storage paging will use "
                                      "(e.g. the SD card)."),
        sizes: str = typer.Option("4KiB,256KiB,4MiB,32MiB", "--sizes", help="Transfer sizes, comma-separated."),
        repeats: int = typer.Option(3, "--repeats", min=1, help="Transfers per size and direction."),
        model: str = typer.Option("resnet18", "--model", "-m", help="Model whose training step measures compute."),
        batch: int = typer.Option(8, "--batch", "-b", min=1, help="Batch size of that step."),
        image: int = typer.Option(64, "--image", "--size", min=1, help="Image side in pixels (sequence length)."),
        steps: int = typer.Option(5, "--steps", min=1, help="Timed training steps (median)."),
        gemm_seconds: float = typer.Option(3.0, "--gemm-seconds", callback=finite("--gemm-seconds", above=0),
                                           help="Seconds of the sustained FP64 DGEMM probe (the time model's rate)."),
        skip_storage: bool = typer.Option(False, "--skip-storage", help="Do not measure paging."),
        skip_compute: bool = typer.Option(False, "--skip-compute", help="Do not measure the compute rate."),
        compute_power_w: float | None = typer.Option(None, "--compute-power-w",
                                                     callback=finite("--compute-power-w", above=0),
                                                        help="Power while training, W."),
        pagein_power_w: float | None = typer.Option(None, "--pagein-power-w",
                                                    callback=finite("--pagein-power-w", above=0),
                                                       help="Power while paging in, W."),
        pageout_power_w: float | None = typer.Option(None, "--pageout-power-w",
                                                     callback=finite("--pageout-power-w", above=0),
                                                        help="Power while paging out, W."),
        power_source: str | None = typer.Option(None, "--power-source",
                                                help="What measured the powers, e.g. 'USB meter, load minus idle'."),
        power_sensor: list[str] | None = typer.Option(
            None, "--power-sensor", help="Measure the powers from a sysfs power monitor: PATH (mW) or VOLTS*AMPS "
            "(mV x mA), optionally @SCALE (W per unit); repeat to sum rails."),
        idle_s: float = typer.Option(2.0, "--idle-s", callback=finite("--idle-s", 0),
                                     help="Seconds of idle sampled before, subtracted from powers."),
        whole_power: bool = typer.Option(False, "--whole-power", help="Record whole sensor readings, idle included."),
        output: Path = typer.Option(Path("out/device/devices.toml"), "--output", "-o",
                                    help="Device file to write (an existing one keeps its other devices)."),
        as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON.")) -> None:
    """Measure this machine's energy-profile figures (paging, compute rate) into a device file."""
    from ..devices.catalog import ENERGY_FIELDS, RATE_FIELDS
    from ..profiling.device_probe import POWER_FIELDS, measure_device
    from ..units import parse_bytes

    sizes_bytes = [parse_bytes(part.strip()) for part in sizes.split(",") if part.strip()]
    given = dict(zip(POWER_FIELDS, (compute_power_w, pagein_power_w, pageout_power_w), strict=True))
    powers = {key: value for key, value in given.items() if value is not None}
    measurement = _with_phases(lambda progress: measure_device(
        name, output, page_dir=page_dir, sizes=sizes_bytes, repeats=repeats, model=model, batch=batch, size=image,
        steps=steps, storage=not skip_storage, compute=not skip_compute, gemm_s=gemm_seconds, powers=powers,
        power_source=power_source, power_sensors=power_sensor or (), idle_s=idle_s, whole_power=whole_power,
        progress=progress))
    device, storage, compute = measurement.device, measurement.storage, measurement.compute
    if as_json:
        typer.echo(json.dumps({"device": device.to_dict(), "file": str(output),
                               "storage": None if storage is None else storage.to_dict(),
                               "compute": None if compute is None else compute.to_dict()}))
        return
    table = Table(title=f"{name}: measured on this machine")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("source")
    for key in (*RATE_FIELDS, *ENERGY_FIELDS):
        value = getattr(device, key)
        table.add_row(key, "-" if value is None else f"{value:.4g}", device.sources.get(key, ""))
    Console(width=max(console.width, 150)).print(table)
    missing = [key for key in POWER_FIELDS if getattr(device, key) is None]
    console.print(f"wrote {output}; use it with `edgetrain --devices-file {output} plan ... --device {name}`"
                  + (f" (energy planning needs {', '.join(missing)} from a power meter)" if missing else ""))


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, str):
        return "n/a"  # the reason is printed once below the table
    return "-" if value is None else fmt.format(value)


def _counter_value(figures: dict[str, Any], label: str) -> Any:
    value = figures["counters"].get(label)
    return value["scaled"] if isinstance(value, dict) else value


def _print_counters(report: dict[str, Any]) -> None:
    rows = [*report["phases"].items(), ("step", report["step"])]
    pmus = sorted(report["step"]["metrics"]) or [""]
    table = Table(title=f"{report['model']}, batch {report['batch']}, {report['size']} px: sums over "
                        f"{report['steps']} steps" + (f"; PMUs {', '.join(pmus)}" if pmus != [""] else ""))
    for header in ("phase", "s", "task-clock ms", "page faults", "ctx switches", *(
            f"{pmu + ' ' if pmu else ''}{name}" for pmu in pmus for name in ("instructions", "cycles", "IPC",
                                                                            "L1D miss", "branch miss"))):
        table.add_column(header, justify="left" if header == "phase" else "right")
    for phase, figures in rows:
        task_ns = _counter_value(figures, "task-clock")
        cells = [phase, f"{figures['seconds']:.3f}", _cell(task_ns / 1e6 if isinstance(task_ns, float) else task_ns,
                                                         "{:.1f}"),
                 _cell(_counter_value(figures, "page-faults"), "{:.0f}"),
                 _cell(_counter_value(figures, "context-switches"), "{:.0f}")]
        for pmu in pmus:
            prefix = f"{pmu}/" if pmu else ""
            suffix = "/" if pmu else ""
            metrics = figures["metrics"].get(pmu, {})
            cells += [_cell(_counter_value(figures, f"{prefix}instructions{suffix}"), "{:.3g}"),
                      _cell(_counter_value(figures, f"{prefix}cycles{suffix}"), "{:.3g}"),
                      _cell(metrics.get("ipc"), "{:.2f}"), _cell(metrics.get("l1d_miss_ratio"), "{:.2%}"),
                      _cell(metrics.get("branch_miss_ratio"), "{:.2%}")]
        table.add_row(*cells)
    Console(width=max(console.width, 170)).print(table)
    for label, why in report["unavailable"].items():
        console.print(f"{label}: {why}", markup=False, highlight=False)
    overhead = report["overhead"]
    counted, plain = overhead["counted_step_spread_s"], overhead["plain_step_spread_s"]
    console.print(f"overhead of reading the counters at every phase boundary: step {counted['median']:.4g} s "
                  f"(IQR {counted['iqr']:.3g} s) vs {plain['median']:.4g} s (IQR {plain['iqr']:.3g} s) without "
                  f"({100 * (overhead['ratio'] - 1):+.1f}%; medians of {plain['n']} steps each)")


@bench_app.command("counters")
@clean_errors
def bench_counters(model: str = typer.Option("resnet18_cifar", "--model", "-m", help="Model to train."),
                   batch: int = typer.Option(8, "--batch", "-b", min=1, help="Batch size."),
                   image: int = typer.Option(32, "--image", "--size", min=1, help="Image side (sequence length)."),
                   steps: int = typer.Option(3, "--steps", min=1, help="Timed steps (sums over them)."),
                   as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Hardware and software counters per training phase (data, forward, backward, optimizer) and per step."""
    from ..hwcounters.phases import count_phases
    from ..models import check_input, get_model_spec

    check_input(get_model_spec(model), batch, image)
    report = count_phases(model, batch, image, steps)
    if as_json:
        typer.echo(to_json(report))
    else:
        _print_counters(report)


@bench_app.command("profile")
@clean_errors
def bench_profile(device: str | None = typer.Option(None, "--device", "-d", help="Name of this board in the "
                                                    "report (default: the hostname)."),
                  runs: int = typer.Option(5, "--runs", min=2, help="Timed runs per workload."),
                  out: Path = typer.Option(Path("out/profile"), "--out", "-o", help="Output directory."),
                  as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """The fixed, versioned training workloads, repeated: median, IQR and CoV per workload, and the setup."""
    from ..bench.workloads import run_profile

    report = run_profile(device, runs)
    out.mkdir(parents=True, exist_ok=True)
    path = write_json(out / f"{report['device']}.json", report)
    if as_json:
        typer.echo(to_json(report))
        return
    table = Table(title=f"edgetrain training profile v{report['version']} on {report['device']} "
                        f"({report['runs']} runs)")
    for header in ("workload", "batch", "size", "s/step median", "IQR", "CoV", "samples/s"):
        table.add_column(header, justify="left" if header == "workload" else "right")
    for row in report["workloads"]:
        stats = row["s_per_step"]
        table.add_row(row["name"], str(row["batch"]), str(row["size"]), f"{stats['median']:.4f}",
                      f"{stats['iqr']:.4f}", f"{stats['cov_pct']:.1f}%", f"{row['samples_per_s']:.1f}")
    console.print(table)
    setup = report["setup"]
    console.print(f"torch {setup['torch']}, Python {setup['python']}, kernel {setup['kernel']}, {setup['cpu']}, "
                  f"{setup['torch_threads']} threads, governor {setup['governor']}, {setup['power_mode']}; "
                  f"wrote {path}", markup=False, highlight=False)
