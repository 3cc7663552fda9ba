"""How long a training step takes on a device: one model for every objective.

NOTE [ One time model ]
Every device time edgetrain predicts (``plan``'s ``predicted_time_s`` for the fastest schedule
and for the least-energy one, energy itself, deadlines, POET's panels) comes from one
function of the chain's FLOPs and one *training rate* of the device, :func:`training_rate`:

* **measured on the device**: ``compute_flops_per_s``, FLOPs of a training step (or, for
  POET's microcontrollers, of POET's training kernel) over its measured time on the board
  (``edgetrain bench device``, or a published step: the Raspberry Pi 4's is Flower's ResNet-18
  step, ``benchmarks/time_validation.toml``). Used as it is.
* **calibrated here**: a device whose catalog gives only a sustained microbenchmark rate
  (``gemm_fp64_flops_per_s``: LINPACK / DGEMM in double precision, e.g. 15.5 GFLOP/s for a
  Raspberry Pi 4, Mwase et al., AAAI 2024) gets ``device_gemm x (training_here / gemm_here)``: this machine's
  achieved training rate scaled by the ratio of the two machines' rates on the *same*
  microbenchmark (:func:`edgetrain.profiling.host.calibrate_host` runs it here, ``bench device``
  on a board). Equivalently, a stage's time here times ``gemm_here / gemm_device``.
* otherwise **unknown**: time answers are ``None`` (null in JSON) and energy planning refuses
  the device, naming the missing figure; never a nominal rate.

Assumptions of the calibrated rate, stated where they are used:

* *Training efficiency transfers.* The fraction of its DGEMM rate a training step reaches
  (``HostCalibration.efficiency``, measured here on ResNet-18, batch 8, 64 px) is taken to be
  the same on the device and for every model. Both machines run PyTorch's CPU kernels; a model
  with a different mix of memory-bound layers, or a board whose memory system is relatively
  slower, breaks it. It breaks for the Raspberry Pi 4: published steps run at 0.77-1.10 of
  its LINPACK rate against 0.23-0.55 here, so a calibrated RPi 4 would be 2.3-3.3x too slow, and
  the catalog gives it a measured rate instead; the calibration is the fallback of a board known
  only by its LINPACK figure.
* *Precision.* Training runs in FP32, the microbenchmark in FP64 (the published LINPACK rate
  is FP64, so the probe here is too). The ratio of two machines' FP64 rates stands for the
  ratio of their FP32 rates: on both ARM NEON and x86 AVX a vector holds twice as many FP32
  as FP64 lanes, so the two precisions' rates scale together.
* *LINPACK is not DGEMM.* HPL spends most of its time in DGEMM but also factorises panels, so
  a board's HPL rate reads somewhat below its DGEMM rate: the calibrated device time errs
  towards slow.

A device time is then ``FLOPs / training_rate``; for a chain timed on this machine,
``time_here x host_flops_per_s / training_rate`` (:func:`scale_to_rate`), the same thing when
``host_flops_per_s`` is the rate that timed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..core.chain import NOMINAL_FLOPS_PER_S, Chain
from ..devices.catalog import Device
from ..errors import EdgetrainError

__all__ = ["HostCalibration", "TrainingRate", "needs_calibration", "scale_to_rate", "training_rate",
           "unknown_rate_reason"]


def _positive(owner: str, key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise EdgetrainError(f"{owner}: {key} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class HostCalibration:
    """This machine's rates on the microbenchmark and on a training step, both measured here.

    Args:
        gemm_fp64_flops_per_s: sustained FP64 DGEMM rate here, FLOP/s (the probe a device runs too).
        training_flops_per_s: achieved training rate here, FLOPs of a step over its measured time.
        source: how and when both were measured.

    Example:
        >>> HostCalibration(40e9, 20e9, "example").efficiency
        0.5
    """

    gemm_fp64_flops_per_s: float
    training_flops_per_s: float
    source: str

    def __post_init__(self) -> None:
        for key in ("gemm_fp64_flops_per_s", "training_flops_per_s"):
            _positive("host calibration", key, getattr(self, key))

    @property
    def efficiency(self) -> float:
        """Training rate over DGEMM rate here: the share of the microbenchmark a step reaches."""
        return self.training_flops_per_s / self.gemm_fp64_flops_per_s


@dataclass(frozen=True)
class TrainingRate:
    """A device's achieved training rate, FLOP/s, and where it comes from."""

    device_name: str
    flops_per_s: float
    source: str

    def __post_init__(self) -> None:
        _positive(f"training rate of {self.device_name!r}", "flops_per_s", self.flops_per_s)

    def to_dict(self) -> dict[str, object]:
        return {"device": self.device_name, "training_flops_per_s": self.flops_per_s, "source": self.source}


def needs_calibration(device: Device) -> bool:
    """Whether :func:`training_rate` needs this machine's calibration for ``device``."""
    return device.compute_flops_per_s is None and device.gemm_fp64_flops_per_s is not None


def unknown_rate_reason(device: Device) -> str:
    """Why ``device`` has no training rate (its catalog's words)."""
    return (f"device {device.name!r} has no measured training rate (compute_flops_per_s: "
            f"{device.sources.get('compute_flops_per_s', 'no reason given')}) and no sustained DGEMM/LINPACK rate "
            f"(gemm_fp64_flops_per_s: {device.sources.get('gemm_fp64_flops_per_s', 'no reason given')})")


def training_rate(device: Device, host: HostCalibration | None = None) -> TrainingRate | None:
    """The device's training rate under NOTE [ One time model ]; None when it is unknown.

    Args:
        device: a catalog device.
        host: this machine's calibration; required when :func:`needs_calibration` is true.

    Raises:
        EdgetrainError: a calibrated device without ``host``.

    Example:
        >>> rpi = get_device("rpi4")  # doctest: +SKIP
        >>> training_rate(rpi, HostCalibration(40e9, 20e9, "x")).flops_per_s  # 15.5e9 x 0.5  # doctest: +SKIP
        7750000000.0
    """
    if device.compute_flops_per_s is not None:
        return TrainingRate(device.name, float(device.compute_flops_per_s),
                            f"measured on the device: {device.sources.get('compute_flops_per_s', '')}")
    if device.gemm_fp64_flops_per_s is None:
        return None
    if host is None:
        raise EdgetrainError(f"device {device.name!r} has only a DGEMM/LINPACK rate; its training rate needs this "
                             "machine's calibration (edgetrain.profiling.host.calibrate_host)")
    rate = float(device.gemm_fp64_flops_per_s) * host.efficiency
    return TrainingRate(device.name, rate, (
        f"calibrated: {device.gemm_fp64_flops_per_s / 1e9:.4g} GFLOP/s FP64 LINPACK/DGEMM on the device "
        f"({device.sources.get('gemm_fp64_flops_per_s', '')}) x training efficiency {host.efficiency:.3f} measured "
        f"here ({host.training_flops_per_s / 1e9:.4g} GFLOP/s training / {host.gemm_fp64_flops_per_s / 1e9:.4g} "
        f"GFLOP/s DGEMM; {host.source})"))


def scale_to_rate(chain: Chain, rate_flops_per_s: float, device_name: str, *,
                  host_flops_per_s: float | None = None) -> Chain:
    """The chain with its stage times moved to a device of the given training rate; sizes unchanged.

    ``time_on_device = time_here * host_flops_per_s / rate_flops_per_s``. A chain profiled without
    timing (``chain.meta["timed"] is False``) has times FLOPs / ``NOMINAL_FLOPS_PER_S``, so
    ``host_flops_per_s`` defaults to that and the result is FLOPs / the device's rate.

    Raises:
        EdgetrainError: a timed chain without ``host_flops_per_s``, a non-positive rate, or a
            chain that was already scaled.
    """
    if "scaled_to" in chain.meta:
        raise EdgetrainError(f"chain {chain.name!r} is already scaled to {chain.meta['scaled_to']!r}")
    if host_flops_per_s is None:
        if chain.meta.get("timed") is not False:
            raise EdgetrainError(
                f"chain {chain.name!r} has measured (or unknown-origin) stage times; pass host_flops_per_s, "
                "the achieved FLOP/s of the machine that timed it")
        host_flops_per_s = NOMINAL_FLOPS_PER_S
    _positive(f"chain {chain.name!r}", "host_flops_per_s", host_flops_per_s)
    _positive(f"device {device_name!r}", "training rate", rate_flops_per_s)
    factor = host_flops_per_s / rate_flops_per_s
    stages = tuple(replace(s, fwd_time_s=s.fwd_time_s * factor, bwd_time_s=s.bwd_time_s * factor)
                   for s in chain.stages)
    meta = {**chain.meta, "scaled_to": device_name, "time_scale": factor, "host_flops_per_s": float(host_flops_per_s)}
    return replace(chain, stages=stages, meta=meta)
