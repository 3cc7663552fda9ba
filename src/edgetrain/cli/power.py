"""``edgetrain power``: list a board's modes, run a command under one, restore a mode a killed run left changed,
advise one for a workload.

The main app registers ``power_app`` in :mod:`edgetrain.cli`; the library is imported inside each command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ..sysutil.fileio import to_json
from ..sysutil.processes import dies_with_this_process
from .common import clean_errors, console

__all__ = ["power_app"]

power_app = typer.Typer(help="Power modes: list a board's modes, run a command under one, restore a mode a "
                               "crashed run left changed, advise one for a workload.", no_args_is_help=True)


@power_app.callback()
@clean_errors
def power_group(ctx: typer.Context) -> None:
    """Every power command first puts back a mode that a killed run left changed (NOTE [ A mode is always
    restored ]); ``power restore`` does it itself, to say what it did."""
    if ctx.invoked_subcommand != "restore":
        from ..power.control import recover_pending

        recover_pending()


def _mhz(hz: float | None) -> str:
    return "?" if hz is None else f"{hz / 1e6:g}"


def _modes_table(title: str, modes: Any) -> Table:
    table = Table(title=title)
    for header in ("id", "name", "cores", "CPU MHz", "GPU MHz", "EMC MHz", "budget W"):
        table.add_column(header, justify="left" if header == "name" else "right")
    for mode in modes:
        table.add_row(str(mode.mode_id), mode.name, "?" if mode.online_cores is None else str(mode.online_cores),
                      _mhz(mode.cpu_max_freq_hz), _mhz(mode.gpu_max_freq_hz), _mhz(mode.emc_max_freq_hz),
                      "?" if mode.budget_w is None else f"{mode.budget_w:g}")
    return table


@power_app.command("modes")
@clean_errors
def modes_command(device: str | None = typer.Option(None, "--device", "-d", help="A catalog device (e.g. "
                                                       "jetson-nano); default: this board's /etc/nvpmodel.conf."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON (with each mode's source).")) -> None:
    """The power modes of a catalog Jetson (sourced figures), or of this board (its nvpmodel.conf and sysfs)."""
    from ..power.modes import modes_for_device, nvpmodel_conf_path, parse_nvpmodel_conf, read_cpu_state

    if device is not None:
        modes = modes_for_device(device)
        if as_json:
            typer.echo(to_json({"device": device, "modes": [mode.to_dict() for mode in modes]}))
            return
        console.print(_modes_table(f"{device}: nvpmodel modes (sources: --json)", modes))
        unknown = sorted({key for mode in modes for key in mode.unknown})
        if unknown:
            console.print(f"left out where no source gives them: {', '.join(unknown)} (--json says why, per mode)")
        return
    state = read_cpu_state()
    conf = nvpmodel_conf_path()
    board_modes, default = parse_nvpmodel_conf(conf.read_text(), str(conf)) if conf else ((), None)
    if as_json:
        typer.echo(to_json({"cpus": state.to_dict(), "nvpmodel_conf": None if conf is None else str(conf),
                            "default_mode": default, "modes": [mode.to_dict() for mode in board_modes]}))
        return
    console.print(f"CPUs online: {','.join(map(str, state.online))} of {len(state.present)}; cpufreq: "
                  + (", ".join(f"cpu{cpu} {gov} <= {state.max_freq_khz.get(cpu, 0) / 1e3:g} MHz"
                               for cpu, gov in state.governors.items()) if state.has_cpufreq else
                     "unavailable: no cpufreq in /sys/devices/system/cpu/cpu0"))
    if conf is None:
        console.print("nvpmodel modes: unavailable: no /etc/nvpmodel.conf on this machine (not a Jetson); "
                      "see a catalog board's with --device, e.g. --device jetson-nano")
        return
    console.print(_modes_table(f"{conf} (default mode {default})", board_modes))


@power_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@clean_errors
def run_command(ctx: typer.Context,
                mode: int | None = typer.Option(None, "--mode", help="nvpmodel mode ID to run under."),
                cores: int | None = typer.Option(None, "--cores", min=1, help="CPUs to keep online."),
                governor: str | None = typer.Option(None, "--governor", help="cpufreq governor, e.g. performance."),
                cpu_mhz: float | None = typer.Option(None, "--cpu-mhz", min=1, help="cpufreq max clock, MHz.")
                ) -> None:
    """Run a command (after --) under a power mode, then restore the board's mode, whatever happens."""
    from ..errors import EdgetrainError
    from ..power.control import ModeRequest, applied_mode

    request = ModeRequest(mode, cores, governor, None if cpu_mhz is None else cpu_mhz * 1e6)
    if request.is_empty() or not ctx.args:
        raise EdgetrainError("give a mode (--mode, --cores, --governor, --cpu-mhz) and a command after --, "
                             "e.g. edgetrain power run --mode 1 -- edgetrain train ...")
    with applied_mode(request) as record:
        console.print(f"applied: {len(record['writes'])} sysfs writes"
                      + ("" if mode is None else f", nvpmodel -m {mode}") + "; restored when the command ends")
        code = subprocess.call(ctx.args, preexec_fn=dies_with_this_process())  # NOTE [ Children die with
        # their parent ]: a command left running would run on under the changed mode
    raise typer.Exit(code)


@power_app.command("restore")
@clean_errors
def restore_command() -> None:
    """Put back a mode a crashed run left changed (normally done at the start of every power command)."""
    from ..power.control import default_restore_file, recover_pending

    console.print("restored the board's previous mode" if recover_pending()
                  else f"nothing to restore ({default_restore_file()} does not exist)")


@power_app.command("advise")
@clean_errors
def advise_command(
        device: str | None = typer.Option(None, "--device", "-d", help="A catalog Jetson with a sourced mode table "
                                          "(with --profiles or --simulate-seed)."),
        model: str = typer.Option("resnet18", "--model", "-m", help="The model whose training step was profiled."),
        batch: int = typer.Option(8, "--batch", "-b", min=1, help="Its batch size."),
        samples: int = typer.Option(50_000, "--samples", min=1, help="Samples per epoch (CIFAR-10: 50000)."),
        deadline: float | None = typer.Option(None, "--deadline", min=0.0, help="Seconds an epoch may take."),
        power_cap: float | None = typer.Option(None, "--power-cap", min=0.0, help="Watts the board may draw."),
        profiles: Path | None = typer.Option(None, "--profiles", help="JSON of <= 6 modes measured on the board "
                                             "(docs/guide/power.md gives the format)."),
        simulate_seed: int | None = typer.Option(None, "--simulate-seed", help="Profile a synthetic workload of "
                                                 "the simulator instead (a demonstration, not a measurement)."),
        measure: bool = typer.Option(False, "--measure", help="Profile <= 6 of this board's modes now (root, CPU "
                                     "hot-plug and cpufreq needed; each mode restored after)."),
        image: int = typer.Option(64, "--image", "--size", min=1, help="Input size of the step --measure times."),
        power_sensor: list[str] | None = typer.Option(None, "--power-sensor", help="With --measure: a sysfs power "
                                                      "monitor as `bench device` takes it; repeat to sum rails."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The mode of least energy per epoch that meets the deadline and the power cap, from <= 6 profiled modes."""
    from ..power.advice import advise_device

    report = advise_device(device, model, batch, samples, deadline_s=deadline, power_cap_w=power_cap,
                           profiles_file=profiles, simulate_seed=simulate_seed,
                           measure_size=image if measure else None, power_sensors=power_sensor or ())
    if as_json:
        typer.echo(to_json(report))
        return
    advice = report["advice"]
    mode = advice["mode"]
    energy = "" if advice["energy_j"] is None else f", {advice['energy_j'] / 1e3:.3g} kJ"
    power = "" if advice["power_w"] is None else f", {advice['power_w']:.3g} W"
    console.print(f"{device or 'this board'}: {mode['cores']} cores at {mode['cpu_hz'] / 1e6:.0f} MHz, "
                  f"EMC {mode['emc_hz'] / 1e6:.0f} MHz -> epoch {advice['epoch_time_s']:.4g} s{power}{energy} "
                  f"(predicted; {report['profiles_source']})"
                  + ("; at risk: it meets the constraints only without the safety margin, or not at all"
                     if advice["at_risk"] else ""), highlight=False, markup=False)

