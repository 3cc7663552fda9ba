"""Modes this machine really has: torch threads x a cgroup (v1) CPU quota, to test the mode model's time for real.

NOTE [ Thread x quota modes ]
No cpufreq and no nvpmodel here, but two knobs that bound a training step the way cores and clock
do on a board: the number of PyTorch threads (the cores a step spreads over) and a CFS quota of
the ``cpu`` cgroup (the CPU time the step may have per 100 ms period, as a share of all CPUs).
A mode ``(threads, quota)`` maps onto the mode model (NOTE [ The mode model ]) as ``cores =
threads`` and a clock ``cpu_hz = 1 GHz x min(1, quota x cpus / threads)``: each thread gets at
most its share of the quota, which slows it as a lower clock would. The EMC clock is not a
knob here (held at 1 GHz, so the model's memory term folds into its constant). Power is not
measured (no sensor): only the time prediction is tested on this machine.

On a machine shared with other work the quota alone would not bind (other processes already keep
the step below it), so the cgroup also gets the largest ``cpu.shares``: within its quota the step
has the CPUs as it would on a board that runs nothing else; the quota is then the only limit.
Each measurement runs the step in a child process that builds the model and imports PyTorch
*before* it moves itself into the cgroup, so a 25% quota throttles the step, not the import. The
cgroup (``/sys/fs/cgroup/cpu/edgetrain-power-<pid>-<n>``) is removed in a ``finally``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from ..sysutil.cgroups import remove_cgroup
from .predict import ModePoint

__all__ = ["CGROUP_CPU", "QuotaMode", "StepTiming", "cpu_quota_cgroup", "quota_grid", "quota_unavailable_reason",
           "time_step_in_mode"]

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
NOMINAL_HZ = 1e9
MAX_SHARES = 262_144  # the kernel's largest cpu.shares: the step wins the CPU from other work, up to its quota
_counter = itertools.count()


@dataclass(frozen=True)
class QuotaMode:
    """``threads`` PyTorch threads under a CPU quota of ``quota`` x all CPUs (NOTE [ Thread x quota modes ])."""

    threads: int
    quota: float
    cpus: int

    @property
    def name(self) -> str:
        return f"{self.threads}t@{round(self.quota * 100)}%"

    def point(self) -> ModePoint:
        return ModePoint(self.name, self.threads, NOMINAL_HZ * min(1.0, self.quota * self.cpus / self.threads))


def quota_grid(threads: Sequence[int] = (1, 2), quotas: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
               cpus: int | None = None) -> list[QuotaMode]:
    """Every (threads, quota) mode; ``cpus`` defaults to this machine's."""
    count = cpus or os.cpu_count() or 1
    return [QuotaMode(t, q, count) for t in threads for q in quotas]


def quota_unavailable_reason(root: Path = CGROUP_CPU) -> str | None:
    """Why CPU-quota cgroups cannot be made here, or ``None``."""
    if not (root / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK):
        return f"no permission to create cgroups in {root} (needs root)"
    return None


@contextlib.contextmanager
def cpu_quota_cgroup(quota: float, cpus: int, root: Path = CGROUP_CPU) -> Iterator[Path]:
    """A cpu cgroup limited to ``quota`` x ``cpus`` CPUs of time, removed when the block ends.

    Raises:
        EdgetrainError: cgroups are unavailable here, or ``quota`` is not in (0, 1].
    """
    reason = quota_unavailable_reason(root)
    if reason is not None:
        raise EdgetrainError(f"unavailable: {reason}")
    if not 0 < quota <= 1:
        raise EdgetrainError(f"a CPU quota is a share in (0, 1], got {quota}")
    path = root / f"edgetrain-power-{os.getpid()}-{next(_counter)}"
    path.mkdir()
    try:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(quota * cpus * PERIOD_US))))
        (path / "cpu.shares").write_text(str(MAX_SHARES))
        yield path
    finally:
        remove_cgroup(path)


@dataclass(frozen=True)
class StepTiming:
    """Step times of one child run in one mode, and how often the kernel throttled it."""

    mode: QuotaMode
    step_times_s: tuple[float, ...]
    nr_throttled: int

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.name, "threads": self.mode.threads, "quota": self.mode.quota,
                "step_times_s": list(self.step_times_s), "nr_throttled": self.nr_throttled}


def time_step_in_mode(mode: QuotaMode, model: str, batch: int, size: int, steps: int = 5, warmup: int = 2,
                      root: Path = CGROUP_CPU) -> StepTiming:
    """Run ``steps`` timed training steps (after ``warmup``) of ``model`` in ``mode``, in a child process.

    Raises:
        EdgetrainError: cgroups unavailable, or the child failed (its last line of stderr).
    """
    with cpu_quota_cgroup(mode.quota, mode.cpus, root) as cgroup:
        args = [sys.executable, "-m", "edgetrain.power.steptimer", model, str(batch), str(size), str(mode.threads),
                str(steps), str(warmup), str(cgroup / "cgroup.procs")]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise EdgetrainError(f"the step timer failed in mode {mode.name}: {last}")
        stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines() if line.strip())
    return StepTiming(mode, tuple(json.loads(done.stdout)["step_times_s"]), int(stat.get("nr_throttled", 0)))
