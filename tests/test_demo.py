"""The demo's library (:mod:`edgetrain.reports.demo`) at a reduced size: a real run under a squeezed budget."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.reports import demo
from edgetrain.reports.node_fit import DEMO_SQUEEZE

pytest.importorskip("matplotlib")

# 120 samples of 8 classes: 96 train, 6 steps of 16 an epoch, 2 epochs; the node fit of the squeeze's row only
SETTINGS = demo.DemoSettings(samples=120, epochs=2)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> demo.DemoResult:
    threads = torch.get_num_threads()
    ran = demo.run(tmp_path_factory.mktemp("demo"), SETTINGS, node_configs=(DEMO_SQUEEZE,))
    assert torch.get_num_threads() == threads   # the run's own count (choose_threads) is given back
    return ran


def test_the_plan_fits_the_budget_and_plain_training_does_not(result: demo.DemoResult) -> None:
    squeeze, summary = result.squeeze, result.run.summary
    assert summary.tensor_budget_bytes == squeeze.budget_bytes
    assert summary.predicted_peak_bytes <= squeeze.budget_bytes < squeeze.plain_peak_bytes
    assert squeeze.plain_peak_bytes == simulate(squeeze.chain, keep_all(squeeze.chain.length)).peak_bytes
    assert squeeze.least_peak_bytes <= squeeze.budget_bytes
    # the node's squeeze, or 10% above the least step where the squeeze is tighter
    assert squeeze.budget_bytes == max(int(squeeze.plain_peak_bytes * squeeze.squeeze),
                                       int(squeeze.least_peak_bytes * 1.10))
    assert summary.recompute_factor > 1.0   # the plan recomputes: plain training would not fit
    # the schedule the run trained with, on the chain the figure draws, stays within the budget too
    assert simulate(squeeze.chain, result.run.schedule).peak_bytes <= squeeze.budget_bytes


def test_the_budget_held_in_training(result: demo.DemoResult) -> None:
    summary = result.run.summary
    assert summary.measured_peak_bytes is not None and summary.predicted_tracked_peak_bytes is not None
    assert summary.measured_peak_bytes <= summary.predicted_tracked_peak_bytes <= result.squeeze.budget_bytes
    # The process bound is checked in a process of its own (tests/test_cli.py): a test worker's heap holds what
    # earlier tests left in it, which the demo's own process does not.
    assert summary.runtime_baseline_bytes < summary.process_peak_bytes
    assert result.run.process_budget_bytes == (summary.runtime_baseline_bytes + 16 * 2**20
                                               + int(result.squeeze.budget_bytes * 1.10))


def test_the_summary_and_epochs_agree_with_the_files(result: demo.DemoResult) -> None:
    files, summary, run = result.files, result.run.summary, result.run
    for name in ("node_fit", "metrics", "summary", "plan", "figure"):
        assert files[name].is_file(), name
    saved = json.loads(files["summary"].read_text())
    assert saved["steps"] == summary.steps == SETTINGS.epochs * (summary.train_samples // SETTINGS.batch)
    assert saved["train_samples"] + saved["val_samples"] == SETTINGS.samples
    assert saved["chance_accuracy"] == pytest.approx(1 / SETTINGS.classes)
    assert saved["tensor_budget_bytes"] == result.squeeze.budget_bytes
    assert saved["config"]["lr"] == SETTINGS.lr and saved["config"]["lr_schedule"] == "cosine"
    assert [e.epoch for e in run.epochs] == list(range(SETTINGS.epochs))
    assert run.epochs[-1].val_accuracy == saved["accuracy"] and run.epochs[-1].val_loss == saved["val_loss"]
    assert [step for step, _ in run.step_losses] == list(range(1, summary.steps + 1))
    mean = sum(loss for _, loss in run.step_losses[:run.steps_per_epoch]) / run.steps_per_epoch
    assert run.epochs[0].train_loss == pytest.approx(mean)
    rows = json.loads(files["node_fit"].read_text())
    assert rows == result.node_fit.rows and (rows[0]["model"], rows[0]["batch"], rows[0]["size"]) == DEMO_SQUEEZE
    assert 0 < result.squeeze.squeeze < 1 and not rows[0]["fits"]


def test_the_figure_is_a_png(result: demo.DemoResult) -> None:
    data = result.files["figure"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 1000 and height > 400
    assert data[-8:-4] == b"IEND"


def test_the_run_uses_the_idle_cores_at_least_one() -> None:
    threads, cores, load = demo.choose_threads()
    assert 1 <= threads <= min(cores, torch.get_num_threads())
    assert threads == 1 or threads <= cores - load + 0.5


def test_too_few_samples_for_a_batch_are_refused_before_any_work(tmp_path: Path) -> None:
    from edgetrain.errors import EdgetrainError

    small = demo.DemoSettings(samples=16)
    assert demo.split_sizes(small) == (16, 0)   # a batch of 16, nothing held out
    with pytest.raises(EdgetrainError, match=r"16 images to train on and 0 held out: .* give at least 17$"):
        demo.prepare_run(tmp_path, None, small)  # type: ignore[arg-type]   # refused before the budget is read
    assert not any(tmp_path.iterdir())
    train, val = demo.split_sizes(demo.DemoSettings())
    assert (train, val) == (640, 160)


def test_the_command_line_defaults_are_the_library_s() -> None:
    import inspect

    from edgetrain.cli.train import demo as command

    options = inspect.signature(command).parameters
    defaults = demo.DemoSettings()
    assert [options[name].default.default for name in ("samples", "epochs", "seed")] == [
        defaults.samples, defaults.epochs, defaults.seed]
