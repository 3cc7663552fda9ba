"""``edgetrain bench profile``: a fixed, versioned set of training workloads, one comparable report per device.

An edge-training benchmark profile (Prashanthi S.K. et al., *Don't Miss the Train: A Case for Systems Research into
Training on the Edge*) needs the same workloads on every board, repeated, with the spread and the software setup
written beside the times, so that boards and software versions can be compared. The workloads of a
:data:`PROFILE_VERSION` never change; a change of workload, batch, size or steps makes a new version, and reports of
two versions are not compared. Each workload is built once, warmed up with one step, then timed ``runs`` times over
``steps`` training steps (zero_grad, forward, loss, backward, SGD step); a run's figure is its seconds per step, and
the report gives their median, IQR and CoV (:func:`~edgetrain.bench.stats.spread`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .stats import software_setup, spread

__all__ = ["PROFILE_VERSION", "WORKLOADS", "Workload", "run_profile"]

PROFILE_VERSION = 1


@dataclass(frozen=True)
class Workload:
    """One training workload of the profile: a model at a batch and input size, ``steps`` steps per run."""

    name: str
    model: str
    batch: int
    size: int
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "batch": self.batch, "size": self.size, "steps": self.steps}


# Version 1: small enough that the three take about a minute with 5 runs on a quiet 2-core x86 machine.
WORKLOADS = (
    Workload("resnet18_cifar", "resnet18_cifar", 4, 32, 2),
    Workload("mobilenet_v2", "mobilenet_v2", 4, 32, 2),
    Workload("transformer", "transformer_small", 4, 32, 2),
)


def _time_workload(workload: Workload, runs: int) -> list[float]:
    import torch

    from ..data.stall import make_step_fn
    from ..models import get_model_spec
    from ..profiling.measure import step_times

    spec = get_model_spec(workload.model)
    torch.manual_seed(0)
    step = make_step_fn(spec.build())
    data = (spec.example_input(workload.batch, workload.size), spec.example_target(workload.batch))
    return list(step_times(lambda: step(data), runs, calls=workload.steps))


def run_profile(device: str | None = None, runs: int = 5, workloads: tuple[Workload, ...] = WORKLOADS,
                progress: Callable[[int, int], None] | None = None, gemm_s: float = 2.0) -> dict[str, Any]:
    """Time every workload ``runs`` times; the report (docs/guide/power.md, "The training profile").

    The report also carries the sustained FP64 DGEMM rate (the LINPACK-style probe ``bench device``
    and the time model share, :func:`~edgetrain.profiling.host.probe_gemm`, run for ``gemm_s``), so
    a board's training times can be set against its raw rate (Mwase et al., AAAI 2024, compare boards by LINPACK).

    Raises:
        EdgetrainError: ``runs < 2`` (a spread needs two runs).
    """
    from ..errors import EdgetrainError
    from ..profiling.host import probe_gemm

    if runs < 2:
        raise EdgetrainError(f"--runs must be >= 2 for a spread, got {runs}")
    rows = []
    for index, workload in enumerate(workloads):
        per_step = _time_workload(workload, runs)
        stats = spread(per_step)
        rows.append({**workload.to_dict(), "runs_s_per_step": per_step, "s_per_step": stats.to_dict(),
                     "samples_per_s": workload.batch / stats.median})
        if progress is not None:
            progress(index + 1, len(workloads))
    return {"profile": "edgetrain-train", "version": PROFILE_VERSION, "device": device or socket.gethostname(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs,
            "setup": software_setup(), "gemm_fp64": probe_gemm(seconds=gemm_s).to_dict(), "workloads": rows}
