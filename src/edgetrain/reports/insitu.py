"""``edgetrain insitu report``: the in-situ service's status lines as a plot of teacher vs student over time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError

__all__ = ["read_status", "plot_status"]


def read_status(path: Path) -> list[dict[str, Any]]:
    """The status records of a service's store directory (its ``status.jsonl``) or of a JSON-lines file."""
    source = path / "status.jsonl" if path.is_dir() else path
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise EdgetrainError(f"cannot read in-situ status lines from {source}: {exc}") from None
    if not any(r.get("event") == "student" for r in records):
        raise EdgetrainError(f"{source} has no student status lines (has the student trained a round yet?)")
    return records


def plot_status(records: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """Two panels against wall-clock minutes: held-out accuracy of teacher and student (promotions marked),
    and the stream's frames and the stored frames. Returns the last student round's figures."""
    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plotting needs matplotlib: pip install 'edgetrain[reports]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(r["time"] for r in records)
    rounds = [r for r in records if r["event"] == "student"]
    chunks = [r for r in records if r["event"] == "chunk"]
    minutes = [(r["time"] - start) / 60 for r in rounds]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(minutes, [r["teacher_accuracy"] for r in rounds], marker=".", label="teacher")
    top.plot(minutes, [r["student_accuracy"] for r in rounds], marker=".", label="student")
    promoted = [(m, r["student_accuracy"]) for m, r in zip(minutes, rounds, strict=True) if r["promoted"]]
    if promoted:
        top.scatter(*zip(*promoted, strict=True), marker="*", s=120, color="green", zorder=3, label="promoted")
    top.set(ylabel="held-out accuracy", title="This camera's held-out stored frames (teacher-consistent labels)")
    if chunks:
        chunk_minutes = [(r["time"] - start) / 60 for r in chunks]
        bottom.plot(chunk_minutes, [r["cursor"] for r in chunks], label="stream frames")
        bottom.plot(chunk_minutes, [r["stored_frames"] for r in chunks], label="stored frames")
    bottom.set(xlabel="minutes (wall clock)", ylabel="frames")
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    last = rounds[-1]
    return {"rounds": len(rounds), "step": last["step"], "teacher_accuracy": last["teacher_accuracy"],
            "student_accuracy": last["student_accuracy"], "promotions": len(promoted)}
