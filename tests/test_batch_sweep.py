"""The batch-size sweep: largest batches found exactly, planning extends them, throughput measured."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.reports import batch_sweep
from edgetrain.reports.batch_sweep import largest_batch


def test_largest_batch_is_exact_for_a_monotone_predicate() -> None:
    for limit in (1, 2, 3, 7, 64, 100, 1000):
        assert largest_batch(lambda b, limit=limit: b <= limit) == limit
    assert largest_batch(lambda b: False) == 0
    assert largest_batch(lambda b: 2 <= b <= 9, start=2) == 9


@pytest.mark.slow
def test_bench_batch_command_writes_json_and_plot(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "batch", "--model", "resnet18", "--image", "32", "--memory", "140MiB",
                                      "--max-run-batch", "8", "--reps", "1", "--runs", "2", "--out", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.stderr
    sweep = json.loads((tmp_path / "bench_batch.json").read_text())
    assert (tmp_path / "bench_batch.png").stat().st_size > 0
    assert sweep["largest_planned_batch"] > sweep["largest_plain_batch"] >= 2
    for point in sweep["points"]:
        fits_plain = point["plain_peak_bytes"] <= sweep["budget_bytes"]
        assert fits_plain == (point["batch"] <= sweep["largest_plain_batch"])
        if point["planned_peak_bytes"] is not None:
            assert point["planned_peak_bytes"] <= sweep["budget_bytes"]
        if point["batch"] <= 8:  # two separate runs, and their median
            runs = point["plain_runs_samples_per_s"]
            assert len(runs) == 2 and all(r > 0 for r in runs)
            assert point["plain_samples_per_s"] == statistics.median(runs)
        else:
            assert point["plain_runs_samples_per_s"] is None and point["plain_samples_per_s"] is None
    assert sweep["largest_by_device"] == []


def test_largest_batch_per_device_for_both_variants_beside_the_published_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hand-made peaks: plain training needs 10 bytes per sample (the CIFAR stem 40), a plan half of that.
    per_sample = {"resnet18": 10, "resnet18_cifar": 40}
    monkeypatch.setattr(batch_sweep, "_trainable", lambda model, batch, image: True)
    monkeypatch.setattr(batch_sweep, "_plain_peak", lambda model, batch, image: per_sample[model] * batch)
    monkeypatch.setattr(batch_sweep, "_planned_fits",
                        lambda model, batch, image, cap: per_sample[model] * batch / 2 <= cap)

    rows = batch_sweep.largest_batches_by_device(("resnet18", "resnet18_cifar"), 32,
                                                 {"rpi4": 10_000, "odroid-xu4": 400})

    assert [(r.device, r.model, r.largest_plain_batch, r.largest_planned_batch, r.paper_batch) for r in rows] == [
        ("rpi4", "resnet18", 1000, 2000, 1024), ("rpi4", "resnet18_cifar", 250, 500, 1024),
        ("odroid-xu4", "resnet18", 40, 80, None), ("odroid-xu4", "resnet18_cifar", 10, 20, None)]
    assert "Mwase et al., AAAI 2024" in str(rows[0].paper_source)


def test_the_cifar_stem_keeps_more_per_image_than_imagenets_at_32_px() -> None:
    # 3x3 stride 1 and no pool: the first stage's maps are 32 x 32, not 8 x 8.
    assert batch_sweep._plain_peak("resnet18_cifar", 4, 32) > batch_sweep._plain_peak("resnet18", 4, 32) + \
        4 * 64 * (32 * 32 - 8 * 8) * 4
