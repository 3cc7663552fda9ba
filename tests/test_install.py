"""The lean install: `pip install edgetrain` carries no planning machinery, and a device trains without it.

Two instruments: the dependency closure pip would resolve, walked from ``pyproject.toml`` through
the installed distributions' metadata (no network), and a real ``edgetrain train`` / ``plan`` in
a subprocess where numba, llvmlite, highspy and matplotlib cannot be imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from steps import between_least_and_keep_all_mib

from edgetrain.devices.catalog import tomllib
from edgetrain.sysutil.imports import BLOCKER

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"numba", "llvmlite", "highspy", "matplotlib"}


def _closure(extras: set[str]) -> set[str]:
    """Every distribution `pip install edgetrain[extras]` resolves to, against the installed versions."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = canonicalize_name(project["name"])
    todo: list[tuple[Requirement, str]] = [(Requirement(r), "") for r in project["dependencies"]]
    todo += [(Requirement(r), extra) for extra in extras for r in project["optional-dependencies"][extra]]
    found: set[str] = set()
    walked: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are queued
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        dist = canonicalize_name(req.name)
        if dist == name:  # a self-reference such as all = ["edgetrain[plan,reports]"]
            todo += [(Requirement(r), e) for e in req.extras for r in project["optional-dependencies"][e]]
            continue
        for key in [(dist, "")] + [(dist, e) for e in req.extras]:
            if key not in walked:
                walked.add(key)
                todo += [(Requirement(r), key[1]) for r in metadata.requires(dist) or []]
        found.add(dist)
    return found


def test_the_plain_install_pulls_no_planning_machinery() -> None:
    core = _closure(set())

    assert {"torch", "numpy", "typer", "rich", "pillow", "tomli-w"} <= core
    assert not HEAVY & core, sorted(HEAVY & core)


@pytest.mark.parametrize(("extras", "heavy"), [
    ({"plan"}, {"numba", "llvmlite", "highspy"}),
    ({"reports"}, {"matplotlib"}),
    ({"all"}, HEAVY),
])
def test_the_extras_bring_exactly_their_machinery(extras: set[str], heavy: set[str]) -> None:
    assert HEAVY & _closure(extras) == heavy


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(blocked=HEAVY))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_training_and_planning_run_with_the_planning_extras_unimportable(tmp_path: Path) -> None:
    # Prepare: the blocker really blocks.
    probe = _run(tmp_path, "-c", "import numba")
    assert probe.returncode != 0 and "blocked by the test" in probe.stderr

    # Execute: plan on the "workstation" (here too without numba: the pure-Python grid), train from
    # the plan as a device would, and plan within a training run (the JIT-free exact table).
    shipped = tmp_path / "plan.json"
    planned = _run(tmp_path, "-m", "edgetrain", "plan", "--model", "resnet18", "--batch", "8", "--image", "64",
                   "--classes", "10", "--memory", "137MiB", "--strategy", "optimal", "--json", "-o", str(shipped))
    from_plan = _run(tmp_path, "-m", "edgetrain", "train", "--model", "resnet18", "--data", "synthetic",
                     "--samples", "40", "--batch", "8", "--image", "64", "--plan", str(shipped), "--memory", "800MiB",
                     "--epochs", "1", "--run-dir", str(tmp_path / "shipped"))
    step_mib = between_least_and_keep_all_mib("resnet18", batch=8, image=64)
    trained = _run(tmp_path, "-m", "edgetrain", "train", "--model", "resnet18", "--data", "synthetic",
                   "--samples", "40", "--batch", "8", "--image", "64", "--step-memory", f"{step_mib}MiB",
                   "--strategy", "optimal", "--epochs", "1", "--run-dir", str(tmp_path / "run"))
    milp = _run(tmp_path, "-m", "edgetrain", "plan", "--model", "resnet18", "--batch", "8", "--device", "rpi4",
                "--memory", "250MiB", "--objective", "energy", "--strategy", "milp")

    # Assert: planned on the pure-Python DP, trained from the plan within the process budget and
    # within the step budget; the MILP names the extra in one line.
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["strategy"] == "optimal" and plan["predicted_peak_bytes"] <= 137 * 2**20   # keep-all: 139.0 MiB
    assert from_plan.returncode == 0, from_plan.stderr
    shipped_run = json.loads((tmp_path / "shipped" / "summary.json").read_text())
    assert shipped_run["predicted_peak_bytes"] == plan["predicted_peak_bytes"]
    assert shipped_run["process_peak_bytes"] <= shipped_run["budget_bytes"] == 800 * 2**20
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["strategy"] == "optimal" and summary["recompute_factor"] > 1
    assert summary["measured_peak_bytes"] <= summary["tensor_budget_bytes"] == step_mib * 2**20
    assert milp.returncode == 2
    assert milp.stderr.strip().splitlines() == ["error: the MILP planner needs HiGHS: pip install 'edgetrain[plan]'"]
