"""The in-situ results table of docs/guide/insitu.md: ``insitu simulate`` deployments judged on the in-situ goals.

Each seed's deployment on the default steep camera with the stand-in detector is simulated at several
``student_seed_offset`` values (the students' training order drawn again), as ``edgetrain insitu simulate --seed S
--student-seed-offset K --json`` runs it without its latency probe (which runs after the scoring and moves no
accuracy). The goals (:mod:`edgetrain.insitu.goals`) are judged on the mean of a seed's offsets: label precision at
coverage, the student's and the oracle student's points over the teacher on the node's views, the student's share of
the oracle's accuracy, the student's points over the teacher at eye level, and per band of the node's elevation the
student's points against the oracle's. The oracle's own margin bounds what any labelling can reach (it learns every
detected crop with its true label). The result holds every report whole.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from edgetrain.insitu.goals import GOAL_COVERAGE, GOAL_POINTS, GOAL_PRECISION, goal_figures, goals_table, mean_figures
from edgetrain.insitu.simulate import QUICK, SimulateConfig, simulate

SEEDS = (0, 1, 2)
OFFSETS = (1, 2, 3)

TITLE = "In-situ deployments against the in-situ goals"


def simulate_report(seed: int, offset: int, quick: bool) -> dict[str, Any]:
    """One deployment's report (quick: ``insitu simulate --quick``'s small world), in a store of its own."""
    config = SimulateConfig(seed=seed, student_seed_offset=offset, latency_probe=False, **(QUICK if quick else {}))
    with tempfile.TemporaryDirectory(prefix="edgetrain-insitu-table-") as store:
        return simulate(config, Path(store) / "store")


def run(quick: bool) -> dict[str, Any]:
    """Every seed at every offset, one after another (quick: seed 0 at offset 1 in the small world)."""
    seeds, offsets = ((0,), (1,)) if quick else (SEEDS, OFFSETS)
    torch.set_num_threads(1)
    runs = []
    for seed in seeds:
        for offset in offsets:
            started = time.perf_counter()
            report = simulate_report(seed, offset, quick)
            runs.append({"seed": seed, "offset": offset, "wall_s": time.perf_counter() - started, "report": report})
    return {"camera": "steep", "detector": "standin", "small_world": quick, "seeds": list(seeds),
            "offsets": list(offsets), "runs": runs}


def seed_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per seed, the mean over its offsets of the accuracies and of the goal figures; then the mean of the seeds."""
    rows = []
    for seed in result["seeds"]:
        reports = [r["report"] for r in result["runs"] if r["seed"] == seed]
        accuracies = {key: sum(float(r[f"{key}_accuracy"]) for r in reports) / len(reports)
                      for key in ("teacher", "student", "oracle_student")}
        rows.append({"seed": str(seed), **accuracies, **mean_figures([goal_figures(r) for r in reports]),
                     "student_points_runs": [goal_figures(r)["student_points"] for r in reports]})
    if len(rows) > 1:
        keys = [key for key in rows[0] if key not in ("seed", "student_points_runs")]
        rows.append({"seed": "mean", **{key: sum(row[key] for row in rows) / len(rows) for key in keys},
                     "student_points_runs": []})
    return rows


def render(result: dict[str, Any]) -> str:
    """The seeds' table (means over offsets), then every run's goals table."""
    lines = [f"| {r['seed']} | {r['teacher']:.3f} | {r['student']:.3f} | {r['oracle_student']:.3f} | "
             f"{r['precision']:.3f} @ {r['coverage']:.3f} | {r['student_points']:+.1f} | {r['ratio']:.3f} | "
             f"{r['eye_points']:+.1f} | {', '.join(f'{p:+.1f}' for p in r['student_points_runs'])} |"
             for r in seed_rows(result)]
    runs = goals_table([(f"seed {r['seed']}, offset {r['offset']}", r["report"]) for r in result["runs"]])
    walls = [r["wall_s"] for r in result["runs"]]
    small = ("**A quick run**: `insitu simulate --quick`'s small world, a student epoch or two: it checks that the "
             "pipeline runs end to end, and its accuracies mean little.\n\n" if result["small_world"] else "")
    return (f"{small}Seeds {', '.join(map(str, result['seeds']))}, each simulated at student seed offsets "
            f"{', '.join(map(str, result['offsets']))}, on the {result['camera']} camera with the "
            f"{result['detector']} detector (`edgetrain insitu simulate --seed S --student-seed-offset K --json`, "
            "without its latency probe). A seed's row is the mean of its offsets. The goals: labels at least "
            f"{GOAL_PRECISION:g} right at {GOAL_COVERAGE:g} coverage, the student +{GOAL_POINTS:g} points over its "
            "teacher on the node's views, at least 0.9 of its oracle, within 2 points of the teacher at eye level."
            "\n\n| seed | teacher | student | oracle | labels @ coverage | student - teacher | student / oracle | "
            "eye level - teacher | student - teacher, each run |\n|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(lines) + "\n\n## Every run\n\n" + runs + "\n\n"
            f"{len(walls)} simulations, {sum(walls) / 60:.1f} minutes in all ({min(walls):.0f}-{max(walls):.0f} s "
            "each, one torch thread).")
