"""The in-situ goals, judged on ``insitu simulate`` reports (docs/guide/insitu.md, its results).

On the steep camera the goals are: pseudo-labels at least :data:`GOAL_PRECISION` right at
:data:`GOAL_COVERAGE` of the stream's detections; the student :data:`GOAL_POINTS` points above its teacher on the
node's views and at least :data:`GOAL_RATIO` of its oracle's accuracy (the oracle learns every detected crop with its
true label, so its margin bounds what any labelling can reach); and no forgetting: the student within
:data:`GOAL_EYE_POINTS` points of the teacher at eye level. A seed is judged on the mean of several
``student_seed_offset`` runs: one run's figures move with the students' training order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["GOAL_COVERAGE", "GOAL_EYE_POINTS", "GOAL_POINTS", "GOAL_PRECISION", "GOAL_RATIO", "goal_figures",
           "goals_met", "goals_table", "mean_figures"]

GOAL_PRECISION = 0.95
GOAL_COVERAGE = 0.80
GOAL_POINTS = 25.0
GOAL_RATIO = 0.90
GOAL_EYE_POINTS = 2.0
_BAND = "student_minus_oracle_"


def goal_figures(report: Mapping[str, Any]) -> dict[str, float]:
    """One report's figures against the goals: precision and coverage as fractions, margins in points.

    ``student_minus_oracle_<band>``: the student's accuracy less its oracle's on the node's views in each band of
    elevation (degrees) that both report.
    """
    teacher, student, oracle = (float(report[f"{m}_accuracy"]) for m in ("teacher", "student", "oracle_student"))
    figures = {"precision": float(report["pseudo_label_precision"]),
               "coverage": float(report["pseudo_label_coverage"]),
               "student_points": 100 * (student - teacher), "oracle_points": 100 * (oracle - teacher),
               "ratio": student / oracle if oracle else float("nan"),  # an oracle that learnt nothing: no ratio
               "eye_points": 100 * (float(report["student_accuracy_eye_level"])
                                    - float(report["teacher_accuracy_eye_level"]))}
    oracle_bands = report["oracle_student_accuracy_by_elevation"]
    for band, accuracy in report["student_accuracy_by_elevation"].items():
        if band in oracle_bands:
            figures[f"{_BAND}{band}"] = 100 * (float(accuracy) - float(oracle_bands[band]))
    return figures


def goals_met(figures: Mapping[str, float]) -> dict[str, bool]:
    """Which goals ``figures`` (one report's or a mean's) meet; ``oracle_reaches_points``: whether a student equal to
    its oracle would meet the points goal (if not, no labelling can)."""
    return {"labels": figures["precision"] >= GOAL_PRECISION and figures["coverage"] >= GOAL_COVERAGE,
            "points": figures["student_points"] >= GOAL_POINTS, "ratio": figures["ratio"] >= GOAL_RATIO,
            "eye": abs(figures["eye_points"]) <= GOAL_EYE_POINTS,
            "oracle_reaches_points": figures["oracle_points"] >= GOAL_POINTS}


def mean_figures(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each figure over ``rows`` (a band missing from a row is averaged over the rows that have it).

    The mean ratio is the mean of the rows' ratios, not the ratio of their mean accuracies.
    """
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


def goals_table(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The goals table (markdown) of named ``reports``: one row each, then their mean.

    Columns: labels @ coverage, the student's and the oracle's points over the teacher, student / oracle, eye level
    over the teacher, the student less its oracle per band of elevation (shallow first; empty where a report has no
    such band), the goals met and whether the oracle reaches the points goal.
    """
    rows = [(name, goal_figures(report)) for name, report in reports]
    rows.append(("mean", mean_figures([figures for _, figures in rows])))
    bands = sorted((key for key in rows[-1][1] if key.startswith(_BAND)),
                   key=lambda key: float(key.removeprefix(_BAND).split("-")[0]))
    head = ["run", "labels @ coverage", "student - teacher", "oracle - teacher", "student / oracle", "eye - teacher",
            *(f"student - oracle, {key.removeprefix(_BAND)}°" for key in bands), "goals met",
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
