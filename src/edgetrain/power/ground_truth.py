"""A ground-truth simulator of training steps over a board's full mode grid, to score the advisor against.

NOTE [ The ground truth is not the model ]
Each catalog Jetson with a sourced mode table gets a synthetic DVFS grid: 1..N cores (N its
largest mode's online cores) x 8 CPU clocks from 30% to 100% of its highest mode clock x 4 EMC
clocks from 25% to 100% of its sourced EMC cap (one EMC clock where no cap is sourced). The grid's
bounds are the sourced figures; the steps between them are not a board's table, they are the
simulator's. A random workload on it has

* time: ``serial / f + max(tc, tm) + 0.3 min(tc, tm)`` with ``tc = parallel / (f x c / (1 + a (c - 1)))``
  (an Amdahl-style loss ``a`` per extra core) and ``tm = bytes / (8 B x emc)``: a smooth roofline
  whose compute and memory parts overlap partly;
* power: ``idle + c x k_core x u x f v^2 + k_leak x c x v + k_mem x (emc / emc_top) x m``,
  ``v = 0.55 + 0.45 f`` (a voltage line other than the predictor's), ``u``/``m`` the time shares
  spent computing / moving memory, constants scaled to the board's largest sourced budget;
* multiplicative noise on every *measured* profile (2% time, 1% power), none on the truth.

So the predictor (NOTE [ The mode model ]) fits a different, simpler form, as it would a real
board; the score says how far that costs it. Nothing here is a measurement of a board.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .modes import modes_for_device
from .predict import ModePoint, Profile, advise, fit_mode_model, mape_percent, profile_adaptively

__all__ = ["SimWorkload", "device_grid", "noisy", "score_all", "score_device", "true_power_w", "true_time_s"]

CPU_LEVELS = 8
EMC_LEVELS = (0.25, 0.5, 0.75, 1.0)
BYTES_PER_EMC_CYCLE = 8.0
TIME_NOISE, POWER_NOISE = 0.02, 0.01


def device_grid(device: str) -> tuple[list[ModePoint], float]:
    """A catalog Jetson's synthetic full mode grid (NOTE [ The ground truth is not the model ]) and its budget W."""
    modes = modes_for_device(device)
    cores = max(m.online_cores or 1 for m in modes)
    top_hz = max(m.cpu_max_freq_hz or 0.0 for m in modes)
    emc_caps = [m.emc_max_freq_hz for m in modes if m.emc_max_freq_hz is not None]
    emc_levels = [level * max(emc_caps) for level in EMC_LEVELS] if emc_caps else [1e9]
    budgets = [m.budget_w for m in modes if m.budget_w is not None]
    budget_w = max(budgets) if budgets else 2.5 * cores
    grid = [ModePoint(f"{c}c@{f / 1e6:.0f}MHz/emc{e / 1e6:.0f}", c, f, e)
            for c in range(1, cores + 1)
            for f in (top_hz * (0.3 + 0.7 * i / (CPU_LEVELS - 1)) for i in range(CPU_LEVELS))
            for e in emc_levels]
    return grid, budget_w


@dataclass(frozen=True)
class SimWorkload:
    """One random training step (gigacycles, gigabytes, the per-core loss) on a board of ``budget_w``."""

    serial_gcycles: float
    parallel_gcycles: float
    gbytes: float
    loss_per_core: float
    budget_w: float
    top_hz: float
    top_emc_hz: float

    @classmethod
    def draw(cls, rng: random.Random, budget_w: float, top_hz: float, top_emc_hz: float) -> SimWorkload:
        return cls(rng.uniform(0.02, 0.3), rng.uniform(0.5, 10.0), rng.uniform(0.05, 4.0), rng.uniform(0.0, 0.08),
                   budget_w, top_hz, top_emc_hz)

    def parts_s(self, mode: ModePoint) -> tuple[float, float, float]:
        f_ghz = mode.cpu_hz / 1e9
        speedup = mode.cores / (1 + self.loss_per_core * (mode.cores - 1))
        return (self.serial_gcycles / f_ghz, self.parallel_gcycles / (f_ghz * speedup),
                self.gbytes / (BYTES_PER_EMC_CYCLE * mode.emc_hz / 1e9))


def true_time_s(work: SimWorkload, mode: ModePoint) -> float:
    serial, compute, memory = work.parts_s(mode)
    return serial + max(compute, memory) + 0.3 * min(compute, memory)


def true_power_w(work: SimWorkload, mode: ModePoint) -> float:
    serial, compute, memory = work.parts_s(mode)
    total = true_time_s(work, mode)
    f = mode.cpu_hz / work.top_hz
    volts = 0.55 + 0.45 * f
    busy, moving = min(1.0, (serial + compute) / total), min(1.0, memory / total)
    b = work.budget_w
    return (0.15 * b + mode.cores * (0.6 * b / 12) * busy * f * volts**2 + 0.1 * b / 12 * mode.cores * volts
            + 0.15 * b * (mode.emc_hz / work.top_emc_hz) * moving)


def noisy(rng: random.Random, value: float, sigma: float) -> float:
    return value * math.exp(rng.gauss(0.0, sigma))


def _measured(rng: random.Random, times: dict[ModePoint, float], powers: dict[ModePoint, float],
              mode: ModePoint) -> Profile:
    """``mode`` profiled: its true time and power with the measurement noise."""
    return Profile(mode, noisy(rng, times[mode], TIME_NOISE), noisy(rng, powers[mode], POWER_NOISE))


def score_device(device: str, workloads: int = 200, seed: int = 0, profiled: int = 6,
                 steps_per_epoch: int = 100) -> dict[str, Any]:
    """The advisor against the simulator's truth over ``workloads`` random workloads on ``device``'s grid.

    Per workload: a deadline drawn in 1.1-3x the truly fastest epoch, a power cap in half of them
    (50-95% of the grid's highest true power), ``profiled`` modes measured with noise and chosen by
    :func:`~edgetrain.power.predict.profile_adaptively`, the model fitted, a mode advised; the
    pick's *true* epoch time, power and energy are held against the truly best feasible mode. A
    pick *succeeds* when it meets the deadline and the cap and its true energy is within 5% of the
    best's. Workloads where no mode truly meets both are left out (``cases`` counts the rest);
    ``at_risk_pct`` says how often the advisor had to give up its margin. The MAPEs are medians
    over the workloads of each one's MAPE over the whole grid, profiled modes included.
    """
    rng = random.Random(seed)
    grid, budget_w = device_grid(device)
    top_hz, top_emc = max(m.cpu_hz for m in grid), max(m.emc_hz for m in grid)
    met = capped = within = at_risk = infeasible = 0
    excess: list[float] = []
    time_mape: list[float] = []
    power_mape: list[float] = []
    profiled_counts: list[int] = []
    for _ in range(workloads):
        work = SimWorkload.draw(rng, budget_w, top_hz, top_emc)
        times = {m: true_time_s(work, m) for m in grid}
        powers = {m: true_power_w(work, m) for m in grid}
        deadline_s = steps_per_epoch * min(times.values()) * rng.uniform(1.1, 3.0)
        cap_w = rng.uniform(0.5, 0.95) * max(powers.values()) if rng.random() < 0.5 else None
        feasible = [m for m in grid
                    if steps_per_epoch * times[m] <= deadline_s and (cap_w is None or powers[m] <= cap_w)]
        best_j = min(steps_per_epoch * times[m] * powers[m] for m in feasible) if feasible else None
        measure = functools.partial(_measured, rng, times, powers)
        profiles = profile_adaptively(grid, measure, steps_per_epoch, deadline_s=deadline_s, power_cap_w=cap_w,
                                      count=profiled)
        profiled_counts.append(len(profiles))
        model = fit_mode_model(profiles, top_hz)
        time_mape.append(mape_percent([(times[m], model.time_s(m)) for m in grid]))
        power_mape.append(mape_percent([(powers[m], model.power_w(m) or 0.0) for m in grid]))
        advice = advise(model, grid, steps_per_epoch, deadline_s=deadline_s, power_cap_w=cap_w)
        if best_j is None:  # no mode truly meets both: not a case to score
            infeasible += 1
            continue
        pick = advice.mode
        at_risk += advice.at_risk
        on_time = steps_per_epoch * times[pick] <= deadline_s
        under_cap = cap_w is None or powers[pick] <= cap_w
        met += on_time
        capped += under_cap
        ratio = steps_per_epoch * times[pick] * powers[pick] / best_j
        excess.append(100.0 * (ratio - 1.0))
        within += on_time and under_cap and ratio <= 1.05
    cases = workloads - infeasible
    return {"device": device, "grid_modes": len(grid), "profiled_modes": max(profiled_counts), "workloads": workloads,
            "cases": cases, "deadline_met_pct": 100.0 * met / cases, "power_cap_met_pct": 100.0 * capped / cases,
            "within_5pct_of_best_energy_pct": 100.0 * within / cases,
            "median_energy_excess_pct": statistics.median(excess) if excess else None,
            "worst_energy_excess_pct": max(excess) if excess else None,
            "time_mape_pct": statistics.median(time_mape), "power_mape_pct": statistics.median(power_mape),
            "at_risk_pct": 100.0 * at_risk / cases}


def score_all(devices: Sequence[str], workloads: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`score_device` for each device."""
    return [score_device(device, workloads, seed) for device in devices]
