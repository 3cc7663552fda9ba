"""The in-situ results table of docs/insitu.md from ``edgetrain insitu simulate --json`` reports.

Usage::

    for s in 0 1 2; do edgetrain insitu simulate --seed $s --json --store out/insitu/s$s > out/insitu/seed$s.json; done
    python benchmarks/insitu_table.py out/insitu/seed*.json

Prints one markdown row per report (named after its file), then the mean over them; the last two
columns are the label precision and the student before the self-training rounds (``--rounds``).
Reports of a cross-fitted round (``--round-folds``) get a second table: the precision of the last
round's labels on its surest tracks holding 1.0, 0.8 and 0.5 of the stored detections.
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


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit("usage: python benchmarks/insitu_table.py REPORT.json ...")
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
