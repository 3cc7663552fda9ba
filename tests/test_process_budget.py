"""--memory bounds the whole training process, judged by the kernel: a memory cgroup whose limit is the budget.

Each run is the real command line in a subprocess placed in a fresh memory cgroup before it
starts (cgroup v1 here, v2 where that is what is mounted); the cgroup is removed afterwards,
also when the test fails. Without permission to create cgroups the tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgetrain.profiling.process import read_process_memory
from edgetrain.sysutil.memory_cgroups import MemoryCgroup, memory_cgroup_unavailable
from edgetrain.sysutil.memory_cgroups import memory_cgroup as library_memory_cgroup


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup limited to ``limit_bytes``, removed afterwards; the test skips where none can be made."""
    reason = memory_cgroup_unavailable()
    if reason is not None:
        pytest.skip(f"cannot create a memory cgroup here: {reason}")
    with library_memory_cgroup(limit_bytes, prefix="edgetrain-test") as group:
        yield group


def run_in(cgroup: MemoryCgroup | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], capture_output=True, text=True, timeout=600,
                          preexec_fn=None if cgroup is None else cgroup.enter, stdin=subprocess.DEVNULL)


def step_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


CASES = {"resnet18": ["--model", "resnet18", "--image", "96", "--batch", "8"],
         "mobilenet_v2": ["--model", "mobilenet_v2", "--image", "64", "--batch", "16"],
         # a fine-tuning run: the frozen start is one transient forward, the rest planned
         "mobilenet_v2-last:4": ["--model", "mobilenet_v2", "--image", "64", "--batch", "16", "--update", "last:4"],
         "resnet18-bias": ["--model", "resnet18", "--image", "96", "--batch", "8", "--update", "bias"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_a_run_at_budget_m_completes_in_a_cgroup_of_m_with_the_unconstrained_losses(tmp_path: Path,
                                                                                     name: str) -> None:
    common = ["train", *CASES[name], "--samples", "64", "--epochs", "1", "--save-every", "100"]
    free = run_in(None, *common, "--run-dir", str(tmp_path / "free"))
    assert free.returncode == 0, free.stderr
    unconstrained = json.loads((tmp_path / "free" / "summary.json").read_text())
    # The least process budget, from the refusal of an impossible one.
    probe = run_in(None, *common, "--memory", "1MiB", "--run-dir", str(tmp_path / "probe"))
    assert probe.returncode == 2
    least = int(re.search(r"= [0-9.]+ \wiB \((\d+) bytes\)$", probe.stderr.strip()).group(1))  # type: ignore[union-attr]
    assert least > unconstrained["runtime_baseline_bytes"]
    # 8 MiB above the least: a run's measured baseline varies by a few MiB; the kernel keeps whole pages
    budget = max(least + 8 * 2**20, (least + unconstrained["process_peak_bytes"]) // 2) // 4096 * 4096 + 4096
    with memory_cgroup(budget) as cgroup:
        bounded = run_in(cgroup, *common, "--memory", str(budget), "--run-dir", str(tmp_path / "bounded"))
    assert bounded.returncode == 0, bounded.stderr
    summary = json.loads((tmp_path / "bounded" / "summary.json").read_text())
    assert step_losses(tmp_path / "bounded") == step_losses(tmp_path / "free")
    assert summary["runtime_baseline_bytes"] < summary["process_peak_bytes"] <= budget
    assert summary["predicted_process_peak_bytes"] <= budget

    # 15% below that peak the limit is real: edgetrain refuses up front, and a plain allocation of
    # the budget in the same cgroup is killed by the kernel.
    tight = int(summary["process_peak_bytes"] * 0.85)
    with memory_cgroup(tight) as cgroup:
        refused = run_in(cgroup, *common, "--memory", str(budget), "--run-dir", str(tmp_path / "refused"))
        hog = subprocess.run([sys.executable, "-c", f"b = bytearray({budget}); b[::4096] = b'x' * len(b[::4096])"],
                             preexec_fn=cgroup.enter,
                             capture_output=True, timeout=120)
    assert refused.returncode == 2 and "cgroup allows" in refused.stderr, refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert hog.returncode == -9, "the cgroup's limit must kill a process that exceeds it"


def _least_process_bytes(*args: str) -> int:
    """The least process budget of a run, from the refusal of an impossible one."""
    refused = run_in(None, *args, "--memory", "1MiB")
    assert refused.returncode == 2, refused.stderr
    return int(re.search(r"= [0-9.]+ \wiB \((\d+) bytes\)$", refused.stderr.strip()).group(1))  # type: ignore[union-attr]


@pytest.mark.slow
def test_auto_under_budget_m_completes_in_a_cgroup_of_m_and_trains_the_scheme_it_picked(tmp_path: Path) -> None:
    common = ["train", "--model", "mobilenet_v2", "--image", "64", "--batch", "16", "--samples", "64", "--epochs", "1",
              "--save-every", "100"]
    least_auto = _least_process_bytes(*common, "--update", "auto", "--run-dir", str(tmp_path / "probe-auto"))
    least_all = _least_process_bytes(*common, "--run-dir", str(tmp_path / "probe-all"))
    # a budget that full fine-tuning cannot meet, so that auto must pick among the schemes that freeze some stages
    budget = (least_auto + 8 * 2**20) // 4096 * 4096 + 4096
    assert budget < least_all
    with memory_cgroup(budget) as cgroup:
        bounded = run_in(cgroup, *common, "--update", "auto", "--memory", str(budget), "--run-dir",
                         str(tmp_path / "bounded"))
    assert bounded.returncode == 0, bounded.stderr
    summary = json.loads((tmp_path / "bounded" / "summary.json").read_text())
    assert summary["update"] not in ("auto", "all")
    assert summary["update_choice"].startswith(f"--update auto: {summary['update']} ")
    assert summary["runtime_baseline_bytes"] < summary["process_peak_bytes"] <= budget
    # the run trained its pick: the same scheme given by name takes the same steps
    fixed = run_in(None, *common, "--update", summary["update"], "--run-dir", str(tmp_path / "fixed"))
    assert fixed.returncode == 0, fixed.stderr
    assert step_losses(tmp_path / "bounded") == step_losses(tmp_path / "fixed")


def _high_water_mark_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]


def test_the_kernel_figures_are_read() -> None:
    # The peak only grows, so the reading lies between the kernel's figure just before and just after it
    before = _high_water_mark_kib()
    memory = read_process_memory()
    after = _high_water_mark_kib()
    assert before * 1024 <= memory.peak_rss_bytes <= after * 1024
    assert 0 < memory.rss_bytes <= memory.peak_rss_bytes
