"""Plan on a workstation, train on the device: `edgetrain plan -o` then `edgetrain train --plan`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.core.planfile import PlanFile, PlanFileError

RUN = ["--model", "resnet18", "--batch", "8", "--image", "64", "--samples", "64", "--epochs", "1"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def step_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    result = cli("plan", "-m", "resnet18", "-b", "8", "--image", "64", "--classes", "10", "--recompute", "1.2",
                 "-o", str(path))
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.slow
def test_training_from_a_plan_gives_the_losses_of_planning_in_process(tmp_path: Path, shipped: Path) -> None:
    planned_here = cli("train", *RUN, "--recompute", "1.2", "--run-dir", str(tmp_path / "here"))
    from_file = cli("train", *RUN, "--plan", str(shipped), "--run-dir", str(tmp_path / "shipped"))
    assert planned_here.returncode == 0 and from_file.returncode == 0, planned_here.stderr + from_file.stderr
    assert step_losses(tmp_path / "shipped") == step_losses(tmp_path / "here")
    summary = json.loads((tmp_path / "shipped" / "summary.json").read_text())
    plan = PlanFile.load(shipped)
    assert summary["predicted_peak_bytes"] == plan.predicted_peak_bytes
    assert summary["recompute_factor"] > 1.0  # the shipped schedule recomputes: it is the one that ran
    # planned on the meta device, which has no kernels' scratch: the tracker's share is the whole plan
    assert summary["predicted_tracked_peak_bytes"] == plan.predicted_peak_bytes
    assert plan.predicted_peak_bytes * 0.995 <= summary["measured_peak_bytes"] <= plan.predicted_peak_bytes * 1.0001


def _edited(shipped: Path, tmp_path: Path) -> Path:
    path = tmp_path / "edited.json"
    path.write_text(shipped.read_text().replace('"batch": 8', '"batch": 16', 1))
    return path


def _other_version(shipped: Path, tmp_path: Path) -> Path:
    record = json.loads(shipped.read_text())
    record["version"] = 99
    path = tmp_path / "v99.json"
    path.write_text(json.dumps(record))
    return path


def _truncated(shipped: Path, tmp_path: Path) -> Path:
    path = tmp_path / "cut.json"
    path.write_bytes(shipped.read_bytes()[: len(shipped.read_bytes()) // 2])
    return path


@pytest.mark.parametrize("make, phrase", [
    (_truncated, "not a readable plan file"),
    (_edited, "altered after it was written"),
    (_other_version, "format version 99"),
])
def test_a_damaged_plan_file_is_one_line_and_exit_2(tmp_path: Path, shipped: Path, make, phrase: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("train", *RUN, "--plan", str(make(shipped, tmp_path)), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert phrase in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, mismatch", [
    (["--model", "mobilenet_v2"], "model: 'resnet18' (plan) -> 'mobilenet_v2' (run)"),
    (["--batch", "4"], "batch: 8 (plan) -> 4 (run)"),
    (["--image", "96"], "image: 64 (plan) -> 96 (run)"),
    (["--optimizer", "adam"], "optimizer: 'sgd' (plan) -> 'adam' (run)"),
])
def test_a_plan_for_another_run_is_refused_naming_the_mismatch(tmp_path: Path, shipped: Path, flags: list[str],
                                                               mismatch: str) -> None:
    result = cli("train", *RUN, *flags, "--plan", str(shipped), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert mismatch in result.stderr


def test_a_plan_for_another_number_of_classes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p1000.json"
    made = cli("plan", "-m", "resnet18", "-b", "8", "--image", "64", "--recompute", "1.2", "-o", str(path))
    assert made.returncode == 0
    result = cli("train", *RUN, "--plan", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "num_classes: 1000 (plan) -> 10 (run)" in result.stderr


def test_plan_file_round_trip_and_tamper_check(tmp_path: Path, shipped: Path) -> None:
    plan = PlanFile.load(shipped)
    again = plan.save(tmp_path / "again.json")
    assert PlanFile.load(again) == plan
    record = json.loads(again.read_text())
    record["plan"]["schedule"]["ops"] = record["plan"]["schedule"]["ops"][:-1]
    again.write_text(json.dumps(record))
    with pytest.raises(PlanFileError, match="altered"):
        PlanFile.load(again)


@pytest.mark.slow
def test_an_energy_plan_pages_to_the_given_directory_and_leaves_nothing(tmp_path: Path) -> None:
    """A paging schedule planned for the RPi 4 runs from the file, its pages under --page-dir, removed after."""
    path = tmp_path / "energy.json"
    made = cli("plan", "-m", "resnet18", "-b", "8", "--image", "64", "--classes", "10", "--device", "rpi4",
               "--objective", "energy", "--memory", "135MiB", "-o", str(path), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["paged_out_bytes"] > 0, "the budget must force paging"
    pages = tmp_path / "card"
    pages.mkdir()
    ran = cli("train", *RUN, "--plan", str(path), "--page-dir", str(pages), "--run-dir", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    cli("train", *RUN, "--run-dir", str(tmp_path / "plain"))
    assert step_losses(tmp_path / "run") == step_losses(tmp_path / "plain")
    assert list(pages.iterdir()) == []
