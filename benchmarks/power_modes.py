"""The power-mode advisor, validated two ways: a simulated mode grid, and real modes on this machine.

(a) Simulated: :func:`edgetrain.power.ground_truth.score_device` on every catalog Jetson with a
sourced mode table: random workloads on the board's full synthetic DVFS grid, at most 6 profiled
modes (five corners and the advisor's first pick, NOTE [ Profiling where the answer is ]), the
advisor's final pick against the true best (NOTE [ The ground truth is not the model ]).
(b) Real, time only: modes = torch threads {1, 2} x cgroup v1 CPU quota {25, 50, 75, 100}% of
all CPUs (NOTE [ Thread x quota modes ]); every mode measured ``--rounds`` times, the rounds
interleaved so a change in the machine's load falls on every mode alike; ``--profiled`` modes
fit the model, the others are predicted and held against their measured median step time.
Power is not measured here (no sensor): (b) tests the time model only.

Usage::

    python benchmarks/power_modes.py                 # both tables -> out/power_modes/power_modes.{json,md}
    python benchmarks/power_modes.py --skip-real     # (a) only: no cgroups, no root needed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgetrain.bench.stats import Spread, software_setup, spread
from edgetrain.power.cgroup_modes import quota_grid, quota_unavailable_reason, time_step_in_mode
from edgetrain.power.ground_truth import score_all
from edgetrain.power.modes import catalog_modes
from edgetrain.power.predict import Profile, choose_profile_modes, fit_mode_model, mape_percent
from edgetrain.sysutil.fileio import write_atomic


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


def markdown(report: dict[str, Any]) -> str:
    lines = ["### (a) Simulated mode grids (the advisor against the simulator's truth)", "",
             "| device | grid modes | profiled | cases | deadline met | power cap met | "
             "within 5% of best energy (on time, under cap) | median energy excess | worst energy excess | "
             "time MAPE | power MAPE | margin given up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["simulated"]:
        lines.append(f"| {r['device']} | {r['grid_modes']} | {r['profiled_modes']} | {r['cases']} | "
                     f"{r['deadline_met_pct']:.1f}% | {r['power_cap_met_pct']:.1f}% | "
                     f"{r['within_5pct_of_best_energy_pct']:.1f}% | {r['median_energy_excess_pct']:.1f}% | "
                     f"{r['worst_energy_excess_pct']:.1f}% | "
                     f"{r['time_mape_pct']:.1f}% | {r['power_mape_pct']:.1f}% | {r['at_risk_pct']:.1f}% |")
    real = report["real"]
    lines += ["", "### (b) Real thread x CPU-quota modes on this machine (time only; power not measured)", ""]
    if isinstance(real, str):
        return "\n".join([*lines, real, ""])
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
    lines += ["", f"MAPE over the unseen modes: {real['unseen_mape_pct']:.1f}%", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=200, help="Random workloads per simulated device.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="Timed steps per child run.")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds over every real mode.")
    parser.add_argument("--profiled", type=int, default=4, help="Real modes profiled (<= 6); the rest predicted.")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("out/power_modes"))
    args = parser.parse_args()
    reason = "skipped (--skip-real)" if args.skip_real else quota_unavailable_reason()
    report = {"setup": software_setup(),
              "simulated": score_all(sorted(catalog_modes()), args.workloads, args.seed),
              "real": f"unavailable: {reason}" if reason else real_validation(
                  args.model, args.batch, args.size, args.steps, args.warmup, args.rounds, args.profiled)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "power_modes.json", json.dumps(report, indent=1))
    write_atomic(args.out / "power_modes.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
