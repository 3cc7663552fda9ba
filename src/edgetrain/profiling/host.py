"""The sustained DGEMM rate of a machine, and this machine's calibration (NOTE [ One time model ]).

The microbenchmark is LINPACK's kernel: ``torch.mm`` of square FP64 matrices, repeated for a
few seconds after one warm-up product, the rate being every product's ``2 n^3`` FLOPs over the
whole elapsed time (sustained, not the best run). ``edgetrain bench device`` runs it on a board
(``gemm_fp64_flops_per_s`` in the device file); :func:`calibrate_host` runs it here together
with a training step, whose ratio is the training efficiency the time model transfers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..costs.timemodel import HostCalibration
from ..errors import EdgetrainError

__all__ = ["CALIBRATION_ENV", "CACHE_DIR_ENV", "GemmProbe", "calibrate_host", "cpu_model", "host_calibration",
           "probe_gemm", "calibration_cache_path"]

CALIBRATION_STEP = ("resnet18", 8, 64)  # model, batch, size of the training step timed here
# "GEMM_FLOPS_PER_S,TRAINING_FLOPS_PER_S": a calibration measured before (its numbers are in every
# calibrated time_source), reused instead of measuring again; makes device times reproducible.
CALIBRATION_ENV = "EDGETRAIN_HOST_CALIBRATION"
# Where a measured calibration is kept, so that every command on this machine gives one time per
# device and step (the measurement varies run to run) and none pays the ~15 s of measuring again.
CACHE_DIR_ENV = "EDGETRAIN_CACHE_DIR"


@dataclass(frozen=True)
class GemmProbe:
    """``products`` FP64 products of ``n x n`` matrices in ``elapsed_s`` seconds on ``threads`` threads."""

    n: int
    products: int
    elapsed_s: float
    threads: int

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3 * self.products

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.elapsed_s

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "products": self.products, "elapsed_s": self.elapsed_s, "threads": self.threads,
                "gemm_fp64_flops_per_s": self.flops_per_s}


def probe_gemm(n: int = 1024, seconds: float = 2.0) -> GemmProbe:
    """Time FP64 ``n x n`` matrix products for at least ``seconds`` after one warm-up product.

    Raises:
        EdgetrainError: ``n < 1`` or ``seconds <= 0``.

    Example:
        >>> probe_gemm(64, 0.01).flops_per_s > 0
        True
    """
    import torch

    if n < 1 or not seconds > 0:
        raise EdgetrainError(f"probe_gemm needs n >= 1 and seconds > 0, got n={n}, seconds={seconds}")
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, dtype=torch.float64, generator=generator)
    b = torch.rand(n, n, dtype=torch.float64, generator=generator)
    out = torch.empty(n, n, dtype=torch.float64)
    torch.mm(a, b, out=out)  # warm-up: threads, caches, page faults of out
    products = 0
    start = time.perf_counter()
    while True:
        torch.mm(a, b, out=out)
        products += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return GemmProbe(n, products, elapsed, torch.get_num_threads())


@functools.cache
def calibrate_host(rounds: int = 5) -> HostCalibration:
    """This machine's DGEMM rate and ResNet-18's training rate, measured once per process.

    ``rounds`` alternations of a 0.3 s DGEMM burst and one training step; each rate is the best
    round's. Other processes only ever slow a round down, so on a shared machine the best round
    is the closest to the machine's own rate, and alternating exposes both to the same load.
    """
    import torch

    from ..core.chain import NOMINAL_FLOPS_PER_S
    from ..models import get_model_spec
    from ..profiling import chain_for
    from .measure import step_times, train_step

    model, batch, size = CALIBRATION_STEP
    flops = chain_for(model, batch, size).compute_time_s * NOMINAL_FLOPS_PER_S
    spec = get_model_spec(model)
    net = spec.build()
    x, y = spec.example_input(batch, size), spec.example_target(batch)
    gemm_rates, steps_s = [], []
    for elapsed in step_times(lambda: train_step(net, x, y), rounds):
        steps_s.append(elapsed)
        gemm_rates.append(probe_gemm(seconds=0.3).flops_per_s)
    source = (f"measured here: best of {rounds} alternating rounds of a 0.3 s FP64 DGEMM 1024^3 burst and one {model} "
              f"training step (batch {batch}, {size} px, {flops:.4g} FLOP, forward + loss + backward) on "
              f"{torch.get_num_threads()} threads")
    return HostCalibration(max(gemm_rates), flops / min(steps_s), source)


def host_calibration() -> HostCalibration:
    """This machine's calibration: ``$EDGETRAIN_HOST_CALIBRATION`` when set, else the one measured before on this
    machine and software (:func:`calibration_cache_path`), else measured now (:func:`calibrate_host`) and kept.

    Raises:
        EdgetrainError: a malformed ``$EDGETRAIN_HOST_CALIBRATION``.
    """
    text = os.environ.get(CALIBRATION_ENV)
    if text is None:
        return _cached_calibration()
    try:
        gemm, training = (float(part) for part in text.split(","))
    except ValueError:
        raise EdgetrainError(f"{CALIBRATION_ENV} must be 'GEMM_FLOPS_PER_S,TRAINING_FLOPS_PER_S', e.g. "
                             f"'2e10,1e10', got {text!r}") from None
    return HostCalibration(gemm, training, f"given by ${CALIBRATION_ENV}={text}")


def calibration_cache_path() -> Path:
    """The file that keeps this machine's measured calibration: ``$EDGETRAIN_CACHE_DIR`` or ``~/.cache/edgetrain``."""
    root = os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "edgetrain")
    return Path(root) / "host_calibration.json"


def cpu_model() -> str:
    """The CPU's name from ``/proc/cpuinfo`` (x86 ``model name``, ARM ``Model`` or ``Hardware``); "" where absent."""
    with contextlib.suppress(OSError):
        return next((line.partition(":")[2].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith(("model name", "Model", "Hardware"))), "")
    return ""


def _fingerprint() -> dict[str, Any]:
    """What a calibration holds for: the CPU, its count, the threads and the PyTorch build."""
    import torch

    return {"machine": platform.machine(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def _cached_calibration() -> HostCalibration:
    """The calibration kept for this fingerprint, or a new measurement, kept (a write failure only loses the cache)."""
    from ..sysutil.fileio import write_json

    path, fingerprint = calibration_cache_path(), _fingerprint()
    try:
        kept = json.loads(path.read_text())
        if kept["fingerprint"] == fingerprint:
            return HostCalibration(float(kept["gemm_fp64_flops_per_s"]), float(kept["training_flops_per_s"]),
                                   f"{kept['source']}; kept in {path}")
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, another machine's, or unreadable: measure
    measured = calibrate_host()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"fingerprint": fingerprint, "gemm_fp64_flops_per_s": measured.gemm_fp64_flops_per_s,
                          "training_flops_per_s": measured.training_flops_per_s,
                          "source": f"{measured.source}, {time.strftime('%Y-%m-%d')}"})
    except OSError:
        pass
    return measured
