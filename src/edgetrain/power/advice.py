"""``edgetrain power advise``: profiles in, a mode out (NOTE [ The mode model ]).

The profiles file holds at most six modes measured on the board (with ``edgetrain power run`` and
a power meter, or ``bench device``'s sensor readings)::

    {"model": "resnet18", "batch": 8,
     "profiles": [{"cores": 4, "cpu_hz": 1.479e9, "emc_hz": 1.6e9, "time_s": 0.81, "power_w": 7.9}, ...]}

``power_w`` may be missing (no meter): the advice then minimises the epoch time instead of the
energy. ``--measure`` profiles the modes on this board itself (:func:`measure_board`): its grid is
its CPU hot-plug cores x its cpufreq clocks, each chosen mode applied with
:func:`~edgetrain.power.control.applied_mode` (restored after), the step timed by
:func:`~edgetrain.profiling.device_probe.probe_compute` on as many threads as cores, the power read by
``bench device``'s sensors when given. ``--simulate-seed`` profiles a synthetic workload of the
simulator instead, to show the advisor at work where no board is at hand; its figures are not
measurements.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from .control import Board, ModeRequest, applied_mode
from .ground_truth import POWER_NOISE, TIME_NOISE, SimWorkload, device_grid, noisy, true_power_w, true_time_s
from .modes import parse_cpu_list
from .predict import ModePoint, Profile, advise, fit_mode_model, profile_adaptively

__all__ = ["MAX_PROFILES", "advise_device", "board_grid", "measure_board", "read_profiles"]

MAX_PROFILES = 6


def read_profiles(path: Path, model: str, batch: int) -> list[Profile]:
    """The profiles of a profiles file, checked against the model and batch they must describe.

    Raises:
        EdgetrainError: unreadable JSON, a missing key, another model or batch, or more than six modes.
    """
    try:
        data = json.loads(path.read_text())
        rows = data["profiles"]
        profiles = [Profile(ModePoint(f"profile {i}", int(r["cores"]), float(r["cpu_hz"]), float(r.get("emc_hz", 1e9))),
                            float(r["time_s"]), None if r.get("power_w") is None else float(r["power_w"]))
                    for i, r in enumerate(rows)]
    except (ValueError, KeyError, TypeError) as exc:
        raise EdgetrainError(f"{path}: not a profiles file ({type(exc).__name__}: {exc}); docs/guide/power.md gives "
                             "the format") from None
    if (data.get("model"), data.get("batch")) != (model, batch):
        raise EdgetrainError(f"{path} profiles {data.get('model')} at batch {data.get('batch')}, not {model} at "
                             f"batch {batch}")
    if not 2 <= len(profiles) <= MAX_PROFILES:
        raise EdgetrainError(f"{path}: give 2 to {MAX_PROFILES} profiled modes, got {len(profiles)}")
    return profiles


def _simulated_profiles(grid: list[ModePoint], budget_w: float, seed: int, steps_per_epoch: int,
                        deadline_s: float | None, power_cap_w: float | None) -> list[Profile]:
    rng = random.Random(seed)
    work = SimWorkload.draw(rng, budget_w, max(m.cpu_hz for m in grid), max(m.emc_hz for m in grid))
    return profile_adaptively(
        grid, lambda m: Profile(m, noisy(rng, true_time_s(work, m), TIME_NOISE),
                                noisy(rng, true_power_w(work, m), POWER_NOISE)),
        steps_per_epoch, deadline_s=deadline_s, power_cap_w=power_cap_w, count=MAX_PROFILES)


StepProbe = Callable[[int], tuple[float, float | None]]  # threads -> (step seconds, mean power W or None)


def board_grid(board: Board) -> list[ModePoint]:
    """This board's modes: 1..N online cores x the clocks cpufreq lists (the memory clock is not a knob here).

    Raises:
        PowerControlUnavailable: no CPU hot-plug or no cpufreq clock list on this board.
    """
    from .control import PowerControlUnavailable

    reason = board.unavailable_reason(ModeRequest(online_cores=1, cpu_max_freq_hz=1.0))
    freq = board.cpu_dir / "cpu0/cpufreq/scaling_available_frequencies"
    clocks_khz = sorted(int(x) for x in (board.read(freq) or "").split())
    if reason is None and not clocks_khz:
        reason = f"no clock list in {freq}"
    if reason is not None:
        raise PowerControlUnavailable(f"unavailable: {reason}")
    cores = len(parse_cpu_list(board.read(board.cpu_dir / "present") or "0"))
    return [ModePoint(f"{c}c@{khz / 1e3:g}MHz", c, khz * 1e3) for c in range(1, cores + 1) for khz in clocks_khz]


def measure_board(grid: Sequence[ModePoint], probe: StepProbe, board: Board | None = None, *, steps_per_epoch: int = 1,
                  deadline_s: float | None = None, power_cap_w: float | None = None) -> list[Profile]:
    """Apply at most six modes of ``grid`` in turn (restored after each) and probe a step in each; the modes
    are chosen by :func:`~edgetrain.power.predict.profile_adaptively` for the deadline and cap given."""

    def measure(mode: ModePoint) -> Profile:
        with applied_mode(ModeRequest(online_cores=mode.cores, cpu_max_freq_hz=mode.cpu_hz), board):
            time_s, power_w = probe(mode.cores)
        return Profile(mode, time_s, power_w)

    return profile_adaptively(grid, measure, steps_per_epoch, deadline_s=deadline_s, power_cap_w=power_cap_w,
                              count=MAX_PROFILES)


def _step_probe(model: str, batch: int, size: int, sensors: Sequence[str]) -> StepProbe:
    """A :data:`StepProbe` on this machine: ``bench device``'s compute probe on ``threads`` threads."""
    import statistics

    import torch

    from ..profiling.device_probe import PowerMeter, PowerRail, probe_compute

    meter = PowerMeter(tuple(PowerRail.parse(s) for s in sensors)) if sensors else None

    def probe(threads: int) -> tuple[float, float | None]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            result = probe_compute(model, batch, size, repeats=3, meter=meter)
        finally:
            torch.set_num_threads(before)
        return result.step_s, statistics.fmean(result.power_samples_w) if result.power_samples_w else None

    return probe


def advise_device(device: str | None, model: str, batch: int, samples: int, *, deadline_s: float | None = None,
                  power_cap_w: float | None = None, profiles_file: Path | None = None,
                  simulate_seed: int | None = None, measure_size: int | None = None,
                  power_sensors: Sequence[str] = ()) -> dict[str, Any]:
    """Fit the mode model to the profiles and advise a mode for one epoch of ``samples``.

    The grid is ``device``'s synthetic one (:func:`~edgetrain.power.ground_truth.device_grid`), or, when
    measuring (``measure_size``: the input size of the step), this board's own (:func:`board_grid`).

    Raises:
        EdgetrainError: not exactly one of a profiles file, a simulation seed, a measurement; a bad
            profiles file; ``unavailable: ...`` when measuring on a board without the knobs.
    """
    if sum(x is not None for x in (profiles_file, simulate_seed, measure_size)) != 1:
        raise EdgetrainError("give one of --profiles FILE (modes measured on the board), --measure (profile this "
                             "board's modes now) or --simulate-seed N (a synthetic workload)")
    steps = math.ceil(samples / batch)
    if measure_size is not None:
        grid = board_grid(Board())
        profiles = measure_board(grid, _step_probe(model, batch, measure_size, power_sensors), steps_per_epoch=steps,
                                 deadline_s=deadline_s, power_cap_w=power_cap_w)
        source = f"measured on this board ({len(profiles)} modes applied in turn and restored)"
    elif device is None:
        raise EdgetrainError("--device is needed with --profiles or --simulate-seed")
    elif profiles_file is not None:
        grid = device_grid(device)[0]
        profiles, source = read_profiles(profiles_file, model, batch), f"fitted to {profiles_file}"
    else:
        grid, budget_w = device_grid(device)
        profiles = _simulated_profiles(grid, budget_w, simulate_seed or 0, steps, deadline_s, power_cap_w)
        source = f"fitted to a simulated workload, seed {simulate_seed}: a demonstration, not a measurement"
    fitted = fit_mode_model(profiles, max(m.cpu_hz for m in grid))
    advice = advise(fitted, grid, steps, deadline_s=deadline_s, power_cap_w=power_cap_w)
    return {"device": device, "model": model, "batch": batch, "steps_per_epoch": steps, "grid_modes": len(grid),
            "deadline_s": deadline_s, "power_cap_w": power_cap_w, "profiles_source": source,
            "profiles": [{**p.mode.to_dict(), "time_s": p.time_s, "power_w": p.power_w} for p in profiles],
            "fit": fitted.to_dict(), "advice": advice.to_dict()}
