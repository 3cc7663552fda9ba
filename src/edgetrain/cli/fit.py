"""``edgetrain devices``, ``memory`` and ``plan``: what a device holds, what a training step needs, and the
schedule that makes it fit a budget.

The main app registers these commands in :mod:`edgetrain.cli`; the library is imported inside each
command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from ..errors import EdgetrainError
from ..units import format_bytes
from .common import (
    BatchOpt,
    DeviceOpt,
    ModelArgOpt,
    ModelOpt,
    OptimizerOpt,
    SizeOpt,
    UpdateOpt,
    clean_errors,
    console,
    finite,
    host_for,
    model_name,
)

__all__ = ["devices", "memory", "plan_command"]


@clean_errors
def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the device catalog (every figure with its source: see --json)."""
    from ..devices import devices_table, load_catalog, this_machine, user_devices

    catalog = [*{**load_catalog(), **user_devices()}.values(), this_machine()]
    if as_json:
        typer.echo(json.dumps([d.to_dict() for d in catalog], indent=1))
    else:
        Console(width=max(console.width, 150)).print(devices_table(catalog))


@clean_errors
def memory(model: str = ModelOpt, batch: int = BatchOpt, image: int = SizeOpt, model_args: list[str] = ModelArgOpt,
           device: str | None = DeviceOpt, optimizer: str = OptimizerOpt, update: str = UpdateOpt,
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """How much memory one training step needs, and whether it fits a device."""
    from ..devices import get_device
    from ..profiling import estimate_memory

    model = model_name(model, model_args)
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
    from ..train.budget import device_verdict, estimate_runtime_baseline_bytes

    return device_verdict(tensor_peak_bytes, target.memory_bytes, target.usable_memory_bytes,
                          estimate_runtime_baseline_bytes())


def _verdict_detail(report: dict[str, Any]) -> str:
    margin = int(report["margin_bytes"])
    capacity = f"usable {format_bytes(report['capacity_bytes'])}" if report["os_memory_known"] else \
        f"RAM {format_bytes(report['capacity_bytes'])}, an upper bound: its OS's share is unknown"
    return (f"predicted {format_bytes(report['predicted_process_bytes'])} = runtime baseline "
            f"{format_bytes(report['runtime_baseline_bytes'])} (measured here) + step + cushion; {capacity}; "
            f"margin {'+' if margin >= 0 else '-'}{format_bytes(abs(margin))}")


@clean_errors
def plan_command(model: str = ModelOpt, batch: int = BatchOpt, image: int = SizeOpt,
                 model_args: list[str] = ModelArgOpt,
                 memory: str | None = typer.Option(None, "--memory", help="Budget for the step's tensors, e.g. "
                                                   "2GiB (train's --memory bounds the whole process)."),
                 recompute: float | None = typer.Option(None, "--recompute", callback=finite("--recompute", 1),
                                                        help="Largest recompute factor ρ >= 1."),
                 classes: int | None = typer.Option(None, "--classes", min=2, help="Classes of the model's head "
                                                    "(default: the zoo's; 10 for train's synthetic data)."),
                 strategy: str = typer.Option(
                     "auto", "--strategy", help="time: auto, uniform, revolve, optimal; energy: auto (= paging-dp), "
                     "paging-dp, recompute, paging-only, capuchin, milp."),
                 device: str | None = DeviceOpt, optimizer: str = OptimizerOpt, update: str = UpdateOpt,
                 objective: str = typer.Option("time", "--objective",
                                               help="time (fastest schedule) or energy (least energy on --device)."),
                 deadline: str | None = typer.Option(
                     None, "--deadline", help="Energy objective: longest step allowed, '1.2' = 1.2x the step without "
                     "recomputation or paging on the device, '3.5s' = seconds."),
                 output: Path | None = typer.Option(None, "--output", "-o", help="Save the plan for "
                                                    "`edgetrain train --plan` (schedule, chain, settings)."),
                 as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """The best schedule for a memory budget (default: the device's memory) or a factor ρ; fastest or least energy."""
    from ..core.planfile import PlanFile
    from ..costs.timemodel import scale_to_rate, training_rate
    from ..devices import get_device
    from ..models import get_model_spec
    from ..planners import plan
    from ..profiling import chain_for

    if objective not in ("time", "energy"):
        raise EdgetrainError(f"--objective must be time or energy, got {objective!r}")
    model = model_name(model, model_args)
    target = get_device(device) if device else None
    if memory is None and recompute is None:
        if target is None or target.memory_bytes is None:
            raise EdgetrainError("give --memory or --recompute (or a --device whose memory is the budget)")
        from ..train.budget import device_tensor_budget

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
        from ..planners.energy_plan import energy_report

        if deadline is not None:  # a malformed deadline is refused before this machine is calibrated
            from ..planners.energy_plan import deadline_seconds

            deadline_seconds(deadline, 1.0)
        host = host_for(target)
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
    rate = None if target is None else training_rate(target, host_for(target))
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


def _time_source(target: Any, rate: Any) -> str:
    """Where a device time comes from (``rate``: the target's training rate), or why there is none."""
    from ..costs.timemodel import unknown_rate_reason

    if target is None:
        return "unknown: no --device; a step time needs a device's training rate (NOTE [ One time model ])"
    return f"unknown: {unknown_rate_reason(target)}" if rate is None else str(rate.source)


def _print_energy_plan(report: dict[str, Any], output: Path | None) -> None:
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


def _print_plan(report: dict[str, Any], output: Path | None) -> None:
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
