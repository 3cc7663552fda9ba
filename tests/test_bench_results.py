"""Results files and the benchmarks' entry point: provenance kept, pages made from files alone, bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS
from edgetrain.bench import RESULTS_FORMAT, BenchmarkResult, provenance, read_result, write_result
from edgetrain.errors import EdgetrainError

ROOT = Path(__file__).resolve().parent.parent


def _benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


def test_a_results_file_reads_back_as_written(tmp_path: Path) -> None:
    # Prepare
    record = BenchmarkResult("demo", {"table": [{"model": "resnet18", "ratio": 0.9}]},
                             provenance("python -m benchmarks run demo", ROOT))
    # Execute
    write_result(tmp_path / "demo.json", record)
    # Assert: the same record, and the provenance a reader of a figure needs
    assert read_result(tmp_path / "demo.json") == record
    assert {"command", "commit", "dirty", "date", "cpu", "cores", "torch", "torch_threads",
            "load_average"} <= record.provenance.keys()
    assert len(record.provenance["commit"]) == 40 and len(record.provenance["load_average"]) == 3


def test_a_results_file_of_another_format_is_refused_naming_the_rerun(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": RESULTS_FORMAT + 1, "benchmark": "optimal_speed", "result": {},
                                "provenance": {}}))
    with pytest.raises(EdgetrainError, match=r"old\.json: results format 2.*python -m benchmarks run optimal_speed"):
        read_result(path)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(EdgetrainError, match=r"bad\.json: not a results file"):
        read_result(tmp_path / "bad.json")


def test_an_unknown_benchmark_is_one_line_and_exit_2() -> None:
    done = _benchmarks("run", "optimal_speed", "no_such_benchmark")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: unknown benchmark 'no_such_benchmark'; valid names: {', '.join(BENCHMARKS)}"]
    assert "running" not in done.stderr   # refused before the first benchmark ran


def test_the_committed_results_pages_are_their_files() -> None:
    # Every page under docs/results/ that a registered benchmark makes equals a regeneration from its committed file.
    done = _benchmarks("pages", "--check")
    assert done.returncode == 0, done.stderr


def _readme_row(claim: str) -> str:
    """The README's results row that starts with ``claim``."""
    [row] = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| {claim}")]
    return row


def test_the_readmes_fine_tuning_figures_are_the_results_files() -> None:
    # Prepare: the committed results of `python -m benchmarks run update_schemes`, the README's row citing them
    rows = read_result(ROOT / "benchmarks" / "results" / "update_schemes.json").result["rows"]
    row = _readme_row("fine-tuning the last stages")
    by_scheme = {r["scheme"]: r for r in rows if (r["model"], r["batch"], r["image"]) == ("mobilenet_v2", 8, 128)}
    full = by_scheme["all"]["plain"]["measured_peak_bytes"]

    # Execute: the figures as the results page computes them
    last = [full / by_scheme[f"last:{k}"]["plain"]["measured_peak_bytes"] for k in (1, 2, 4)]   # the last 1-4
    bias = full / by_scheme["bias"]["least"]["measured_peak_bytes"]

    # Assert
    assert f"{min(last):.1f}-{max(last):.1f}x below full fine-tuning's plain step" in row, row
    assert f"bias-only {bias:.2f}x with a plan" in row, row
