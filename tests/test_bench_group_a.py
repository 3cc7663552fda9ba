"""The blocked-import environment command_time uses, and the pages of command_time and data_stall."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import command_time, data_stall
from edgetrain.bench.stats import spread
from edgetrain.sysutil.imports import blocking_environment

ROOT = Path(__file__).resolve().parents[1]


def test_a_blocked_module_cannot_be_imported_and_others_can(tmp_path: Path) -> None:
    env = blocking_environment({"sqlite3"}, tmp_path)
    blocked = subprocess.run([sys.executable, "-c", "import sqlite3.dbapi2"], env=env, capture_output=True, text=True)
    allowed = subprocess.run([sys.executable, "-c", "import csv"], env=env, capture_output=True, text=True)

    assert blocked.returncode != 0 and "No module named 'sqlite3' (blocked" in blocked.stderr
    assert allowed.returncode == 0, allowed.stderr


def test_command_time_page_gives_each_command_and_the_jit_ratio() -> None:
    commands = [{"name": name, "command": " ".join(["edgetrain", *args]), "unimportable": list(blocked),
                 "guide": guide, "wall_s": spread([cpu + 0.5]).to_dict(), "cpu_s": spread([cpu]).to_dict()}
                for (name, (args, blocked, guide)), cpu in zip(command_time.COMMANDS.items(), [7.0, 8.0, 20.0],
                                                               strict=True)]
    page = command_time.render({"rounds": 1, "commands": commands,
                                "memory_answer": {"total_bytes": 3 * 2**30, "model": "resnet152", "batch": 50,
                                                  "size": 1500}})

    assert "| `edgetrain memory --model resnet152 --batch 50 --image 1500` | - | 7.00 s | 7.50 s |" in page
    assert "| numba, llvmlite | 20.00 s |" in page
    assert "answers 3.0 GiB" in page and "takes 2.5x the CPU time" in page


def test_committed_results_pages_cite_measured_figures() -> None:
    result = json.loads((ROOT / "benchmarks" / "results" / "data_stall.json").read_text())["result"]
    page = data_stall.render(result)

    assert [row["workers"] for row in result["rows"]] == list(data_stall.WORKERS)
    assert sum(row["recommended"] for row in result["rows"]) == result["repeats"]
    assert f"medians over {result['repeats']} analyses" in page
