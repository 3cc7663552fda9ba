"""Energy and time of compute and paging on a target device, from its catalog figures.

NOTE [ The energy cost model ]
POET (Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated
Rematerialization and Paging", ICML 2022) minimises the energy of a training step as the sum of
compute, page-in and page-out energy, each from a per-device profile (``poet/chipsets.py`` and
``poet/power_computation.py`` of https://github.com/ShishirPatil/poet). This module is that
model, pure and in explicit units:

* compute: ``energy_j = compute_power_w * time_s``, where ``time_s`` is the time *on the
  device*. POET writes it as ``FLOP / FLOPS_PER_WATT``; its FLOPS_PER_WATT is FLOPS / POWER, so
  the two agree.
* page-in / page-out of ``n`` bytes: ``time_s = latency_s + n / bps`` (POET's formula, one
  latency per transfer) and ``energy_j = power_w * time_s``. Zero bytes is no transfer: 0 s.
* device time from a chain profiled elsewhere (:func:`scale_chain`): NOTE [ One time model ]
  in :mod:`edgetrain.costs.timemodel`, the one model every objective uses; ``compute_flops_per_s``
  is the device's training rate from :func:`edgetrain.costs.timemodel.training_rate`. It *assumes*
  every stage runs at the same achieved rate on both machines, i.e. that the device is
  uniformly slower; memory-bound stages and different kernels break it.

Figures come from :mod:`edgetrain.devices`; a device without them is refused with the missing
field names rather than given a made-up number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..core.chain import Chain, StageCost
from ..devices.catalog import ENERGY_FIELDS, Device
from ..errors import EdgetrainError
from .timemodel import TrainingRate, scale_to_rate

__all__ = [
    "Direction",
    "EnergyProfile",
    "compute_energy_j",
    "page_energy_j",
    "page_time_s",
    "scale_chain",
]

Direction = Literal["in", "out"]
_DIRECTIONS = ("in", "out")


@dataclass(frozen=True)
class EnergyProfile:
    """What compute and paging cost on one device: rates, latencies and powers, in SI units.

    Args:
        device_name: the catalog name the figures come from.
        compute_flops_per_s: achieved training compute rate, FLOP/s.
        compute_power_w: power while computing, W.
        pagein_latency_s / pageout_latency_s: fixed latency of one transfer, s.
        pagein_bps / pageout_bps: paging throughput, bytes/s.
        pagein_power_w / pageout_power_w: power while paging, W.

    Example:
        >>> profile = EnergyProfile.from_device(get_device("rpi4"))  # doctest: +SKIP
        >>> profile.compute_j_per_flop == 3.0 / 120347376.2  # doctest: +SKIP
        True
    """

    device_name: str
    compute_flops_per_s: float
    compute_power_w: float
    pagein_latency_s: float
    pagein_bps: float
    pagein_power_w: float
    pageout_latency_s: float
    pageout_bps: float
    pageout_power_w: float

    def __post_init__(self) -> None:
        for key in ENERGY_FIELDS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise EdgetrainError(f"energy profile {self.device_name!r}: {key} must be a finite number > 0, "
                                     f"got {value!r}")

    @classmethod
    def from_device(cls, device: Device, rate: TrainingRate | None = None) -> EnergyProfile:
        """The profile of a catalog device.

        Args:
            device: the catalog device (powers and paging figures).
            rate: its training rate from :func:`edgetrain.costs.timemodel.training_rate` (NOTE [ One
                time model ]); None takes the device's own ``compute_flops_per_s``.

        Raises:
            EdgetrainError: when the device lacks any energy figure; the message names every
                missing field and the catalog's reason for it.
        """
        given = {} if rate is None else {"compute_flops_per_s": rate.flops_per_s}
        missing = [key for key in ENERGY_FIELDS if key not in given and getattr(device, key) is None]
        if missing:
            reasons = "; ".join(f"{key} ({device.sources.get(key, 'no reason given')})" for key in missing)
            raise EdgetrainError(f"device {device.name!r} lacks energy figure(s) {', '.join(missing)}: {reasons}. "
                                 "Measure them on the board with `edgetrain bench device` and pass its file "
                                 "with --devices-file")
        figures = {key: float(given.get(key, getattr(device, key))) for key in ENERGY_FIELDS}
        return cls(device_name=device.name, **figures)

    @property
    def compute_j_per_flop(self) -> float:
        """Compute energy per FLOP, J (the inverse of POET's FLOPS_PER_WATT)."""
        return self.compute_power_w / self.compute_flops_per_s

    @property
    def pagein_s_per_byte(self) -> float:
        return 1.0 / self.pagein_bps

    @property
    def pageout_s_per_byte(self) -> float:
        return 1.0 / self.pageout_bps

    @property
    def pagein_j_per_byte(self) -> float:
        """Page-in energy per byte beyond the per-transfer latency: power x time per byte, J."""
        return self.pagein_power_w / self.pagein_bps

    @property
    def pageout_j_per_byte(self) -> float:
        """Page-out energy per byte beyond the per-transfer latency: power x time per byte, J."""
        return self.pageout_power_w / self.pageout_bps

    def page_time_s(self, n_bytes: int, direction: Direction) -> float:
        """:func:`page_time_s` on this device: the simulator prices paging through the profile it is given, so
        the core contract does not import the cost models."""
        return page_time_s(n_bytes, self, direction)

    def page_energy_j(self, n_bytes: int, direction: Direction) -> float:
        """:func:`page_energy_j` on this device."""
        return page_energy_j(n_bytes, self, direction)


def scale_chain(chain: Chain, profile: EnergyProfile, *, host_flops_per_s: float | None = None) -> Chain:
    """The chain with its stage times moved to the profile's device; sizes are unchanged.

    ``time_on_device = time_here * host_flops_per_s / profile.compute_flops_per_s``: the
    assumption that every stage runs at the same achieved rate on both machines (NOTE [ The
    energy cost model ]). A chain profiled without timing (``chain.meta["timed"] is False``, e.g. on
    the meta device) has times FLOPs / ``NOMINAL_FLOPS_PER_S``, so ``host_flops_per_s`` defaults
    to that and the result is FLOPs / the device's rate; pass the ``flops_per_s`` given to
    :func:`edgetrain.profile.profile` if it was not the default.

    Args:
        chain: a chain whose times are on the profiling machine.
        profile: the target device.
        host_flops_per_s: achieved FLOP/s of the machine the times belong to; required for a
            timed chain (or one whose ``meta`` does not say).

    Returns:
        A new chain; ``meta`` gains ``scaled_to`` (device name), ``time_scale`` (the factor)
        and ``host_flops_per_s``.

    Raises:
        EdgetrainError: a timed chain without ``host_flops_per_s``, a non-positive rate, or a
            chain that was already scaled.

    Example:
        >>> rpi = EnergyProfile.from_device(get_device("rpi4"))  # doctest: +SKIP
        >>> scale_chain(profile(model, (8, 3, 32, 32), measure_time=False), rpi)  # doctest: +SKIP
    """
    return scale_to_rate(chain, profile.compute_flops_per_s, profile.device_name, host_flops_per_s=host_flops_per_s)


def compute_energy_j(work: Chain | StageCost | float, profile: EnergyProfile) -> float:
    """Compute energy on the device: ``compute_power_w * time_s``.

    Args:
        work: a chain (every forward and backward once, :attr:`Chain.compute_time_s`), one
            stage (its forward plus backward), or a time in seconds; in every case the times
            must already be the device's (see :func:`scale_chain`).
        profile: the device.

    Returns:
        Energy in joules.

    Example:
        >>> rpi = EnergyProfile.from_device(get_device("rpi4"))  # doctest: +SKIP
        >>> compute_energy_j(2.0, rpi)  # 2 s at 3 W  # doctest: +SKIP
        6.0
    """
    if isinstance(work, Chain):
        time_s = work.compute_time_s
    elif isinstance(work, StageCost):
        time_s = work.fwd_time_s + work.bwd_time_s
    else:
        time_s = float(work)
        if not math.isfinite(time_s) or time_s < 0:
            raise ValueError(f"compute time must be a finite number >= 0, got {work!r}")
    return profile.compute_power_w * time_s


def _paging(profile: EnergyProfile, direction: Direction) -> tuple[float, float, float]:
    if direction == "in":
        return profile.pagein_latency_s, profile.pagein_bps, profile.pagein_power_w
    if direction == "out":
        return profile.pageout_latency_s, profile.pageout_bps, profile.pageout_power_w
    raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")


def page_time_s(n_bytes: int, profile: EnergyProfile, direction: Direction) -> float:
    """Time of one transfer of ``n_bytes`` to (``"out"``) or from (``"in"``) storage.

    ``latency_s + n_bytes / bps``, POET's formula; 0 s for zero bytes (no transfer).

    Example:
        >>> page_time_s(45_500_000, EnergyProfile.from_device(get_device("rpi4")), "in")  # doctest: +SKIP
        1.00000509561
    """
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes}")
    latency_s, bps, _ = _paging(profile, direction)
    return 0.0 if n_bytes == 0 else latency_s + n_bytes / bps


def page_energy_j(n_bytes: int, profile: EnergyProfile, direction: Direction) -> float:
    """Energy of one transfer of ``n_bytes``: paging power x :func:`page_time_s`, in joules.

    POET charges paging this way, with one storage power for the whole transfer; the per-byte
    part alone is :attr:`EnergyProfile.pagein_j_per_byte` / ``pageout_j_per_byte``.
    """
    _, _, power_w = _paging(profile, direction)
    return power_w * page_time_s(n_bytes, profile, direction)
