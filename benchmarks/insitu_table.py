"""The in-situ results table of docs/guide/insitu.md from ``edgetrain insitu simulate --json`` reports.

Usage::

    for s in 0 1 2; do edgetrain insitu simulate --seed $s --json --store out/insitu/s$s > out/insitu/seed$s.json; done
    python benchmarks/insitu_table.py out/insitu/seed*.json

Prints one markdown row per report (named after its file), then the mean over them; the last two
columns are the label precision and the student before the self-training rounds (``--rounds``).
Reports of a cross-fitted round (``--round-folds``) get a second table: the precision of the last
round's labels on its surest tracks holding 1.0, 0.8 and 0.5 of the stored detections.

``--goals`` prints instead the in-situ goals per report and on their mean (the mean of several
``--student-seed-offset`` runs of one seed is what the goals are judged on): label precision at coverage, the student's
and the oracle student's points over the teacher on the node's views, the student's share of the oracle's accuracy,
the student's points over the teacher at eye level, and per band of the node's elevation the student's points
against the oracle's. The oracle's own margin bounds what any labelling can reach (the oracle learns every detected
crop with its true label)::

    python benchmarks/insitu_table.py --goals out/runs/d7o*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = (
    ("teacher", "teacher_accuracy"), ("student", "student_accuracy"), ("oracle", "oracle_student_accuracy"),
    ("student / oracle", None), ("teacher eye", "teacher_accuracy_eye_level"),
    ("student eye", "student_accuracy_eye_level"), ("label precision", "pseudo_label_precision"),
    ("label coverage", "pseudo_label_coverage"), ("teacher on stream", "teacher_accuracy_on_stream"),
    ("frames / trusted frame", "frames_per_trusted_frame"), ("bytes / frame", None),
    ("label precision, round 0", None), ("student, round 0", None),
)


def _row(report: dict[str, Any]) -> list[float]:
    values = []
    for _, key in COLUMNS:
        if key is not None:
            values.append(float(report[key]))
    values.insert(3, report["student_accuracy"] / report["oracle_student_accuracy"])
    values.append(report["store_bytes"] / max(report["stored_frames"], 1))
    first = report["self_training"][0]
    values += [first["pseudo_label_precision"], first["student_accuracy"]]
    return values


# The in-situ goals on the steep camera (docs/guide/insitu.md, the goals' tables).
GOAL_PRECISION, GOAL_COVERAGE, GOAL_POINTS, GOAL_RATIO, GOAL_EYE_POINTS = 0.95, 0.80, 25.0, 0.90, 2.0


def goal_figures(report: dict[str, Any]) -> dict[str, float]:
    """One report's figures against the goals: precision and coverage as fractions, margins in points."""
    teacher, student, oracle = (float(report[f"{m}_accuracy"]) for m in ("teacher", "student", "oracle_student"))
    figures = {"precision": float(report["pseudo_label_precision"]), "coverage": float(report["pseudo_label_coverage"]),
               "student_points": 100 * (student - teacher), "oracle_points": 100 * (oracle - teacher),
               "ratio": student / oracle,
               "eye_points": 100 * (report["student_accuracy_eye_level"] - report["teacher_accuracy_eye_level"])}
    oracle_bands = report["oracle_student_accuracy_by_elevation"]
    for band, accuracy in report["student_accuracy_by_elevation"].items():
        if band in oracle_bands:
            figures[f"student_minus_oracle_{band}"] = 100 * (accuracy - oracle_bands[band])
    return figures


def goals_met(figures: dict[str, float]) -> dict[str, bool]:
    """Which goals ``figures`` (one report's or a mean's) meet; ``oracle_reaches_points``: whether a student equal to
    its oracle would meet the points goal (if not, no labelling can)."""
    return {"labels": figures["precision"] >= GOAL_PRECISION and figures["coverage"] >= GOAL_COVERAGE,
            "points": figures["student_points"] >= GOAL_POINTS, "ratio": figures["ratio"] >= GOAL_RATIO,
            "eye": abs(figures["eye_points"]) <= GOAL_EYE_POINTS,
            "oracle_reaches_points": figures["oracle_points"] >= GOAL_POINTS}


def mean_figures(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each figure over ``rows`` (a band missing from a row is averaged over the rows that have it)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


def goals_table(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """The goals table (markdown) of ``reports``, one row each and their mean."""
    rows = [(name, goal_figures(report)) for name, report in reports]
    rows.append(("mean", mean_figures([figures for _, figures in rows])))
    bands = sorted((key for key in rows[-1][1] if key.startswith("student_minus_oracle_")),
                   key=lambda key: float(key.removeprefix("student_minus_oracle_").split("-")[0]))  # shallow first
    head = ["run", "labels @ coverage", "student - teacher", "oracle - teacher", "student / oracle", "eye - teacher",
            *(f"student - oracle, {key.removeprefix('student_minus_oracle_')}°" for key in bands), "goals met",
            f"oracle ≥ +{GOAL_POINTS:g}"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, f in rows:
        met = goals_met(f)
        cells = [name, f"{f['precision']:.3f} @ {f['coverage']:.3f}", f"{f['student_points']:+.1f}",
                 f"{f['oracle_points']:+.1f}", f"{f['ratio']:.3f}", f"{f['eye_points']:+.1f}",
                 *(f"{f[key]:+.1f}" if key in f else "" for key in bands),
                 ", ".join(goal for goal, ok in met.items() if ok and goal != "oracle_reaches_points") or "none",
                 "yes" if met["oracle_reaches_points"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    if paths[:1] == ["--goals"]:
        if len(paths) < 2:
            sys.exit("usage: python benchmarks/insitu_table.py --goals REPORT.json ...")
        print(goals_table([(Path(path).stem, json.loads(Path(path).read_text())) for path in paths[1:]]))
        return
    if not paths:
        sys.exit("usage: python benchmarks/insitu_table.py [--goals] REPORT.json ...")
    print("| run | " + " | ".join(name for name, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    reports = [(Path(path).stem, json.loads(Path(path).read_text())) for path in paths]
    rows = []
    for name, report in reports:
        rows.append(_row(report))
        print(f"| {name} | " + " | ".join(f"{v:.3f}" if v < 10 else f"{v:.0f}" for v in rows[-1]) + " |")
    mean = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
    print("| mean | " + " | ".join(f"{v:.3f}" if v < 10 else f"{v:.0f}" for v in mean) + " |")
    last_rounds = {name: report["self_training"][-1] for name, report in reports}
    ranked = {name: row for name, row in last_rounds.items() if "precision_at_0.8" in row}
    if ranked:
        print("\n| run | label precision, surest 1.0 | 0.8 | 0.5 |\n|---|---|---|---|")
        for name, row in ranked.items():
            print(f"| {name} | " + " | ".join(f"{row[f'precision_at_{c}']:.3f}" for c in ("1", "0.8", "0.5")) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
