"""The training benchmark profile: a versioned workload set, spreads over runs, and the setup beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import run
from test_power_modes import fake_board

from edgetrain.bench.stats import software_setup
from edgetrain.bench.workloads import PROFILE_VERSION, WORKLOADS, Workload, run_profile
from edgetrain.errors import EdgetrainError


def test_version_1_workloads_are_fixed() -> None:
    """Changing a workload makes a new profile version: reports of two versions are not comparable."""
    assert PROFILE_VERSION == 1
    assert [(w.name, w.model, w.batch, w.size, w.steps) for w in WORKLOADS] == [
        ("resnet18_cifar", "resnet18_cifar", 4, 32, 2), ("mobilenet_v2", "mobilenet_v2", 4, 32, 2),
        ("transformer", "transformer_small", 4, 32, 2)]


def test_a_report_has_the_spread_of_every_workload_and_the_setup(one_thread: None) -> None:
    tiny = (Workload("tiny", "transformer_small", 2, 8, 1),)
    done: list[tuple[int, int]] = []
    report = run_profile("board-a", runs=3, workloads=tiny, progress=lambda i, n: done.append((i, n)), gemm_s=0.05)
    assert (report["profile"], report["version"], report["device"], report["runs"]) == \
        ("edgetrain-train", PROFILE_VERSION, "board-a", 3)
    row = report["workloads"][0]
    assert len(row["runs_s_per_step"]) == 3 and row["s_per_step"]["n"] == 3
    assert row["s_per_step"]["median"] == sorted(row["runs_s_per_step"])[1]
    assert row["samples_per_s"] == pytest.approx(2 / row["s_per_step"]["median"])
    assert {"torch", "python", "kernel", "cpu", "governor", "power_mode"} <= set(report["setup"])
    assert done == [(1, 1)]
    assert report["gemm_fp64"]["n"] == 1024 and report["gemm_fp64"]["gemm_fp64_flops_per_s"] > 0
    with pytest.raises(EdgetrainError, match="--runs must be >= 2"):
        run_profile(runs=1, workloads=tiny)


def test_the_setup_names_governor_and_power_mode(tmp_path: Path) -> None:
    setup = software_setup(fake_board(tmp_path / "root", nvpmodel_mode=1))
    assert (setup["governor"], setup["power_mode"], setup["cpu_max_freq_khz"], setup["online_cpus"]) == \
        ("schedutil", "nvpmodel 1", 1479000, 4)
    bare = tmp_path / "bare"
    bare.mkdir()
    assert software_setup(bare)["governor"] == "unavailable: no cpufreq"


def test_cli_profile_refuses_one_run() -> None:
    code, _, err = run("bench", "profile", "--runs", "1")
    assert code == 2 and err.count("\n") == 1
