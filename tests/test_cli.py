"""The command line: every command runs, --json parses, bad input gives one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgetrain.cli import main
from edgetrain.core.planfile import PlanFile

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    """The ``edgetrain`` script's entry point in this process: (exit code, stdout, stderr)."""
    with runner.isolation() as (out, err, _):
        try:
            main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        return code, out.getvalue().decode(), err.getvalue().decode()


def test_memory_json_has_the_public_keys() -> None:
    code, out, _ = run("memory", "--model", "resnet18", "--batch", "2", "--image", "64", "--json")
    assert code == 0
    report = json.loads(out)
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"):
        assert isinstance(report[key], int) and report[key] > 0
    assert report["device_memory_bytes"] is None and report["fits"] is None
    assert report["weights_bytes"] + report["gradients_bytes"] + report["optimizer_bytes"] + \
        report["activations_bytes"] == report["total_bytes"]


def test_memory_against_a_device_says_whether_it_fits() -> None:
    code, out, _ = run("memory", "-m", "resnet50", "-b", "8", "--image", "500", "--device", "odroid-xu4", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["device_memory_bytes"] == 2 * 2**30
    assert report["fits"] is False and report["margin_bytes"] < 0
    code, out, _ = run("memory", "-m", "resnet18", "-b", "1", "--device", "odroid-xu4")
    assert code == 0 and "fits" in out and "does not fit" not in out


def test_adam_needs_more_than_sgd() -> None:
    sgd = json.loads(run("memory", "-m", "resnet18", "-b", "2", "--image", "32", "--json")[1])
    adam = json.loads(run("memory", "-m", "resnet18", "-b", "2", "--image", "32", "--json", "--optimizer", "adam")[1])
    assert adam["optimizer_bytes"] == 2 * sgd["optimizer_bytes"] + 4 * 62  # 62 parameter tensors


@pytest.mark.parametrize("args, message", [
    (("memory", "-m", "resnet51", "-b", "1"), "unknown model 'resnet51'; valid names: mobilenet_v2"),
    # the rest of the line is click's, and its wording differs between typer's own click and the one Flower's pins use
    (("memory", "-m", "resnet18", "-b", "0"), "Invalid value for '--batch' / '-b': "),
    (("memory", "-m", "resnet18", "-b", "1", "--image", "16"), "at least 32 px"),
    (("memory", "-m", "resnet18", "-b", "1", "--device", "pi"), "unknown device 'pi'; valid names:"),
    (("memory", "-m", "resnet18", "-b", "1", "--optimizer", "lion"), "unknown optimizer 'lion'"),
    (("memory", "-m", "resnet18", "-b", "1", "--image", "32"), "single value per channel"),
    (("plan", "-m", "resnet18", "-b", "1", "--memory", "1MiB"), "below the feasible minimum"),
    (("plan", "-m", "resnet18", "-b", "1", "--memory", "lots"), "not a byte quantity"),
    (("plan", "-m", "resnet18", "-b", "1", "--recompute", "0.5"), ">= 1"),
    (("plan", "-m", "resnet18", "-b", "1"), "give --memory or --recompute"),
    (("plan", "-m", "resnet18", "-b", "1", "--memory", "1GiB", "--strategy", "magic"), "unknown strategy"),
])
def test_bad_input_is_one_clear_line(args: tuple[str, ...], message: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert "Traceback" not in out + err
    assert len(err.splitlines()) == 1 and message in err


def test_plan_json_and_saved_schedule(tmp_path: Path) -> None:
    path = tmp_path / "schedule.json"
    code, out, _ = run("plan", "-m", "resnet18", "-b", "4", "--image", "64", "--recompute", "1.3", "--json",
                       "-o", str(path))
    assert code == 0
    report = json.loads(out)
    for key in ("strategy", "predicted_peak_bytes", "predicted_time_s", "recompute_factor", "baseline"):
        assert key in report
    assert report["recompute_factor"] <= 1.3
    shipped = PlanFile.load(path)
    assert shipped.schedule.length == shipped.chain.length == 14   # conv1, bn1, relu, maxpool, 8 blocks, head, loss
    assert (shipped.model, shipped.batch, shipped.image, shipped.num_classes) == ("resnet18", 4, 64, 1000)
    assert shipped.predicted_peak_bytes == report["predicted_peak_bytes"]


def test_plan_with_a_device_uses_what_its_memory_leaves_beside_the_runtime() -> None:
    code, out, _ = run("plan", "-m", "resnet18", "-b", "2", "--image", "64", "--device", "odroid-xu4", "--json")
    assert code == 0
    report = json.loads(out)
    baseline = report["runtime_baseline_bytes"]
    assert report["budget_bytes"] == int((2 * 2**30 - baseline - 16 * 2**20) / 1.10) and report["fits"] is True


def test_devices_lists_the_catalog() -> None:
    code, out, _ = run("devices", "--json")
    names = [d["name"] for d in json.loads(out)]
    assert code == 0 and "odroid-xu4" in names and "this-machine" in names
    code, out, _ = run("devices")
    assert code == 0 and "jetson-agx-orin" in out


@pytest.mark.slow
def test_demo_reports_fit_then_trains_within_a_squeezed_budget(tmp_path: Path) -> None:
    # 160 samples of the demo's 8 classes: 128 train, 8 steps of 16, so the steady-state (second) step is measured.
    # The `edgetrain` script in a process of its own: the kernel's count is of the whole process, and a test
    # worker's heap holds what earlier tests left in it.
    script = Path(sys.executable).with_name("edgetrain")
    done = subprocess.run([str(script), "demo", "--out", str(tmp_path), "--samples", "160", "--epochs", "1"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "node_fit.json").read_text())
    assert len(rows) == 5
    # One runtime baseline for every verdict, the probe's: a fresh probe here reads the same within 8 MiB (three
    # probes on one machine spread over 0.1 MiB)
    from edgetrain.train.budget import estimate_runtime_baseline_bytes

    (baseline,) = {row["runtime_baseline_bytes"] for row in rows}
    assert abs(baseline - estimate_runtime_baseline_bytes()) < 8 * 2**20
    for row in rows:
        # The node's verdict is for the whole process: baseline + 16 MiB + 1.10 x the step's tensors.
        assert row["predicted_process_bytes"] == baseline + 16 * 2**20 + int(row["total_bytes"] * 1.10)
        assert row["capacity_bytes"] == 2 * 2**30 and row["os_memory_known"] is False
        assert row["fits"] == (row["predicted_process_bytes"] <= 2 * 2**30)
        if not row["fits"] and row["plan"].get("feasible", True):
            assert row["plan"]["predicted_process_bytes"] <= 2 * 2**30
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["predicted_peak_bytes"] <= summary["tensor_budget_bytes"]
    # measured by the tracker: against the plan's peak without the kernels' scratch, which only the allocator sees
    assert summary["predicted_tracked_peak_bytes"] < summary["predicted_peak_bytes"]   # the convolutions' scratch
    assert (summary["predicted_tracked_peak_bytes"] * 0.995 <= summary["measured_peak_bytes"]
            <= summary["predicted_tracked_peak_bytes"])
    # the process as the kernel counts it (VmHWM), within the bound the step's budget implies
    assert summary["runtime_baseline_bytes"] < summary["process_peak_bytes"] <= (
        summary["runtime_baseline_bytes"] + 16 * 2**20 + int(summary["tensor_budget_bytes"] * 1.10))
    assert summary["recompute_factor"] > 1.0  # plain training does not fit the demo budget


def test_bench_data_reports_shares_per_worker_count(tmp_path: Path) -> None:
    code, out, err = run("bench", "data", "--samples", "32", "--image", "32", "--batch", "4", "--workers", "0",
                         "--batches", "2", "--data-root", str(tmp_path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["recommended_workers"] == 0
    code, _, err = run("bench", "data", "--workers", "zero", "--data-root", str(tmp_path))
    assert code == 2 and "comma-separated integers" in err


def energy_plan(*extra: str) -> dict[str, object]:
    code, out, err = run("plan", "-m", "resnet18", "-b", "8", "--image", "224", "--device", "rpi4",
                         "--objective", "energy", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_energy_plan_json_has_the_energy_split() -> None:
    report = energy_plan("--memory", "250MiB")
    for key in ("strategy", "predicted_peak_bytes", "predicted_time_s", "recompute_factor", "baseline",
                "energy_j", "energy_compute_j", "energy_pagein_j", "energy_pageout_j", "solve_time_s"):
        assert key in report
    assert report["strategy"] == "paging-dp" and report["predicted_peak_bytes"] <= 250 * 2**20
    assert report["energy_j"] == pytest.approx(report["energy_compute_j"] + report["energy_pagein_j"]
                                               + report["energy_pageout_j"])
    assert report["energy_pageout_j"] > 0            # this budget is met by paging, not recomputation only
    assert report["energy_j"] < report["recompute_only_energy_j"]


@pytest.mark.slow
def test_energy_plan_deadline_and_strategies() -> None:
    free = energy_plan("--memory", "250MiB")
    tight = energy_plan("--memory", "250MiB", "--deadline", "1.0")   # no slower than a step without either
    assert tight["deadline_s"] == pytest.approx(tight["predicted_time_s"] / tight["recompute_factor"])
    # 250 MiB is below the plain step's peak, so every schedule recomputes or pages: 1.0x is missed.
    assert tight["deadline_met"] is False and tight["predicted_time_s"] > tight["deadline_s"]
    met = energy_plan("--memory", "250MiB", "--deadline", f"{free['predicted_time_s']}s")   # the free plan's time
    assert met["deadline_met"] is True and met["predicted_time_s"] <= free["predicted_time_s"]
    assert free["deadline_s"] is None
    best = energy_plan("--memory", "275MiB")["energy_j"]
    for strategy in ("recompute", "paging-only", "capuchin"):
        other = energy_plan("--memory", "275MiB", "--strategy", strategy)
        assert other["strategy"] == strategy and other["predicted_peak_bytes"] <= 275 * 2**20
        assert other["energy_j"] >= best * (1 - 1e-9)


@pytest.mark.parametrize(("args", "message"), [
    (("--objective", "energy", "--memory", "250MiB"), "needs --device"),
    (("--objective", "energy", "--device", "rpi4", "--memory", "100MiB"), "at least"),
    (("--objective", "energy", "--device", "jetson-tx2", "--memory", "250MiB"), "compute_flops_per_s"),
    (("--objective", "energy", "--device", "rpi4", "--memory", "250MiB", "--deadline", "fast"), "--deadline"),
    (("--memory", "250MiB", "--deadline", "1.2"), "--objective energy"),
])
def test_energy_plan_bad_input_is_one_clear_line(args: tuple[str, ...], message: str) -> None:
    code, _, err = run("plan", "-m", "resnet18", "-b", "8", "--image", "224", *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_reproduce_poet_writes_its_report(tmp_path: Path) -> None:
    code, out, err = run("reproduce", "poet", "--out", str(tmp_path), "--budgets", "3")
    assert code == 0, err
    assert {"poet.json", "poet.png", "poet.md"} <= {p.name for p in tmp_path.iterdir()}
    assert "jetson-tx2: skipped" in out


def test_energy_plan_where_no_checkpoint_sequential_fits() -> None:
    """ResNet-50 at 465 MiB: recompute-only fits (from 450 MiB), no segmentation does (from 474 MiB)."""
    code, out, err = run("plan", "-m", "resnet50", "-b", "8", "--image", "224", "--device", "rpi4",
                         "--objective", "energy", "--memory", "465MiB", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["baseline"] is None
    assert report["recompute_only_energy_j"] is not None and report["energy_j"] <= report["recompute_only_energy_j"]


def test_train_passes_step_in_backward_to_the_run(tmp_path: Path) -> None:
    """The flag reaches the run's settings: with a shipped plan (a whole step's) it is refused in one line."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("{}")
    code, _, err = run("train", "--plan", str(plan_file), "--step-in-backward", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "drop --step-in-backward" in err and len(err.strip().splitlines()) == 1
