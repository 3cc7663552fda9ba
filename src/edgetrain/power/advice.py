"""``edgetrain power advise``: profiles in, a mode out (NOTE [ The mode model ]).

The profiles file holds at most six modes measured on the board (with ``edgetrain power run`` and
a power meter, or ``bench device``'s sensor readings)::

    {"model": "resnet18", "batch": 8,
     "profiles": [{"cores": 4, "cpu_hz": 1.479e9, "emc_hz": 1.6e9, "time_s": 0.81, "power_w": 7.9}, ...]}

``power_w`` may be missing (no meter): the advice then minimises the epoch time instead of the
energy. ``--simulate-seed`` profiles a synthetic workload of the simulator instead, to show the
advisor at work where no board is at hand; its figures are not measurements.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from .predict import ModePoint, Profile, advise, choose_profile_modes, fit_mode_model
from .simulate import POWER_NOISE, TIME_NOISE, SimWorkload, device_grid, noisy, true_power_w, true_time_s

__all__ = ["MAX_PROFILES", "advise_device", "read_profiles"]

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
        raise EdgetrainError(f"{path}: not a profiles file ({type(exc).__name__}: {exc}); docs/power.md gives "
                             "the format") from None
    if (data.get("model"), data.get("batch")) != (model, batch):
        raise EdgetrainError(f"{path} profiles {data.get('model')} at batch {data.get('batch')}, not {model} at "
                             f"batch {batch}")
    if not 2 <= len(profiles) <= MAX_PROFILES:
        raise EdgetrainError(f"{path}: give 2 to {MAX_PROFILES} profiled modes, got {len(profiles)}")
    return profiles


def _simulated_profiles(grid: list[ModePoint], budget_w: float, seed: int) -> list[Profile]:
    rng = random.Random(seed)
    work = SimWorkload.draw(rng, budget_w, max(m.cpu_hz for m in grid), max(m.emc_hz for m in grid))
    return [Profile(m, noisy(rng, true_time_s(work, m), TIME_NOISE), noisy(rng, true_power_w(work, m), POWER_NOISE))
            for m in choose_profile_modes(grid, MAX_PROFILES)]


def advise_device(device: str, model: str, batch: int, samples: int, *, deadline_s: float | None = None,
                  power_cap_w: float | None = None, profiles_file: Path | None = None,
                  simulate_seed: int | None = None) -> dict[str, Any]:
    """Fit the mode model to the profiles and advise a mode of ``device``'s grid for one epoch of ``samples``.

    Raises:
        EdgetrainError: neither or both of a profiles file and a simulation seed; a bad profiles file.
    """
    if (profiles_file is None) == (simulate_seed is None):
        raise EdgetrainError("give --profiles FILE (modes measured on the board) or --simulate-seed N (a synthetic "
                             "workload); measuring the modes here is unavailable: this machine has no power modes")
    grid, budget_w = device_grid(device)
    if profiles_file is not None:
        profiles, source = read_profiles(profiles_file, model, batch), f"fitted to {profiles_file}"
    else:
        profiles = _simulated_profiles(grid, budget_w, simulate_seed or 0)
        source = f"fitted to a simulated workload, seed {simulate_seed}: a demonstration, not a measurement"
    fitted = fit_mode_model(profiles, max(m.cpu_hz for m in grid))
    steps = math.ceil(samples / batch)
    advice = advise(fitted, grid, steps, deadline_s=deadline_s, power_cap_w=power_cap_w)
    return {"device": device, "model": model, "batch": batch, "steps_per_epoch": steps, "grid_modes": len(grid),
            "deadline_s": deadline_s, "power_cap_w": power_cap_w, "profiles_source": source,
            "profiles": [{**p.mode.to_dict(), "time_s": p.time_s, "power_w": p.power_w} for p in profiles],
            "fit": fitted.to_dict(), "advice": advice.to_dict()}
