"""A benchmark's results file: what it measured, and where, when and how it was measured.

NOTE [ Results files ]
A figure the documentation states comes from a file a benchmark wrote, never from memory. The file holds the
benchmark's result (plain JSON: a table of rows and whatever summary the benchmark gives) beside its provenance:
the command that reruns it, the commit and whether the tree had changes, the date, the CPU, its cores, the
torch version and threads, and the load average while it ran, since a shared 2-core machine's timings move
with its load. A results page is made from the file alone, so the committed page and a regeneration from the
committed file must be equal. The file carries ``RESULTS_FORMAT``; a file of another format is refused, naming
the command that rewrites it, rather than read as if it were this one.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from ..sysutil.fileio import write_atomic

__all__ = ["RESULTS_FORMAT", "BenchmarkResult", "provenance", "read_result", "write_result"]

RESULTS_FORMAT = 1


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark's results file: its name, its result and the provenance of the run that made it."""

    name: str
    result: dict[str, Any]
    provenance: dict[str, Any]


def provenance(command: str, root: Path | None = None, outputs: tuple[str, ...] = ()) -> dict[str, Any]:
    """Where and how a benchmark ran: ``command`` reruns it; the rest is read off this machine now.

    ``root`` is the repository whose commit is recorded (the working directory by default); outside a git
    checkout the commit is None. ``dirty`` says whether its tracked files differ from that commit, apart from
    ``outputs`` (folders under ``root``): the results that a run of several benchmarks has written so far.
    """
    import torch

    from ..profiling.host import cpu_model

    commit, dirty = _commit(root or Path.cwd(), outputs)
    return {"command": command, "commit": commit, "dirty": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu_model() or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def _commit(root: Path, outputs: tuple[str, ...] = ()) -> tuple[str | None, bool | None]:
    """The checkout's HEAD and whether its tracked files, ``outputs`` aside, differ from it; (None, None) outside
    git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
        aside = [f":(exclude){folder}" for folder in outputs]
        changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *aside],
                                 cwd=root, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head, bool(changes)


def write_result(path: Path, benchmark: BenchmarkResult) -> None:
    """Write ``benchmark`` to ``path`` atomically, as strict JSON (no NaN)."""
    record = {"format": RESULTS_FORMAT, "benchmark": benchmark.name, "result": benchmark.result,
              "provenance": benchmark.provenance}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


def read_result(path: Path) -> BenchmarkResult:
    """Read a results file; raises :class:`EdgetrainError` naming the file for one that is not of this format."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgetrainError(f"{path}: no such results file") from None
    except (OSError, ValueError) as exc:
        raise EdgetrainError(f"{path}: not a results file ({exc})") from None
    if not isinstance(record, dict) or not {"format", "benchmark", "result", "provenance"} <= record.keys():
        raise EdgetrainError(f"{path}: not a results file (it needs format, benchmark, result and provenance)")
    if record["format"] != RESULTS_FORMAT:
        raise EdgetrainError(f"{path}: results format {record['format']!r}, this edgetrain reads format "
                             f"{RESULTS_FORMAT}: rerun `python -m benchmarks run {record['benchmark']}`")
    return BenchmarkResult(record["benchmark"], record["result"], record["provenance"])
