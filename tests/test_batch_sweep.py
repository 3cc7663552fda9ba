"""The batch-size sweep: largest batches found exactly, planning extends them, throughput measured."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.reports.batch_sweep import largest_batch


def test_largest_batch_is_exact_for_a_monotone_predicate() -> None:
    for limit in (1, 2, 3, 7, 64, 100, 1000):
        assert largest_batch(lambda b, limit=limit: b <= limit) == limit
    assert largest_batch(lambda b: False) == 0
    assert largest_batch(lambda b: 2 <= b <= 9, start=2) == 9


def test_bench_batch_command_writes_json_and_plot(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "batch", "--model", "resnet18", "--image", "32", "--memory", "140MiB",
                                      "--max-run-batch", "8", "--reps", "1", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.stderr
    sweep = json.loads((tmp_path / "bench_batch.json").read_text())
    assert (tmp_path / "bench_batch.png").stat().st_size > 0
    assert sweep["largest_planned_batch"] > sweep["largest_plain_batch"] >= 2
    for point in sweep["points"]:
        fits_plain = point["plain_peak_bytes"] <= sweep["budget_bytes"]
        assert fits_plain == (point["batch"] <= sweep["largest_plain_batch"])
        if point["planned_peak_bytes"] is not None:
            assert point["planned_peak_bytes"] <= sweep["budget_bytes"]
        if point["batch"] <= 8:
            assert point["plain_samples_per_s"] > 0
