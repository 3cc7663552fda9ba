"""An unattended node: bad input is one line and exit 2, resume can never ruin a run, one writer per run.

Every case runs the real command line in a subprocess, as a service manager would, and checks
what a person would: the exit code, exactly one line on stderr and no traceback, and that the
run directory is byte-for-byte what it was (or was never created).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from edgetrain.train import StateStore

RUN = ["--model", "resnet18", "--image", "32", "--batch", "8", "--samples", "80", "--epochs", "2",
       "--save-every", "3"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgetrain", *args]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory`` with its SHA-256 and modification time (ns)."""
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def step_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = StateStore(run_dir / "state").load_latest()
    assert state is not None
    return state.model


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of RUN: 8 steps per epoch, 2 epochs."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = run_cli("train", *RUN, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    return run_dir


BAD_OPTIONS = {
    "epochs 0": ["--epochs", "0"],
    "save-every 0": ["--save-every", "0"],
    "batch 0": ["--batch", "0"],
    "samples 0": ["--samples", "0"],
    "workers -1": ["--workers", "-1"],
    "lr nan": ["--lr", "nan"],
    "lr inf": ["--lr", "inf"],
    "lr 0": ["--lr", "0"],
    "recompute nan": ["--recompute", "nan"],
    "recompute 0.5": ["--recompute", "0.5"],
    "memory 1e400": ["--memory", "1e400"],
    "memory text": ["--memory", "lots"],
    "memory and recompute": ["--memory", "1GiB", "--recompute", "1.5"],
    "unknown model": ["--model", "resnet9"],
    "unknown device": ["--device", "toaster"],
    "unknown optimizer": ["--optimizer", "lion"],
    "unknown strategy": ["--strategy", "magic"],
    "unknown lr schedule": ["--lr-schedule", "linear"],
    "image too small": ["--image", "8"],
    "batch not a number": ["--batch", "eight"],
    "resume and overwrite": ["--resume", "--overwrite"],
    "dataset missing": ["--data", "/nonexistent/dataset"],
}


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_bad_training_input_is_one_line_and_leaves_nothing(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    result = run_cli("train", *RUN, *BAD_OPTIONS[name], "--run-dir", str(run_dir), timeout=120)
    assert_one_line_error(result)
    assert not run_dir.exists(), "a refused run must not create its run directory"


BAD_PLAN_INPUT = {
    "recompute nan": ["plan", "-m", "resnet18", "-b", "8", "--recompute", "nan"],
    "deadline nan": ["plan", "-m", "resnet18", "-b", "8", "--device", "rpi4", "--objective", "energy",
                     "--deadline", "nan"],
    "memory 1e400": ["plan", "-m", "resnet18", "-b", "8", "--memory", "1e400"],
    "batch 0": ["memory", "-m", "resnet18", "-b", "0"],
    "max-run-batch 0": ["bench", "batch", "-m", "resnet18", "--max-run-batch", "0"],
    "poet budgets 0": ["reproduce", "poet", "--budgets", "0"],
}


@pytest.mark.parametrize("name", list(BAD_PLAN_INPUT))
def test_bad_input_to_other_commands_is_one_line(tmp_path: Path, name: str) -> None:
    result = subprocess.run(cli(*BAD_PLAN_INPUT[name]), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert_one_line_error(result)
    assert not any(tmp_path.iterdir()), "nothing may be written"


RESUME_MISMATCHES = {
    "batch": (["--batch", "12"], "batch: 8 -> 12"),
    "image": (["--image", "64"], "image: 32 -> 64"),
    "optimizer": (["--optimizer", "adam"], 'optimizer: "sgd" -> "adam"'),
    "model": (["--model", "mobilenet_v2"], 'model: "resnet18" -> "mobilenet_v2"'),
    "lr": (["--lr", "0.1"], "lr: 0.01 -> 0.1"),
    "lr schedule": (["--lr-schedule", "cosine"], 'lr_schedule: unset -> "cosine"'),
    "seed": (["--seed", "1"], "seed: 0 -> 1"),
    "samples": (["--samples", "96"], "samples: 80 -> 96"),
}


@pytest.mark.parametrize("name", list(RESUME_MISMATCHES))
def test_resume_with_other_settings_is_refused_and_changes_nothing(finished: Path, name: str) -> None:
    before = snapshot(finished)
    flags, change = RESUME_MISMATCHES[name]
    result = run_cli("train", *RUN, *flags, "--run-dir", str(finished), "--resume", timeout=120)
    assert_one_line_error(result, "--resume", change)
    assert snapshot(finished) == before


def test_resume_with_a_budget_the_plan_does_not_meet_is_refused(finished: Path) -> None:
    """Asked for a third epoch (so there is work left) within 50 MiB, which the run's plan exceeds."""
    before = snapshot(finished)
    result = run_cli("train", *RUN, "--epochs", "3", "--memory", "50MiB", "--run-dir", str(finished), "--resume",
                     timeout=120)
    assert_one_line_error(result, "budget_bytes: unset -> 52428800", "predicted process peak", "--replan")
    assert snapshot(finished) == before


def test_fresh_run_into_a_run_directory_is_refused(finished: Path) -> None:
    before = snapshot(finished)
    result = run_cli("train", *RUN, "--run-dir", str(finished), timeout=120)
    assert_one_line_error(result, "already holds a run", "--overwrite")
    assert snapshot(finished) == before


def test_resume_of_a_finished_run_prints_its_summary_and_changes_no_file(finished: Path) -> None:
    before = snapshot(finished)
    saved = json.loads((finished / "summary.json").read_text())
    result = run_cli("train", *RUN, "--run-dir", str(finished), "--resume", timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"{saved['accuracy']:.3f}" in result.stdout and f"{saved['steps']} steps" in result.stdout
    assert snapshot(finished) == before


@pytest.mark.slow
def test_a_second_process_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen(cli("train", *RUN, "--epochs", "50", "--run-dir", str(run_dir)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / ".lock").exists() or not (run_dir / ".lock").read_text().strip():
            assert time.monotonic() < deadline and first.poll() is None, "the first run did not start"
            time.sleep(0.05)
        second = run_cli("train", *RUN, "--epochs", "50", "--run-dir", str(run_dir), "--resume", timeout=120)
        assert_one_line_error(second, "in use", f"pid {first.pid}")
    finally:
        first.kill()
        first.wait()
    # The kernel dropped the dead holder's lock: the run resumes (and is refused only for its settings).
    again = run_cli("train", *RUN, "--epochs", "50", "--batch", "16", "--run-dir", str(run_dir), "--resume",
                    timeout=120)
    assert_one_line_error(again, "batch: 8 -> 16")


@pytest.mark.slow
def test_five_random_kills_resume_to_the_uninterrupted_run_bit_for_bit(tmp_path: Path, finished: Path) -> None:
    """A service manager restarts the same command line after each kill -9, at random moments (seeded)."""
    broken = tmp_path / "broken"
    command = cli("train", *RUN, "--run-dir", str(broken), "--resume")
    started = time.monotonic()
    whole = subprocess.run(cli("train", *RUN, "--run-dir", str(tmp_path / "timing")), capture_output=True,
                           timeout=600)
    assert whole.returncode == 0
    duration = time.monotonic() - started
    moments = random.Random(11).sample(range(5, 95), 5)
    for percent in moments:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   stdin=subprocess.DEVNULL)
        try:
            process.wait(timeout=duration * percent / 100)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    final = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    assert step_losses(broken) == step_losses(finished)
    expected = final_weights(finished)
    for name, tensor in final_weights(broken).items():
        assert torch.equal(tensor, expected[name]), name
    before = snapshot(broken)
    sixth = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert sixth.returncode == 0, sixth.stderr
    assert snapshot(broken) == before


@pytest.mark.slow
def test_replan_on_resume_is_explicit_and_recorded(tmp_path: Path) -> None:
    """A second epoch within a step budget the first epoch's keep-all plan exceeds: refused, then replanned."""
    run_dir = tmp_path / "run"
    mobilenet = ["--model", "mobilenet_v2", "--image", "64", "--batch", "8", "--samples", "80", "--save-every", "3"]
    first = run_cli("train", *mobilenet, "--epochs", "1", "--run-dir", str(run_dir), timeout=300)
    assert first.returncode == 0, first.stderr
    done = json.loads((run_dir / "summary.json").read_text())
    budget = str(int(done["predicted_peak_bytes"] * 0.8))  # keep-all 69.7 MiB; the least step 39.3 MiB
    grown = [*mobilenet, "--epochs", "2", "--step-memory", budget, "--run-dir", str(run_dir), "--resume"]
    before = snapshot(run_dir)
    refused = run_cli("train", *grown, timeout=120)
    assert_one_line_error(refused, "step_budget_bytes: unset ->", "--replan")
    assert snapshot(run_dir) == before
    replanned = run_cli("train", *grown, "--replan", timeout=300)
    assert replanned.returncode == 0, replanned.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in records if r.get("event") == "replanned"]
    assert len(events) == 1 and events[0]["step"] == done["steps"]
    assert any("step_budget_bytes" in change for change in events[0]["changes"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["steps"] == 2 * done["steps"] and summary["recompute_factor"] > 1.0
    assert summary["predicted_peak_bytes"] <= int(budget) == summary["tensor_budget_bytes"]
