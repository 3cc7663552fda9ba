"""The power-mode advisor, validated two ways: a simulated mode grid, and real modes on this machine.

(a) Simulated: :func:`edgetrain.power.ground_truth.score_device` on every catalog Jetson with a
sourced mode table: random workloads on the board's full synthetic DVFS grid, at most 6 profiled
modes (five corners and the advisor's first pick, NOTE [ Profiling where the answer is ]), the
advisor's final pick against the true best (NOTE [ The ground truth is not the model ]).
(b) Real, time only: modes = torch threads {1, 2} x cgroup v1 CPU quota {25, 50, 75, 100}% of
all CPUs (NOTE [ Thread x quota modes ]); every mode measured ``ROUNDS`` times, the rounds
interleaved so a change in the machine's load falls on every mode alike; ``PROFILED`` modes
fit the model, the others are predicted and held against their measured median step time.
Power is not measured here (no sensor): (b) tests the time model only. Without root or a cgroup v1 cpu
controller (b) says why it is unavailable.
"""

from __future__ import annotations

from typing import Any

from edgetrain.bench.stats import Spread, spread
from edgetrain.power.cgroup_modes import quota_grid, quota_unavailable_reason, time_step_in_mode
from edgetrain.power.ground_truth import score_all
from edgetrain.power.modes import catalog_modes
from edgetrain.power.predict import Profile, choose_profile_modes, fit_mode_model, mape_percent

WORKLOADS = 200  # random workloads per simulated device
SIM_SEEDS = (0, 1, 2)  # the simulated grid's workload draws: seed 0 is the headline, 1 and 2 its spread
MODEL, BATCH, SIZE = "resnet18", 8, 64  # the real modes' workload
STEPS, WARMUP = 5, 2  # timed and warm-up steps per child run
ROUNDS = 3  # interleaved rounds over every real mode
PROFILED = 4  # real modes profiled (<= 6); the rest predicted

TITLE = "The power-mode advisor on simulated and real modes"


def real_validation(model: str, batch: int, size: int, steps: int, warmup: int, rounds: int,
                    profiled: int) -> dict[str, Any]:
    """Measure every thread x quota mode ``rounds`` times, fit on ``profiled`` of them, predict the rest."""
    grid = quota_grid()
    times: dict[str, list[float]] = {mode.name: [] for mode in grid}
    throttled: dict[str, int] = {mode.name: 0 for mode in grid}
    for _ in range(rounds):
        for mode in grid:
            timing = time_step_in_mode(mode, model, batch, size, steps, warmup)
            times[mode.name].extend(timing.step_times_s)
            throttled[mode.name] += timing.nr_throttled
    spreads = {name: spread(values) for name, values in times.items()}
    points = {mode.name: mode.point() for mode in grid}
    chosen = choose_profile_modes(list(points.values()), profiled)
    fitted = fit_mode_model([Profile(p, spreads[p.name].median) for p in chosen], max(p.cpu_hz for p in chosen))
    rows = [{"mode": name, "profiled": points[name] in chosen, "measured_s": spreads[name].to_dict(),
             "predicted_s": fitted.time_s(points[name]), "nr_throttled": throttled[name]} for name in times]
    unseen = [(r["measured_s"]["median"], r["predicted_s"]) for r in rows if not r["profiled"]]
    return {"model": model, "batch": batch, "size": size, "steps_per_run": steps, "warmup": warmup,
            "rounds": rounds, "profiled": len(chosen), "fit": fitted.to_dict(), "rows": rows,
            "unseen_mape_pct": mape_percent(unseen) if unseen else None}


def run(quick: bool) -> dict[str, Any]:
    """(a) at every seed, (b) if this machine allows it (quick: 20 workloads at seed 0; one round of 2 steps)."""
    workloads, seeds = (20, (0,)) if quick else (WORKLOADS, SIM_SEEDS)
    steps, warmup, rounds = (2, 1, 1) if quick else (STEPS, WARMUP, ROUNDS)
    reason = quota_unavailable_reason()
    return {"workloads": workloads,
            "simulated": {str(seed): score_all(sorted(catalog_modes()), workloads, seed) for seed in seeds},
            "real": f"unavailable: {reason}" if reason else real_validation(
                MODEL, BATCH, SIZE, steps, warmup, rounds, PROFILED)}


def render(result: dict[str, Any]) -> str:
    """(a) per device at the first seed, the other seeds' success rates; (b) per mode, then the unseen modes' MAPE."""
    seeds = list(result["simulated"])
    first = result["simulated"][seeds[0]]
    lines = ["## (a) Simulated mode grids (the advisor against the simulator's truth)", "",
             f"{result['workloads']} random workloads per device (seed {seeds[0]}); per workload at most 6 modes "
             "profiled with 2% time and 1% power noise, the advisor's pick held against the truly best mode. Margin "
             "given up: the cases where no mode met the deadline and the cap with the margins.", "",
             "| device | grid modes | profiled | cases | deadline met | power cap met | "
             "within 5% of best energy (on time, under cap) | median energy excess | worst energy excess | "
             "time MAPE | power MAPE | margin given up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in first:
        lines.append(f"| {r['device']} | {r['grid_modes']} | {r['profiled_modes']} | {r['cases']} | "
                     f"{r['deadline_met_pct']:.1f}% | {r['power_cap_met_pct']:.1f}% | "
                     f"{r['within_5pct_of_best_energy_pct']:.1f}% | {r['median_energy_excess_pct']:.1f}% | "
                     f"{r['worst_energy_excess_pct']:.1f}% | "
                     f"{r['time_mape_pct']:.1f}% | {r['power_mape_pct']:.1f}% | {r['at_risk_pct']:.1f}% |")
    if len(seeds) > 1:
        lines += ["", "Within 5% of the best energy at each seed of the workloads' draw:", "",
                  "| device | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "| --- |" + " ---: |" * len(seeds)]
        for k, r in enumerate(first):
            cells = [f"{result['simulated'][s][k]['within_5pct_of_best_energy_pct']:.1f}%" for s in seeds]
            lines.append(f"| {r['device']} | " + " | ".join(cells) + " |")
    real = result["real"]
    lines += ["", "## (b) Real thread x CPU-quota modes on this machine (time only; power not measured)", ""]
    if isinstance(real, str):
        return "\n".join([*lines, real])
    lines += [f"{real['model']}, batch {real['batch']}, {real['size']} px; {real['rounds']} interleaved rounds of "
              f"{real['steps_per_run']} timed steps per mode; {real['profiled']} modes profiled, "
              "the others predicted.",
              "",
              "| mode | profiled | measured step s (median) | IQR | CoV | predicted s | error | throttled periods |",
              "| --- | :---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in real["rows"]:
        m = r["measured_s"]
        error = 100.0 * (r["predicted_s"] - m["median"]) / m["median"]
        cov = Spread.from_dict(m).cov_text
        lines.append(f"| {r['mode']} | {'yes' if r['profiled'] else ''} | {m['median']:.3f} | {m['iqr']:.3f} | "
                     f"{cov} | {r['predicted_s']:.3f} | {error:+.1f}% | {r['nr_throttled']} |")
    lines += ["", f"MAPE over the unseen modes: {real['unseen_mape_pct']:.1f}%."]
    return "\n".join(lines)
