"""edgetrain train: a real run within a budget, its files, and exact resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from steps import between_least_and_keep_all_mib, peak_tracks

from edgetrain.errors import EdgetrainError
from edgetrain.train import StateStore, TrainConfig, train

SMALL = ["--model", "resnet18", "--image", "32", "--batch", "8", "--samples", "160", "--epochs", "2",
         "--recompute", "1.5", "--save-every", "2"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgetrain", *args]


def step_losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = StateStore(run_dir / "state").load_latest()
    assert state is not None
    return state.model


@pytest.mark.slow
def test_library_run_writes_metrics_and_summary(tmp_path: Path) -> None:
    step_mib = between_least_and_keep_all_mib("resnet18", batch=8, image=32)
    config = TrainConfig(model="resnet18", image=32, batch=8, samples=120, epochs=2, step_memory=f"{step_mib}MiB",
                         run_dir=tmp_path / "run", data_root=tmp_path / "data", save_every=5)
    summary = train(config)
    assert summary.steps == 2 * (96 // 8)
    assert 0.0 <= summary.accuracy <= 1.0 and summary.chance_accuracy == 0.1
    assert summary.tensor_budget_bytes == step_mib * 2**20 and summary.budget_bytes is None  # no process budget asked
    assert summary.predicted_tracked_peak_bytes is not None   # the tracker's share of the plan: not 0, not above it
    assert peak_tracks(summary.measured_peak_bytes, summary.predicted_tracked_peak_bytes)
    assert summary.predicted_tracked_peak_bytes < summary.predicted_peak_bytes   # the convolutions' scratch
    assert summary.predicted_peak_bytes <= summary.tensor_budget_bytes
    assert summary.runtime_baseline_bytes < summary.process_peak_bytes
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in ("accuracy", "measured_peak_bytes", "tensor_budget_bytes", "recompute_factor", "wall_time_s",
                "process_peak_bytes", "runtime_baseline_bytes", "predicted_process_peak_bytes"):
        assert key in saved
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, summary.steps + 1))
    assert all({"step", "epoch", "loss"} <= set(r) for r in steps)
    assert sum("val_accuracy" in r for r in records) == 2


@pytest.mark.slow
def test_budget_below_minimum_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(cli("train", *SMALL[:10], "--memory", "10MiB", "--run-dir", str(tmp_path)),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "below what training needs in this process: runtime baseline" in result.stderr
    parts = [int(n) for n in re.findall(r"\((\d+) bytes", result.stderr)]
    budget, baseline, step, needed = parts
    assert budget == 10 * 2**20 and needed == baseline + 16 * 2**20 + int(step * 1.10) > budget


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    subprocess.run(cli("train", *SMALL, "--run-dir", str(whole)), check=True, capture_output=True, timeout=600)
    # Each run generates its synthetic data under its own run dir: they share nothing but the seed.
    process = subprocess.Popen(cli("train", *SMALL, "--run-dir", str(broken)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    metrics = broken / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if metrics.exists() and len(step_losses(broken)) >= 7:
            break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = len(step_losses(broken))
    assert 7 <= killed_at < 32, "the run must be killed mid-training"
    subprocess.run(cli("train", *SMALL, "--run-dir", str(broken), "--resume"), check=True, capture_output=True,
                   timeout=600)
    assert step_losses(broken) == step_losses(whole)
    expected = final_weights(whole)
    for name, tensor in final_weights(broken).items():
        assert torch.equal(tensor, expected[name]), name


def test_metrics_reach_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every numeric metric goes to TensorBoard at its step, and the writer is closed.

    A stand-in ``SummaryWriter`` takes torch.utils.tensorboard's place: what is ours to test is
    what the loop hands the writer (the event-file format is TensorBoard's), and the test runs
    without the tensorboard package (grpcio, protobuf), which the test extra does not install.
    """
    class Writer:
        made: ClassVar[list[Writer]] = []

        def __init__(self, log_dir: str) -> None:
            self.log_dir, self.scalars, self.closed = log_dir, [], False
            Writer.made.append(self)

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

        def close(self) -> None:
            self.closed = True

    stand_in = types.ModuleType("torch.utils.tensorboard")
    stand_in.SummaryWriter = Writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", stand_in)
    config = TrainConfig(model="resnet18", image=32, batch=8, samples=40, epochs=1, run_dir=tmp_path / "run",
                         data_root=tmp_path / "data")
    summary = train(config)
    [writer] = Writer.made
    assert writer.log_dir == str(tmp_path / "run" / "tensorboard") and writer.closed
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = [(key, value, r["step"]) for r in records for key, value in r.items()
                if key not in ("step", "epoch") and isinstance(value, (int, float))]
    assert writer.scalars == expected
    assert [step for tag, _, step in writer.scalars if tag == "loss"] == list(range(1, summary.steps + 1))
    assert [value for tag, value, _ in writer.scalars if tag == "val_accuracy"] == [summary.accuracy]


def test_another_schedule_gives_the_same_numbers(tmp_path: Path) -> None:
    """Two runs of the same seed, one plain, one squeezed into a checkpointing schedule: same weights and metrics.

    The schedule changes what is kept and recomputed, never the arithmetic, so accuracy and
    validation loss agree to the last digit.
    """
    def run(name: str, recompute: float | None) -> tuple[object, dict[str, torch.Tensor]]:
        config = TrainConfig(model="resnet18", image=32, batch=8, samples=96, epochs=1, recompute=recompute,
                             run_dir=tmp_path / name, data_root=tmp_path / "data", save_every=100)
        return train(config), final_weights(tmp_path / name)

    plain, plain_weights = run("plain", None)
    squeezed, squeezed_weights = run("squeezed", 1.5)   # the least memory within ρ = 1.5
    assert squeezed.recompute_factor > 1.0 == plain.recompute_factor   # a different schedule really ran
    assert (squeezed.accuracy, squeezed.val_loss) == (plain.accuracy, plain.val_loss)
    assert all(torch.equal(plain_weights[k], squeezed_weights[k]) for k in plain_weights)


@pytest.mark.slow
def test_the_optimizer_stepped_in_the_backward_trains_as_the_whole_step_and_resumes_exactly(tmp_path: Path) -> None:
    """``--step-in-backward`` (one SGD per parameter, stepped from its gradient's accumulation): the weights and
    losses of the whole step's run under a cosine rate (a new rate at every step, in every parameter's
    optimizer), a lower predicted peak (no step holds every gradient), and a run stopped after its first epoch
    and resumed (each parameter's momentum restored) ends where the unbroken one does."""
    def run(name: str, in_backward: bool, epochs: int = 2, schedule: str = "cosine", resume: bool = False) -> object:
        config = TrainConfig(model="resnet18", image=32, batch=8, samples=32, epochs=epochs, recompute=1.5,
                             run_dir=tmp_path / name, data_root=tmp_path / "data", save_every=100,
                             lr_schedule=schedule, step_in_backward=in_backward, resume=resume)
        return train(config)

    def same_run(name: str, other: str) -> bool:
        expected = final_weights(tmp_path / other)
        return step_losses(tmp_path / name) == step_losses(tmp_path / other) and all(
            torch.equal(tensor, expected[key]) for key, tensor in final_weights(tmp_path / name).items())

    whole, stepped = run("whole", False), run("stepped", True)
    assert stepped.predicted_peak_bytes < whole.predicted_peak_bytes   # type: ignore[attr-defined]
    assert same_run("stepped", "whole")
    run("steady", True, schedule="constant")   # a constant rate: a first epoch alone trains as the run's first
    run("parts", True, epochs=1, schedule="constant")
    run("parts", True, schedule="constant", resume=True)
    assert same_run("parts", "steady")


def test_the_optimizer_in_the_backward_is_refused_with_a_shipped_plan_and_is_part_of_the_run(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("{}")
    with pytest.raises(EdgetrainError, match="drop --step-in-backward"):
        TrainConfig(plan_file=plan_file, step_in_backward=True).check()
    assert "step_in_backward" not in TrainConfig().identity().identity
    assert TrainConfig(step_in_backward=True).identity().identity["step_in_backward"] is True


def test_a_cosine_rate_falls_from_the_rate_to_zero_and_each_step_trains_at_its_own(tmp_path: Path) -> None:
    # By hand: rate (1 + cos(pi s / T)) / 2 after s of T steps; cos(pi / 2) rounds to 6e-17, lost in 1 + it.
    from edgetrain.core.optim import scheduled_rate
    from edgetrain.errors import UnknownNameError

    quarter, three_quarters = 0.01 * (1 + 2 ** -0.5) / 2, 0.01 * (1 - 2 ** -0.5) / 2
    rates = [scheduled_rate(0.01, "cosine", s, 4) for s in range(5)]
    assert rates[0] == 0.01 and rates[2] == 0.005 and rates[4] == 0.0
    assert rates[1] == pytest.approx(quarter, rel=1e-15) and rates[3] == pytest.approx(three_quarters, rel=1e-12)
    assert scheduled_rate(0.01, "constant", 3, 4) == 0.01
    with pytest.raises(UnknownNameError, match="unknown learning-rate schedule 'linear'"):
        TrainConfig(lr_schedule="linear").check()

    # A run: the first update is at the full rate in both runs, so steps 1 and 2 see the same weights; the second
    # update is at a lower rate with cosine, so step 3's loss differs.
    def losses(schedule: str) -> list[float]:
        config = TrainConfig(model="transformer_small", samples=25, batch=4, image=8, epochs=2, save_every=100,
                             lr_schedule=schedule, run_dir=tmp_path / schedule, data_root=tmp_path / "data")
        train(config)
        return [loss for _, loss in step_losses(tmp_path / schedule)]

    constant, cosine = losses("constant"), losses("cosine")
    assert len(constant) == len(cosine) == 10
    assert cosine[:2] == constant[:2] and cosine[2] != constant[2]
