"""The ``edgetrain`` command line: each command parses options and calls one library function.

Every failure is one line on stderr, never a traceback: library errors
(:class:`~edgetrain.errors.EdgetrainError`, bad quantities, files that cannot be written) and
bad options exit with code 2, anything unexpected with 1 (``--verbose`` adds its traceback).
Heavy imports happen inside the commands that need them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer
import typer.main
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .cli_cluster import cluster_app
from .cli_common import clean_errors as _clean_errors
from .cli_common import click_exceptions, console, err_console, refuse_non_finite
from .cli_common import error as _error
from .cli_common import finite as _finite
from .cli_federated import register_federated
from .cli_insitu import insitu_app
from .cli_power import power_app, register_bench
from .errors import EdgetrainError
from .fileio import write_atomic
from .units import format_bytes

app = typer.Typer(help="Make deep-learning training fit and run well on small edge machines.",
                  no_args_is_help=True, add_completion=False)
reproduce_app = typer.Typer(help="Regenerate the founding paper's results from the code.", no_args_is_help=True)
app.add_typer(reproduce_app, name="reproduce")
bench_app = typer.Typer(help="Systems measurements on this machine.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    """The ``edgetrain`` script (``argv`` default: the process's): usage errors on one line too."""
    # Huge pages for large tensors; PyTorch reads this at its first allocation, so before any
    # command imports torch (NOTE [ Returning freed memory ] in profile/process.py).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        code = refuse_non_finite(typer.main.get_command(app)).main(args=argv, standalone_mode=False,
                                                                   prog_name="edgetrain")
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "edgetrain"
        _error(f"{exc.format_message()} (see {command} --help)")
        sys.exit(2)
    except click_exceptions.ClickException as exc:
        _error(exc.format_message())
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


@app.callback()
def root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does."),
         devices_file: Optional[list[Path]] = typer.Option(
             None, "--devices-file", help="A device file (e.g. from `edgetrain bench device`) whose devices join the "
             "catalog, replacing shipped ones of the same name; repeatable. Same as EDGETRAIN_DEVICES.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(name)s: %(message)s")
    if devices_file:
        from .devices.catalog import DEVICES_ENV

        earlier = [p for p in os.environ.get(DEVICES_ENV, "").split(os.pathsep) if p]
        os.environ[DEVICES_ENV] = os.pathsep.join([*earlier, *map(str, devices_file)])


T = TypeVar("T")


def _with_progress(description: str, work: Callable[[Callable[[int, int], None]], T]) -> T:
    """Run ``work(progress)`` under a progress bar on stderr; ``progress(done, total)`` advances it."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=None)
        return work(lambda done, total: bar.update(task, completed=done, total=total))


def _with_phases(work: Callable[[Callable[[str, int, int], None]], T]) -> T:
    """Run ``work(progress)`` under a progress bar on stderr; ``progress(phase, done, total)`` names and advances it."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None, visible=False)
        return work(lambda phase, done, total: bar.update(task, description=phase, completed=done, total=total,
                                                          visible=True))


def _memory_of(device: str) -> int:
    """Memory of a catalog device, for commands that need it as a budget."""
    from .devices import get_device

    memory_bytes = get_device(device).memory_bytes
    if memory_bytes is None:
        raise EdgetrainError(f"device {device!r} has no known memory size")
    return memory_bytes


@app.command()
@_clean_errors
def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the device catalog (every figure with its source: see --json)."""
    from .devices import devices_table, load_catalog, this_machine, user_devices

    catalog = [*{**load_catalog(), **user_devices()}.values(), this_machine()]
    if as_json:
        typer.echo(json.dumps([d.to_dict() for d in catalog], indent=1))
    else:
        Console(width=max(console.width, 150)).print(devices_table(catalog))


ModelOpt = typer.Option(..., "--model", "-m", help="Model name, e.g. resnet50, mobilenet_v2, transformer.")
BatchOpt = typer.Option(..., "--batch", "-b", min=1, help="Batch size.")
SizeOpt = typer.Option(224, "--image", "--size", "--seq-len", min=1,
                       help="Image side in pixels (sequence length for transformer models).")
DeviceOpt = typer.Option(None, "--device", "-d", help="Device from `edgetrain devices`, e.g. odroid-xu4.")
OptimizerOpt = typer.Option("sgd", "--optimizer", help="sgd (with momentum) or adam.")
UpdateOpt = typer.Option("all", "--update", help="The parameters that train: all, bias (biases and norm layers), "
                         "last:K (the last K stages) or comma-separated parameter patterns (layer4,fc); the rest "
                         "is frozen, and a frozen start runs once without recording.")


@app.command()
@_clean_errors
def memory(model: str = ModelOpt, batch: int = BatchOpt, image: int = SizeOpt,
           device: Optional[str] = DeviceOpt, optimizer: str = OptimizerOpt, update: str = UpdateOpt,
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """How much memory one training step needs, and whether it fits a device."""
    from .devices import get_device
    from .profile import estimate_memory

    target = get_device(device) if device else None
    estimate = estimate_memory(model, batch, image, optimizer=optimizer, update=update)
    report = estimate.to_dict(target)
    if target is not None:
        report.update(_device_verdict(estimate.total_bytes, target))
    if as_json:
        typer.echo(json.dumps(report))
        return
    _print_memory_report(report)


def _print_memory_report(report: dict[str, Any]) -> None:
    table = Table(title=f"{report['model']}, batch {report['batch']}, size {report['size']}, "
                        f"{report['optimizer']}: peak of one training step")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    table.add_column("", justify="right")
    for part in ("weights", "gradients", "optimizer", "activations", "total"):
        n = int(report[f"{part}_bytes"])
        table.add_row(part, f"{n:,}", format_bytes(n), style="bold" if part == "total" else None)
    console.print(table)
    if report["fits"] is None:
        return
    verdict = "[green]fits[/]" if report["fits"] else "[red]does not fit[/]"
    console.print(f"{report['device']}: {verdict} as a training process, {_verdict_detail(report)}")


def _device_verdict(tensor_peak_bytes: int, target: Any) -> dict[str, Any]:
    """Process-level verdict for a step on ``target`` (NOTE [ Process budget ]), baseline measured here."""
    from .train.budget import device_verdict, estimate_runtime_baseline_bytes

    return device_verdict(tensor_peak_bytes, target.memory_bytes, target.usable_memory_bytes,
                          estimate_runtime_baseline_bytes())


def _verdict_detail(report: dict[str, Any]) -> str:
    margin = int(report["margin_bytes"])
    capacity = f"usable {format_bytes(report['capacity_bytes'])}" if report["os_memory_known"] else \
        f"RAM {format_bytes(report['capacity_bytes'])}, an upper bound: its OS's share is unknown"
    return (f"predicted {format_bytes(report['predicted_process_bytes'])} = runtime baseline "
            f"{format_bytes(report['runtime_baseline_bytes'])} (measured here) + step + cushion; {capacity}; "
            f"margin {'+' if margin >= 0 else '-'}{format_bytes(abs(margin))}")


@app.command("plan")
@_clean_errors
def plan_command(model: str = ModelOpt, batch: int = BatchOpt, image: int = SizeOpt,
                 memory: Optional[str] = typer.Option(None, "--memory", help="Budget for the step's tensors, e.g. "
                                                      "2GiB (train's --memory bounds the whole process)."),
                 recompute: Optional[float] = typer.Option(None, "--recompute", callback=_finite("--recompute", 1),
                                                           help="Largest recompute factor ρ >= 1."),
                 classes: Optional[int] = typer.Option(None, "--classes", min=2, help="Classes of the model's head "
                                                       "(default: the zoo's; 10 for train's synthetic data)."),
                 strategy: str = typer.Option(
                     "auto", "--strategy", help="time: auto, uniform, revolve, optimal; energy: auto (= paging-dp), "
                     "paging-dp, recompute, paging-only, capuchin, milp."),
                 device: Optional[str] = DeviceOpt, optimizer: str = OptimizerOpt, update: str = UpdateOpt,
                 objective: str = typer.Option("time", "--objective",
                                               help="time (fastest schedule) or energy (least energy on --device)."),
                 deadline: Optional[str] = typer.Option(
                     None, "--deadline", help="Energy objective: longest step allowed, '1.2' = 1.2x the step without "
                     "recomputation or paging on the device, '3.5s' = seconds."),
                 output: Optional[Path] = typer.Option(None, "--output", "-o", help="Save the plan for "
                                                       "`edgetrain train --plan` (schedule, chain, settings)."),
                 as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """The best schedule for a memory budget (default: the device's memory) or a factor ρ; fastest or least energy."""
    from .devices import get_device
    from .models import get_model_spec
    from .planfile import PlanFile
    from .planners import plan
    from .profile import chain_for
    from .timemodel import scale_to_rate, training_rate

    if objective not in ("time", "energy"):
        raise EdgetrainError(f"--objective must be time or energy, got {objective!r}")
    target = get_device(device) if device else None
    if memory is None and recompute is None:
        if target is None or target.memory_bytes is None:
            raise EdgetrainError("give --memory or --recompute (or a --device whose memory is the budget)")
        from .train.budget import device_tensor_budget

        memory = str(device_tensor_budget(target))
    chain = chain_for(model, batch, image, optimizer=optimizer, num_classes=classes, update=update)
    shipped = functools.partial(PlanFile, model=model, batch=batch, image=image, optimizer=optimizer,
                                update=str(chain.meta["update"]),
                                num_classes=classes or get_model_spec(model).default_num_classes,
                                device=None if target is None else target.name)
    if objective == "energy":
        if target is None:
            raise EdgetrainError("--objective energy needs --device (its power and storage figures price the plan)")
        if recompute is not None or memory is None:
            raise EdgetrainError("--objective energy takes a memory budget (--memory or the device's), not --recompute")
        from .planners.energy_plan import energy_report

        if deadline is not None:  # a malformed deadline is refused before this machine is calibrated
            from .planners.energy_plan import deadline_seconds

            deadline_seconds(deadline, 1.0)
        host = _host_for(target)
        energy = energy_report(chain, target, memory, deadline=deadline, strategy=strategy, host=host)
        device_rate = training_rate(target, host)
        if output is not None:
            if energy.plan.schedule is None:
                raise EdgetrainError(f"the MILP's decisions have no executor schedule "
                                     f"({energy.plan.to_dict()['schedule_error']}); use --strategy paging-dp")
            shipped(chain=energy.chain, schedule=energy.plan.schedule, budget_bytes=energy.plan.budget_bytes).save(
                output)
        energy_dict: dict[str, Any] = {"model": model, "batch": batch, "size": image, "optimizer": optimizer,
                                       "update": chain.meta["update"],
                                       "objective": "energy", **energy.to_dict(),
                                       "training_flops_per_s": None if device_rate is None
                                       else device_rate.flops_per_s,
                                       "time_source": _time_source(target, device_rate)}
        energy_dict.update(device_memory_bytes=target.memory_bytes, fits=None if target.memory_bytes is None
                           else energy_dict["predicted_peak_bytes"] <= target.memory_bytes)
        if as_json:
            typer.echo(json.dumps(energy_dict))
            return
        _print_energy_plan(energy_dict, output)
        return
    if deadline is not None:
        raise EdgetrainError("--deadline applies to --objective energy")
    rate = None if target is None else training_rate(target, _host_for(target))
    timed = chain if rate is None else scale_to_rate(chain, rate.flops_per_s, rate.device_name)
    chosen = plan(timed, memory=memory, recompute=recompute, strategy=strategy)
    if output is not None:
        shipped(chain=chain, schedule=chosen.schedule, budget_bytes=chosen.budget_bytes).save(output)
    report = {"model": model, "batch": batch, "size": image, "optimizer": optimizer, "update": chain.meta["update"],
              "objective": "time",
              **chosen.to_dict(), "training_flops_per_s": None if rate is None else rate.flops_per_s,
              "time_source": _time_source(target, rate)}
    if rate is None:  # NOTE [ One time model ]: no sourced rate, no time (the schedule is the same at any rate)
        report["predicted_time_s"] = None
        if chosen.baseline is not None:
            report["baseline"] = {**chosen.baseline.to_dict(), "time_s": None}
    if target is not None and target.memory_bytes is not None:
        report.update(device=target.name, device_memory_bytes=target.memory_bytes,
                      **_device_verdict(chosen.predicted_peak_bytes, target))
    if as_json:
        typer.echo(json.dumps(report))
        return
    _print_plan(report, output)


def _host_for(target: Any) -> Any:
    """This machine's calibration when ``target``'s training rate needs it (NOTE [ One time model ]), else None."""
    from .timemodel import needs_calibration

    if target is None or not needs_calibration(target):
        return None
    from .devices.rate import host_calibration

    return _with_progress("calibrating this machine (DGEMM and a ResNet-18 step)", lambda _: host_calibration())


def _time_source(target: Any, rate: Any) -> str:
    """Where a device time comes from (``rate``: the target's training rate), or why there is none."""
    from .timemodel import unknown_rate_reason

    if target is None:
        return "unknown: no --device; a step time needs a device's training rate (NOTE [ One time model ])"
    return f"unknown: {unknown_rate_reason(target)}" if rate is None else str(rate.source)


def _print_energy_plan(report: dict[str, Any], output: Optional[Path]) -> None:
    console.print(f"[bold]{report['model']}[/], batch {report['batch']}, size {report['size']} on "
                  f"[bold]{report['device']}[/]: [bold]{report['strategy']}[/] "
                  f"(planned in {report['solve_time_s']:.2f} s)")
    console.print(f"  energy per step {report['energy_j']:.4g} J = compute {report['energy_compute_j']:.4g} J "
                  f"+ page-in {report['energy_pagein_j']:.4g} J + page-out {report['energy_pageout_j']:.4g} J")
    paged = "" if report["paged_out_bytes"] is None else (
        f", {format_bytes(report['paged_out_bytes'])} paged out (disk peak {format_bytes(report['peak_disk_bytes'])})")
    console.print(f"  predicted peak {format_bytes(report['predicted_peak_bytes'])} "
                  f"(budget {format_bytes(report['budget_bytes'])}), step {report['predicted_time_s']:.4g} s, "
                  f"ρ = {report['recompute_factor']:.3f}{paged}")
    if report["strategy"] == "milp":
        runnable = "its ops are checked by the simulator" if report["schedule_error"] is None else \
            f"no executor schedule: {report['schedule_error']}"
        console.print(f"  MILP {report['status']}, gap {report['mip_gap']:.2g}; {runnable}")
    if report["deadline_s"] is not None:
        verdict = "[green]met[/]" if report["deadline_met"] else "[red]missed (the fastest schedule is shown)[/]"
        console.print(f"  deadline {report['deadline_s']:.4g} s: {verdict}")
    if report["recompute_only_energy_j"] is None:
        console.print("  recompute-only: does not fit this budget")
    else:
        extra = report["recompute_only_energy_j"] / report["energy_j"] - 1
        console.print(f"  recompute-only: {report['recompute_only_energy_j']:.4g} J ({extra:+.1%})")
    if report["fits"] is not None:
        verdict = "[green]fits[/]" if report["fits"] else "[red]does not fit[/]"
        console.print(f"  {report['device']} ({format_bytes(report['device_memory_bytes'])}): {verdict}")
    if output is not None:
        console.print(f"  plan written to {output}; train from it with edgetrain train --plan {output} ...")


def _print_plan(report: dict[str, Any], output: Optional[Path]) -> None:
    params = ", ".join(f"{k}={v}" for k, v in report["params"].items() if k != "unit_bytes")
    updated = "" if report["update"] == "all" else f", updating {report['update']}"
    console.print(f"[bold]{report['model']}[/], batch {report['batch']}, size {report['size']}{updated}: "
                  f"[bold]{report['strategy']}[/] ({params})")
    console.print(f"  predicted peak {format_bytes(report['predicted_peak_bytes'])}, "
                  f"recompute factor ρ = {report['recompute_factor']:.3f}, "
                  f"{report['forward_advances']} forward recomputations")
    step = "unknown" if report["predicted_time_s"] is None else f"{report['predicted_time_s']:.4g} s"
    console.print(f"  step time {step} ({report['time_source']})")
    baseline = report["baseline"]
    if baseline is None:
        console.print("  checkpoint_sequential: no segment count meets this request")
    else:
        console.print(f"  checkpoint_sequential at its best ({baseline['params']['segments']} segments): "
                      f"peak {format_bytes(baseline['peak_bytes'])}, ρ = {baseline['recompute_factor']:.3f}")
    if "fits" in report:
        verdict = "[green]fits[/]" if report["fits"] else "[red]does not fit[/]"
        console.print(f"  {report['device']}: {verdict} as a training process, {_verdict_detail(report)}")
    if output is not None:
        console.print(f"  plan written to {output}; train from it with edgetrain train --plan {output} ...")


@reproduce_app.command("tables")
@_clean_errors
def reproduce_tables(out: Path = typer.Option(Path("out/tables"), "--out", "-o", help="Output directory."),
                     device: str = typer.Option("odroid-xu4", "--device", "-d",
                                                help="Whose memory marks cells that do not fit.")) -> None:
    """Tables I-III of Kukreja et al. 2019: published, the paper's accounting recomputed, a real step; claims."""
    from .reports.tables import reproduce_tables as build

    budget = _memory_of(device)
    cells = _with_progress("estimating cells", lambda progress: build(out, budget, progress=progress))
    from .reports.tables import claim_verdicts

    accounting = [c.accounting_ratio for c in cells]
    ours = [c.ratio for c in cells]
    console.print(f"wrote {out / 'tables.md'} and {out / 'tables.csv'}: {len(cells)} cells; the paper's accounting "
                  f"recomputed is {min(accounting):.3f}..{max(accounting):.3f} of the paper, a real training "
                  f"step {min(ours):.2f}..{max(ours):.2f}; cells that do not fit {format_bytes(budget)}: paper "
                  f"{sum(not c.paper_fits for c in cells)}, its accounting "
                  f"{sum(not c.accounting_fits for c in cells)}, ours {sum(not c.fits for c in cells)}")
    for claim, paper, accounting_holds, ours_holds in claim_verdicts(cells):
        verdicts = ", ".join(f"{who} {'confirms' if holds else 'refutes'}" for who, holds in
                             (("paper", paper), ("its accounting", accounting_holds), ("ours", ours_holds)))
        console.print(f"  '{claim.text}' ({claim.test}): {verdicts}")


@reproduce_app.command("figure1")
@_clean_errors
def reproduce_figure1(out: Path = typer.Option(Path("out/figure1"), "--out", "-o", help="Output directory."),
                      device: str = typer.Option("odroid-xu4", "--device", "-d",
                                                 help="Whose memory is the horizontal line.")) -> None:
    """Fig. 1 of Kukreja et al. 2019: peak memory vs recompute factor, LinearResNet and real ResNets."""
    from .reports.figure1 import CLAIM_RHO, FAMILIES, PNG_NAMES
    from .reports.figure1 import reproduce_figure1 as build

    budget = _memory_of(device)
    figure = _with_progress("computing curves", lambda progress: build(out, budget, progress=progress))
    console.print(f"wrote {', '.join(f'{out}/{name}' for name in PNG_NAMES)}, figure1.csv, figure1.md")
    verdicts = {True: "[green]holds[/]", False: "[red]does not hold[/]"}
    for family in FAMILIES:
        factors = ", ".join(f"{d}: {'-' if f is None else f'{f:.2f}'}" for d, f in figure.claim(family).items())
        peak = figure.plain_peak_bytes(family).get(18)
        rho_one = "" if peak is None else (
            f"; at ρ = 1 ResNet-18 needs {format_bytes(peak)}, claim 'even ResNet-18 does not fit' "
            f"{verdicts[bool(figure.resnet18_misses_at_rho_one(family))]}")
        console.print(f"{family}, batch 8 at 500 px, least ρ that fits {format_bytes(budget)} per depth: {factors}; "
                      f"claim 'all fit with ρ > {CLAIM_RHO}' {verdicts[figure.claim_holds(family)]}{rho_one}")


@reproduce_app.command("poet")
@_clean_errors
def reproduce_poet(out: Path = typer.Option(Path("out/poet"), "--out", "-o", help="Output directory."),
                   budgets: int = typer.Option(12, "--budgets", min=2, help="Budgets per model and device (>= 2: "
                                               "keep-all's peak and the least feasible, evenly between)."),
                   milp: bool = typer.Option(False, "--milp", help="Add the MILP series (ResNet-18; slower).")) -> None:
    """POET's Fig. 3 and 4 shapes (energy vs memory and vs runtime budget) and its results beside ours."""
    from .devices import get_device
    from .reports.poet import DEFAULT_DEVICES
    from .reports.poet import reproduce_poet as build
    from .timemodel import needs_calibration

    # the kept (or $EDGETRAIN_HOST_CALIBRATION's) calibration where a device needs one, so a rerun gives the same times
    host = _host_for(next((d for d in map(get_device, DEFAULT_DEVICES) if needs_calibration(d)), None))
    figure = _with_progress("sweeping budgets", lambda progress: build(out, budgets=budgets, include_milp=milp,
                                                                       host=host, progress=progress))
    console.print(f"wrote {figure.json_path}, {figure.png_path} and {figure.md_path}")
    verdicts = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "untestable"}
    for panel in figure.data["panels"]:  # type: ignore[attr-defined]
        claim, poets = panel["claim"], panel["claim_activations"]
        lowest = claim.get("lowest_budget_pct")
        within = "-" if lowest is None else f"{lowest:.0f}% ({poets['lowest_budget_pct']:.0f}% in POET's accounting)"
        console.print(f"  {panel['model']} on {panel['device']}: paging-dp within 1% of unconstrained energy down to "
                      f"{within} of keep-all's peak (least feasible {claim['least_feasible_pct']:.0f}%); POET's claim "
                      f"{verdicts[claim['holds']]} for whole-step budgets, {verdicts[poets['holds']]} in its "
                      "accounting")
    for name, reason in figure.data["skipped_devices"].items():  # type: ignore[attr-defined]
        console.print(f"  {name}: skipped ({reason})")
    console.print(f"POET's results, point by point (sources and reasons in {figure.md_path}):")
    for row in figure.data["claims"]:  # type: ignore[attr-defined]
        console.print(f"  {row['id']}: {row['claim']}; published {row['published']}; ours {row['ours']}",
                      markup=False)


@bench_app.command("batch")
@_clean_errors
def bench_batch(model: str = ModelOpt, image: int = SizeOpt,
                device: str = typer.Option("odroid-xu4", "--device", "-d", help="Whose memory is the budget."),
                memory: Optional[str] = typer.Option(None, "--memory", help="Budget instead of the device's memory."),
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
    from .devices import get_device
    from .reports.batch_sweep import largest_batches_by_device, plot_sweep, sweep_batches
    from .train.budget import device_tensor_budget
    from .units import parse_bytes

    budget = parse_bytes(memory) if memory is not None else _memory_of(device)
    targets = [get_device(name.strip()) for name in largest_on.split(",") if name.strip()]
    sweep = _with_progress("batch sizes", lambda progress: sweep_batches(
        model, image, budget, max_run_batch=max_run_batch, reps=reps, runs=runs, progress=progress))
    variants = ("resnet18", "resnet18_cifar") if model in ("resnet18", "resnet18_cifar") else (model,)
    largest = _with_progress("largest batch per device", lambda _: largest_batches_by_device(
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


def _rate_spread(runs: Optional[tuple[float, ...]]) -> str:
    """'median (min-max)' of per-run throughputs, or '-' when not run."""
    if runs is None:
        return "-"
    return f"{statistics.median(runs):.1f} ({min(runs):.1f}-{max(runs):.1f})"


@bench_app.command("data")
@_clean_errors
def bench_data(model: str = typer.Option("resnet18", "--model", "-m", help="Model whose step is the compute."),
               data: str = typer.Option("synthetic", "--data", help="'synthetic' or a dataset folder."),
               samples: int = typer.Option(512, "--samples", min=1, help="Size of the synthetic dataset."),
               image: int = typer.Option(64, "--image", "--size", min=1, help="Image side in pixels."),
               batch: int = typer.Option(16, "--batch", "-b", min=1, help="Batch size."),
               workers: str = typer.Option("0,1,2", "--workers", help="Loader worker counts to try, e.g. 0,1,2."),
               batches: int = typer.Option(10, "--batches", min=1, help="Timed batches per run (median)."),
               device: Optional[str] = typer.Option(None, "--device", "-d",
                                                    help="Emulate this device's storage read bandwidth."),
               data_root: Path = typer.Option(Path("out/data"), "--data-root", help="Where synthetic data goes."),
               as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Data-stall analysis: fetch / pre-process / compute per batch for 0..N loader workers."""
    from .data import analyze_stalls, make_step_fn, open_dataset, stall_table
    from .devices import get_device
    from .models import check_input, get_model_spec

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
    report = _with_progress("worker counts", lambda progress: analyze_stalls(
        make_step_fn(net), train_set, batch, workers=counts, batches=batches, read_bps=read_bps))
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        Console(width=max(console.width, 140)).print(stall_table(report))


@bench_app.command("device")
@_clean_errors
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
        gemm_seconds: float = typer.Option(3.0, "--gemm-seconds", callback=_finite("--gemm-seconds", above=0),
                                           help="Seconds of the sustained FP64 DGEMM probe (the time model's rate)."),
        skip_storage: bool = typer.Option(False, "--skip-storage", help="Do not measure paging."),
        skip_compute: bool = typer.Option(False, "--skip-compute", help="Do not measure the compute rate."),
        compute_power_w: Optional[float] = typer.Option(None, "--compute-power-w",
                                                        callback=_finite("--compute-power-w", above=0),
                                                        help="Power while training, W."),
        pagein_power_w: Optional[float] = typer.Option(None, "--pagein-power-w",
                                                       callback=_finite("--pagein-power-w", above=0),
                                                       help="Power while paging in, W."),
        pageout_power_w: Optional[float] = typer.Option(None, "--pageout-power-w",
                                                        callback=_finite("--pageout-power-w", above=0),
                                                        help="Power while paging out, W."),
        power_source: Optional[str] = typer.Option(None, "--power-source",
                                                   help="What measured the powers, e.g. 'USB meter, load minus idle'."),
        power_sensor: Optional[list[str]] = typer.Option(
            None, "--power-sensor", help="Measure the powers from a sysfs power monitor: PATH (mW) or VOLTS*AMPS "
            "(mV x mA), optionally @SCALE (W per unit); repeat to sum rails."),
        idle_s: float = typer.Option(2.0, "--idle-s", callback=_finite("--idle-s", 0),
                                     help="Seconds of idle sampled before, subtracted from powers."),
        whole_power: bool = typer.Option(False, "--whole-power", help="Record whole sensor readings, idle included."),
        output: Path = typer.Option(Path("out/device/devices.toml"), "--output", "-o",
                                    help="Device file to write (an existing one keeps its other devices)."),
        as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON.")) -> None:
    """Measure this machine's energy-profile figures (paging, compute rate) into a device file."""
    from .devices.catalog import ENERGY_FIELDS, RATE_FIELDS
    from .devices.probe import POWER_FIELDS, measure_device
    from .units import parse_bytes

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


@app.command("train")
@_clean_errors
def train_command(
        model: str = typer.Option("resnet18", "--model", "-m", help="Model name from the zoo."),
        data: str = typer.Option("synthetic", "--data", help="'synthetic', an image folder or a CIFAR-10 folder."),
        samples: int = typer.Option(1000, "--samples", min=1, help="Size of the synthetic dataset."),
        batch: int = typer.Option(8, "--batch", "-b", min=1, help="Batch size."),
        image: int = typer.Option(64, "--image", "--size", min=1, help="Image side in pixels."),
        memory: Optional[str] = typer.Option(None, "--memory", help="Budget for the whole training process as the "
                                             "kernel counts it (resident memory), e.g. 600MiB."),
        step_memory: Optional[str] = typer.Option(None, "--step-memory", help="Budget for the step's tensors only "
                                                  "(as `plan --memory`), not the process."),
        recompute: Optional[float] = typer.Option(None, "--recompute", callback=_finite("--recompute", 1),
                                                  help="Largest recompute factor ρ >= 1."),
        device: Optional[str] = DeviceOpt,
        strategy: str = typer.Option("auto", "--strategy", help="auto, uniform, revolve or optimal."),
        plan_file: Optional[Path] = typer.Option(None, "--plan", help="Train from a plan made with `edgetrain plan "
                                                 "... -o` (no profiling or planning here)."),
        page_dir: Optional[Path] = typer.Option(None, "--page-dir", help="Where a paging schedule writes "
                                                "(an SD card, flash); default: a temp directory."),
        epochs: int = typer.Option(3, "--epochs", min=1, help="Passes over the training split."),
        optimizer: str = OptimizerOpt, update: str = UpdateOpt,
        lr: Optional[float] = typer.Option(None, "--lr", callback=_finite("--lr", above=0),
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
    from .train import TrainConfig

    config = TrainConfig(model=model, data=data, samples=samples, batch=batch, image=image, memory=memory,
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

    from .train import train

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


@app.command()
@_clean_errors
def demo(out: Path = typer.Option(Path("out/demo"), "--out", "-o", help="Where results are written."),
         samples: int = typer.Option(800, "--samples", min=1, help="Size of the generated dataset (train + val)."),
         epochs: int = typer.Option(3, "--epochs", min=1, help="Training epochs."),
         seed: int = typer.Option(0, "--seed", help="Seed of the data, the model and the order.")) -> None:
    """The main job on built-in defaults: what fits the Waggle node, then a real training run under a squeezed budget.

    Its budget: the squeeze the node puts on ResNet-50 at batch 8 and 500 px, or 10% above the least step if tighter.

    It writes the node-fit table, the run's metrics, summary and plan, and a figure (library: edgetrain.reports.demo).
    """
    import torch

    from .reports import demo as lib

    settings = lib.DemoSettings(samples=samples, epochs=epochs, seed=seed)
    lib.check_settings(settings)
    threads, cores, load = lib.choose_threads()
    torch.set_num_threads(threads)
    console.rule(f"1. Does training fit the Waggle node's ODROID XU4 ({format_bytes(_memory_of(lib.NODE))})?")
    node = _with_progress("estimating", lambda progress: lib.fit_on_node(out, progress))
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

app.add_typer(insitu_app, name="insitu")
app.add_typer(power_app, name="power")
register_bench(bench_app)
app.add_typer(cluster_app, name="cluster")
register_federated(cluster_app)
