"""Measure a device's energy-profile figures on the device itself (``edgetrain bench device``).

NOTE [ Probing a device ]
Where no public source gives a board's figures (the ODROID-XU4 and the Jetson TX2's compute
rate in our catalog), they can be measured on the board. Software can measure three of the
four kinds of figure; power needs a meter (or a board's own sensor), so it is given by the user
and recorded with the source they name, or left unknown.

* **Paging** (``pagein_*`` / ``pageout_*`` latency and throughput): files of several sizes are
  written to the paging directory (e.g. the SD card) and read back. A write counts until
  ``fsync`` returns and a read starts after ``posix_fadvise(DONTNEED)`` has dropped the file
  from the page cache, so both measure the storage, not RAM: the figures POET measured
  "without the page cache" for its Raspberry Pi. ``time = latency + bytes / throughput`` (the
  cost model's formula, :mod:`edgetrain.costs.energy`) is fitted to every transfer by least squares
  on *relative* error, so the small transfers, which carry the latency, weigh as much as the
  large ones. A fitted latency that is not positive (noise on fast storage) is replaced by the
  median time of the smallest transfer, an upper bound, and the source says so.
* **DGEMM** (``gemm_fp64_flops_per_s``): the sustained FP64 matrix-product rate
  (:func:`edgetrain.profiling.host.probe_gemm`), the microbenchmark whose ratio to this
  machine's calibrates device times (NOTE [ One time model ]); measured with the compute rate.
* **Compute** (``compute_flops_per_s``): the achieved training rate, FLOPs of one training step
  (forward, loss and backward, counted as the planner counts them: the meta-device chain of
  :func:`edgetrain.profile.chain_for`) over the median measured time of that step on this
  machine. With it, :func:`edgetrain.costs.energy.scale_chain` predicts exactly the measured step
  for the probing model and batch; other models inherit the assumption stated there (the same
  achieved rate for every stage).
* **Usable memory** (``usable_memory_bytes``): ``MemAvailable`` in ``/proc/meminfo`` plus the
  probe's own anonymous memory, i.e. what a training process could have on the board as it is
  when probed; run on the idle board with the services of its usual image, it is the catalog's
  figure.
* **Power** (``compute_power_w``, ``pagein_power_w``, ``pageout_power_w``): read from the board's
  own power monitors where it has them (a Jetson's INA3221 rails in sysfs: a power file, or a
  voltage and a current file whose product is the power), sampled in a background thread
  during the timed steps, the reads and the writes; by default each is the mean *above idle*
  (the mean of a quiet period before), as POET's figures are, because the cost model charges
  paging on top of compute, not instead of it. Otherwise they are given from a meter, with a
  source ("USB meter, board under load minus idle"); without them the device file says they
  are unknown and energy planning refuses the device, naming them.

The result is a device entry in the catalog's own format (``devices.toml``), every measured
figure with a source that says how, where and when it was measured; ``--devices-file`` (or
``EDGETRAIN_DEVICES``) makes it usable by every command.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.chain import NOMINAL_FLOPS_PER_S
from ..costs.energy import Direction
from ..devices.catalog import ENERGY_FIELDS, RATE_FIELDS, Device, parse_catalog, this_machine, tomllib
from ..errors import EdgetrainError
from ..sysutil.fileio import read_exactly, write_atomic
from .host import GemmProbe, probe_gemm

__all__ = ["ComputeProbe", "DeviceMeasurement", "PowerMeter", "PowerRail", "StorageProbe", "Transfer", "TransferFit",
           "device_entry", "fit_transfers", "measure_device", "measured_powers", "probe_compute", "probe_storage",
           "write_device_entry"]

logger = logging.getLogger(__name__)

KIB = 1024
DEFAULT_SIZES = (4 * KIB, 256 * KIB, 4 * KIB * KIB, 32 * KIB * KIB)
POWER_FIELDS = ("compute_power_w", "pagein_power_w", "pageout_power_w")
_RAM_FILESYSTEMS = ("tmpfs", "ramfs")


# --- power -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class PowerRail:
    """One power monitor: a file of power, or a voltage file and a current file; ``scale_w`` W per unit.

    ``parse("PATH")`` is a power file in mW (the Jetson ``in_power*_input`` files);
    ``parse("VOLTS*AMPS")`` multiplies two readings, mV x mA by default (hwmon's ``in*_input``
    and ``curr*_input``); ``@SCALE`` after either sets the watts per unit (``PATH@1e-6`` for µW).
    """

    paths: tuple[Path, ...]
    scale_w: float

    @classmethod
    def parse(cls, spec: str) -> PowerRail:
        body, _, scale = spec.partition("@")
        parts = [part.strip() for part in body.split("*")]
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise EdgetrainError(f"power sensor {spec!r}: give PATH (power) or VOLTS*AMPS (two readings), "
                                 "optionally @SCALE in watts per unit")
        paths = tuple(map(Path, parts))
        try:
            scale_w = float(scale) if scale else (1e-3 if len(paths) == 1 else 1e-6)
        except ValueError:
            raise EdgetrainError(f"power sensor {spec!r}: scale {scale!r} is not a number") from None
        if not math.isfinite(scale_w) or scale_w <= 0:
            raise EdgetrainError(f"power sensor {spec!r}: the scale must be a positive number")
        return cls(paths, scale_w)

    def read_w(self) -> float:
        value = 1.0
        for path in self.paths:
            try:
                value *= float(path.read_text(encoding="ascii").split()[0])
            except (OSError, ValueError, IndexError) as exc:
                raise EdgetrainError(f"cannot read power sensor {path}: {exc}") from None
        return value * self.scale_w

    def __str__(self) -> str:
        return "*".join(map(str, self.paths)) + f"@{self.scale_w:g}"


@dataclass(frozen=True)
class PowerMeter:
    """The summed power of some rails, sampled every ``interval_s`` while a phase runs."""

    rails: tuple[PowerRail, ...]
    interval_s: float = 0.01

    def read_w(self) -> float:
        return sum(rail.read_w() for rail in self.rails)

    @contextmanager
    def sampling(self, into: list[float]) -> Iterator[None]:
        """Append readings to ``into`` while the block runs: one at entry, one per interval, one at exit."""
        into.append(self.read_w())
        stop = threading.Event()
        failures: list[BaseException] = []

        def run() -> None:
            while not stop.wait(self.interval_s):
                try:
                    into.append(self.read_w())
                except EdgetrainError as exc:   # reported by the caller's thread, below
                    failures.append(exc)
                    return

        sampler = threading.Thread(target=run, name="edgetrain-power", daemon=True)
        sampler.start()
        try:
            yield
        finally:
            stop.set()
            sampler.join()
        if failures:
            raise failures[0]
        into.append(self.read_w())

    def idle_w(self, seconds: float) -> float:
        """Mean power over ``seconds`` of doing nothing."""
        samples: list[float] = []
        with self.sampling(samples):
            time.sleep(seconds)
        return statistics.fmean(samples)

    def describe(self) -> str:
        return " + ".join(map(str, self.rails))


def _sampling(meter: PowerMeter | None, into: list[float]) -> Any:
    return nullcontext() if meter is None else meter.sampling(into)


# --- paging -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Transfer:
    """One timed transfer: ``direction`` "out" (RAM to storage, synced) or "in" (storage to RAM)."""

    direction: Direction
    n_bytes: int
    seconds: float


@dataclass(frozen=True)
class TransferFit:
    """``time = latency_s + bytes / bps`` fitted to the transfers of one direction."""

    latency_s: float
    bps: float
    latency_from: Literal["fit", "smallest transfer"]
    transfers: int


def fit_transfers(transfers: Sequence[Transfer]) -> TransferFit:
    """Least-squares fit of ``time = latency + bytes / bps`` on relative error.

    Raises:
        EdgetrainError: fewer than two transfer sizes, or times that do not grow with size.

    Example:
        >>> fit = fit_transfers([Transfer("in", n, 0.001 + n / 1e8) for n in (4096, 1 << 20, 1 << 25)])
        >>> round(fit.latency_s, 9), round(fit.bps)
        (0.001, 100000000)
    """
    sizes = np.array([t.n_bytes for t in transfers], float)
    seconds = np.array([t.seconds for t in transfers], float)
    if len(set(sizes.tolist())) < 2:
        raise EdgetrainError("fitting latency and throughput needs transfers of at least two sizes")
    if (seconds <= 0).any():
        raise EdgetrainError("a transfer took no measurable time; use larger sizes")
    # Minimise sum(((latency + c * n) - t) / t)^2 over (latency, c = 1 / bps): rows [1/t, n/t] . x = 1.
    design = np.stack([1.0 / seconds, sizes / seconds], axis=1)
    (latency, seconds_per_byte), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    if not seconds_per_byte > 0:
        raise EdgetrainError("transfer times do not grow with size (another load on the storage, or a cache "
                             "that was not dropped?); run the probe again with larger sizes")
    if latency > 0:
        return TransferFit(float(latency), float(1.0 / seconds_per_byte), "fit", len(transfers))
    smallest = sizes.min()
    bound = statistics.median(seconds[sizes == smallest].tolist())
    return TransferFit(float(bound), float(1.0 / seconds_per_byte), "smallest transfer", len(transfers))


@dataclass(frozen=True)
class StorageProbe:
    """Paging figures of one directory's storage, with every transfer they come from."""

    directory: str
    filesystem: str | None
    cache_dropped: bool
    pagein: TransferFit
    pageout: TransferFit
    transfers: tuple[Transfer, ...]
    pagein_power_samples_w: tuple[float, ...] = ()
    pageout_power_samples_w: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "filesystem": self.filesystem, "cache_dropped": self.cache_dropped,
                "pagein_latency_s": self.pagein.latency_s, "pagein_bps": self.pagein.bps,
                "pagein_latency_from": self.pagein.latency_from, "pageout_latency_s": self.pageout.latency_s,
                "pageout_bps": self.pageout.bps, "pageout_latency_from": self.pageout.latency_from,
                "transfers": [[t.direction, t.n_bytes, t.seconds] for t in self.transfers]}


def _write_synced(path: Path, data: memoryview) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = data
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _drop_cached(path: Path) -> bool:
    """Ask the kernel to forget the file's cached pages; False where it cannot be asked."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def _read_into(path: Path, into: memoryview) -> float:
    start = time.perf_counter()
    read_exactly(path, into)
    return time.perf_counter() - start


def _filesystem_of(directory: Path, mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """Type of the file system holding ``directory`` (the longest mount point above it), if known."""
    try:
        lines = mounts.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target, best, kind = str(directory.resolve()), -1, None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), parts[2]
    return kind


def probe_storage(directory: str | os.PathLike[str], *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 3,
                  meter: PowerMeter | None = None,
                  progress: Callable[[int, int], None] | None = None) -> StorageProbe:
    """Time synced writes and uncached reads of ``sizes`` bytes in ``directory`` and fit both directions.

    Files go in a fresh sub-directory, removed afterwards whatever happens. Every read is
    checked byte for byte against what was written. With a ``meter``, its readings during the
    writes and the reads are kept for :func:`measured_powers`.

    Raises:
        EdgetrainError: a missing or unwritable directory, a full disk, a read that differs from
            the write, or times that do not fit the model (see :func:`fit_transfers`).
    """
    root = Path(directory)
    if repeats < 1:
        raise EdgetrainError(f"repeats must be >= 1, got {repeats}")
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise EdgetrainError(f"give at least two distinct positive transfer sizes, got {list(sizes)}")
    if not root.is_dir():
        raise EdgetrainError(f"paging directory {root} does not exist or is not a directory")
    filesystem = _filesystem_of(root)
    if filesystem in _RAM_FILESYSTEMS:
        logger.warning("%s is on %s: the figures will be RAM's, not storage's", root, filesystem)
    payload = memoryview(os.urandom(max(sizes)))   # incompressible, so no storage layer can shortcut it
    buffer = memoryview(bytearray(max(sizes)))
    transfers: list[Transfer] = []
    power_in: list[float] = []
    power_out: list[float] = []
    dropped = True
    total = repeats * len(sizes)
    try:
        work = Path(tempfile.mkdtemp(prefix="edgetrain-probe-", dir=root))
    except OSError as exc:
        raise EdgetrainError(f"cannot create probe files in {root}: {exc.strerror or exc}") from None
    try:
        for index in range(total):
            n = sizes[index % len(sizes)]
            path = work / f"page-{index}"
            with _sampling(meter, power_out):
                transfers.append(Transfer("out", n, _write_synced(path, payload[:n])))
            dropped = _drop_cached(path) and dropped
            with _sampling(meter, power_in):
                transfers.append(Transfer("in", n, _read_into(path, buffer[:n])))
            if buffer[:n] != payload[:n]:
                raise EdgetrainError(f"{path}: the bytes read back differ from those written")
            path.unlink()
            if progress is not None:
                progress(index + 1, total)
    except OSError as exc:
        raise EdgetrainError(f"probing storage in {root} failed: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not dropped:
        logger.warning("this system cannot drop cached pages: page-in figures may be RAM's")
    return StorageProbe(str(root.resolve()), filesystem, dropped,
                        fit_transfers([t for t in transfers if t.direction == "in"]),
                        fit_transfers([t for t in transfers if t.direction == "out"]), tuple(transfers),
                        tuple(power_in), tuple(power_out))


# --- compute ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComputeProbe:
    """The achieved training rate: the step's FLOPs over its median measured time."""

    model: str
    batch: int
    size: int
    flops: float
    steps_s: tuple[float, ...]
    threads: int
    power_samples_w: tuple[float, ...] = ()

    @property
    def step_s(self) -> float:
        return statistics.median(self.steps_s)

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.step_s

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "batch": self.batch, "size": self.size, "flops": self.flops,
                "step_s": self.step_s, "steps_s": list(self.steps_s), "threads": self.threads,
                "compute_flops_per_s": self.flops_per_s}


def probe_compute(model: str = "resnet18", batch: int = 8, size: int = 64, *, repeats: int = 5,
                  meter: PowerMeter | None = None,
                  progress: Callable[[int, int], None] | None = None) -> ComputeProbe:
    """Time ``repeats`` training steps (forward, loss, backward) of a zoo model after one warm-up.

    The FLOPs are the planner's (:func:`edgetrain.profile.chain_for`, NOTE [ Probing a device ]),
    so that a chain scaled by the measured rate predicts this step's measured time.
    """
    import torch

    from ..models import get_model_spec
    from ..profiling import chain_for
    from .measure import step_times, train_step

    if repeats < 1:
        raise EdgetrainError(f"repeats must be >= 1, got {repeats}")
    chain = chain_for(model, batch, size)
    if chain.meta.get("timed") is not False:
        raise AssertionError("chain_for must give FLOP-based times")
    flops = chain.compute_time_s * NOMINAL_FLOPS_PER_S
    spec = get_model_spec(model)
    net = spec.build()
    net.train()
    x, y = spec.example_input(batch, size), spec.example_target(batch)
    steps: list[float] = []
    power: list[float] = []
    timed = step_times(lambda: train_step(net, x, y), repeats, around=lambda: _sampling(meter, power))
    for index, elapsed in enumerate(timed, 1):
        steps.append(elapsed)
        if progress is not None:
            progress(index, repeats)
    return ComputeProbe(model, batch, size, flops, tuple(steps), torch.get_num_threads(), tuple(power))


def measured_powers(meter: PowerMeter, *, compute: ComputeProbe | None, storage: StorageProbe | None,
                    idle_w: float | None) -> tuple[dict[str, float], str]:
    """Mean power of each phase the probes sampled, above ``idle_w`` unless it is None, and its source text.

    Raises:
        EdgetrainError: a phase whose mean is not above idle (the rails do not see that work).
    """
    phases = {"compute_power_w": () if compute is None else compute.power_samples_w,
              "pagein_power_w": () if storage is None else storage.pagein_power_samples_w,
              "pageout_power_w": () if storage is None else storage.pageout_power_samples_w}
    powers: dict[str, float] = {}
    for key, samples in phases.items():
        if not samples:
            continue
        idle = idle_w or 0.0
        value = statistics.fmean(samples) - idle
        if value <= 0:
            raise EdgetrainError(f"{key}: the mean power while working ({statistics.fmean(samples):.4g} W) is not "
                                 f"above idle ({idle:.4g} W) on {meter.describe()}; choose rails that feed "
                                 "that work, or record whole readings (--whole-power)")
        powers[key] = value
    what = "above the idle mean of a quiet period before" if idle_w is not None else "whole readings, idle included"
    source = (f"sampled every {meter.interval_s:g} s from {meter.describe()} (W per unit after @) while the "
              f"probe ran that work; mean {what}" + ("" if idle_w is None else f" ({idle_w:.4g} W)"))
    return powers, source


# --- the device entry -------------------------------------------------------------------------

def _storage_sources(storage: StorageProbe, when: str) -> dict[str, str]:
    how = (f"measured by `edgetrain bench device` on {when}: {len(storage.transfers) // 2} transfers each way of "
           f"{sorted({t.n_bytes for t in storage.transfers})} bytes in {storage.directory} "
           f"({storage.filesystem or 'file system unknown'})")
    sources: dict[str, str] = {}
    for direction, fit, what in (("in", storage.pagein, "reads after dropping the page cache"),
                                 ("out", storage.pageout, "writes until fsync returned")):
        prefix = f"page{direction}"
        sources[f"{prefix}_bps"] = f"{how}; {what}; least-squares fit of time = latency + bytes / throughput"
        sources[f"{prefix}_latency_s"] = (
            f"{how}; {what}; intercept of that fit" if fit.latency_from == "fit" else
            f"{how}; {what}; the fit's intercept was not positive, so the median time of the smallest transfer "
            "(an upper bound)")
    return sources


def device_entry(name: str, *, storage: StorageProbe | None, compute: ComputeProbe | None,
                 powers: Mapping[str, float], power_source: str | None, base: Device | None = None,
                 title: str | None = None, when: str | None = None, gemm: GemmProbe | None = None) -> dict[str, Any]:
    """A ``[devices.<name>]`` table for a device file: ``base``'s detected figures plus the measured ones.

    Args:
        name: the device's name in the file (a catalog name such as ``odroid-xu4`` replaces the
            shipped entry wherever the file is used).
        storage / compute: what was measured; None leaves those figures unknown.
        powers: any of ``compute_power_w``, ``pagein_power_w``, ``pageout_power_w`` in W.
        power_source: where the powers come from (required when any is given).
        base: the detected machine (default :func:`~edgetrain.devices.this_machine`).

    Raises:
        EdgetrainError: a power without a source, or a power that is not a positive number.
    """
    base = base or this_machine()
    when = when or time.strftime("%Y-%m-%d")
    unknown = sorted(set(powers) - set(POWER_FIELDS))
    if unknown:
        raise EdgetrainError(f"unknown power field(s) {unknown}; valid: {', '.join(POWER_FIELDS)}")
    for key, value in powers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise EdgetrainError(f"{key} must be a positive number of watts, got {value!r}")
    if powers and not (power_source or "").strip():
        raise EdgetrainError("powers need a source: say what measured them (e.g. 'USB power meter, board under "
                             "load minus idle')")
    table: dict[str, Any] = {"title": title or f"{name}, measured on {base.title}", "memory_bytes": base.memory_bytes,
                             "cpu": base.cpu}
    sources = {key: base.sources[key] for key in ("memory_bytes", "cpu") if key in base.sources}
    for key in ("cpu_cores", "cpu_max_freq_hz", "accelerator"):
        if getattr(base, key) is not None:
            table[key] = getattr(base, key)
            sources[key] = base.sources.get(key, "detected at run time")
    # NOTE [ Usable memory, measured from inside ] (catalog.py): run on the idle board, with the
    # services of its usual image running, this is the memory a training process can have there.
    sources["usable_memory_bytes"] = base.sources.get("usable_memory_bytes", "unknown: not measured")
    if base.usable_memory_bytes is not None:
        table["usable_memory_bytes"] = base.usable_memory_bytes
        how = sources["usable_memory_bytes"].removeprefix("detected at run time: ")
        sources["usable_memory_bytes"] = (f"measured by `edgetrain bench device` on {when}, on the board as it was "
                                          f"(idle, with its usual services, if run as documented): {how}")
    for key in (*RATE_FIELDS, *ENERGY_FIELDS):
        sources[key] = "unknown: not measured (run `edgetrain bench device` with the options that measure it)"
    if storage is not None:
        table.update(pagein_latency_s=storage.pagein.latency_s, pagein_bps=storage.pagein.bps,
                     pageout_latency_s=storage.pageout.latency_s, pageout_bps=storage.pageout.bps)
        sources.update(_storage_sources(storage, when))
    if compute is not None:
        table["compute_flops_per_s"] = compute.flops_per_s
        sources["compute_flops_per_s"] = (
            f"measured by `edgetrain bench device` on {when}: {compute.model} batch {compute.batch} at size "
            f"{compute.size}, {compute.flops:.4g} FLOP per step (forward, loss, backward) over the median of "
            f"{len(compute.steps_s)} steps, {compute.step_s:.4g} s, on {compute.threads} thread(s)")
    if gemm is not None:
        table["gemm_fp64_flops_per_s"] = gemm.flops_per_s
        sources["gemm_fp64_flops_per_s"] = (
            f"measured by `edgetrain bench device` on {when}: FP64 DGEMM {gemm.n}x{gemm.n}, {gemm.products} products "
            f"sustained over {gemm.elapsed_s:.3g} s on {gemm.threads} thread(s) (edgetrain.profiling.host.probe_gemm)")
    for key in POWER_FIELDS:
        if key in powers:
            table[key] = float(powers[key])
            sources[key] = f"`edgetrain bench device` on {when}: {power_source}"
        else:
            sources[key] = ("unknown: power cannot be measured in software here; give it from a meter "
                            f"(--{key.removesuffix('_w').replace('_', '-')}-w)")
    table["sources"] = sources
    table["notes"] = {"device": f"Measured on the machine itself ({base.title}) by `edgetrain bench device`."}
    return table


def write_device_entry(path: str | os.PathLike[str], name: str, entry: Mapping[str, Any]) -> Device:
    """Put ``entry`` as ``[devices.<name>]`` into the device file at ``path``, keeping its other devices.

    The new file is validated by the catalog's rules before it replaces the old one
    (:func:`~edgetrain.sysutil.fileio.write_atomic`), so a crash leaves either file whole.

    Raises:
        DeviceCatalogError: the existing file is not a valid device file, or the entry breaks a rule.
    """
    import tomli_w

    target = Path(path)
    data: dict[str, Any] = {"devices": {}}
    if target.exists():
        text = target.read_text(encoding="utf-8")
        parse_catalog(text, str(target))
        data = tomllib.loads(text)
        data.setdefault("devices", {})
    data["devices"][name] = dict(entry)
    text = tomli_w.dumps(data)
    device = parse_catalog(text, str(target))[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text)
    return device


@dataclass(frozen=True)
class DeviceMeasurement:
    """What ``edgetrain bench device`` measured, and the device entry written from it."""

    device: Device
    storage: StorageProbe | None
    compute: ComputeProbe | None


def measure_device(name: str, output: str | os.PathLike[str], *, page_dir: str | os.PathLike[str] = ".",
                   sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 3, model: str = "resnet18", batch: int = 8,
                   size: int = 64, steps: int = 5, storage: bool = True, compute: bool = True, gemm_s: float = 3.0,
                   powers: Mapping[str, float] | None = None, power_source: str | None = None,
                   power_sensors: Sequence[str] = (), idle_s: float = 2.0, whole_power: bool = False,
                   progress: Callable[[str, int, int], None] | None = None) -> DeviceMeasurement:
    """Measure this machine's energy-profile figures and put them as ``[devices.<name>]`` into ``output``.

    Args:
        name: the device's name in the file.
        output: the device file (an existing one keeps its other devices).
        page_dir: a directory on the storage paging will use; ``sizes`` and ``repeats`` its transfers.
        model, batch, size, steps: the training step that measures the compute rate (median of ``steps``).
        storage, compute: whether to measure paging and the compute rate (with the DGEMM rate).
        gemm_s: seconds of the sustained DGEMM probe (:func:`edgetrain.profiling.host.probe_gemm`).
        powers: figures of :data:`POWER_FIELDS` given from a meter, W; ``power_source`` says which.
        power_sensors: sysfs power monitors (:meth:`PowerRail.parse`) to measure the powers with,
            summed; ``idle_s`` seconds of idle sampled first are subtracted unless ``whole_power``.
        progress: called with ``(phase, done, total)``; the phases are ``"paging transfers"`` and
            ``"training steps"``.

    Returns:
        The device as written, with the probes it comes from.

    Raises:
        EdgetrainError: powers both given and to be measured.
        DeviceCatalogError: the existing file is not a valid device file, or the entry breaks a rule.
    """
    given = dict(powers or {})
    if given and power_sensors:
        raise EdgetrainError("give the powers from a meter (--compute-power-w ...) or from --power-sensor, not both")
    meter = PowerMeter(tuple(PowerRail.parse(spec) for spec in power_sensors)) if power_sensors else None
    idle_w = None if meter is None or whole_power else meter.idle_w(idle_s)

    def phase(description: str) -> Callable[[int, int], None] | None:
        return None if progress is None else lambda done, total: progress(description, done, total)

    storage_probe = probe_storage(page_dir, sizes=sizes, repeats=repeats, meter=meter,
                                  progress=phase("paging transfers")) if storage else None
    compute_probe = probe_compute(model, batch, size, repeats=steps, meter=meter,
                                  progress=phase("training steps")) if compute else None
    if meter is not None:
        given, measured = measured_powers(meter, compute=compute_probe, storage=storage_probe, idle_w=idle_w)
        power_source = f"measured: {measured}"
    elif given:
        power_source = f"given by the user: {power_source}" if (power_source or "").strip() else None
    gemm_probe = probe_gemm(seconds=gemm_s) if compute else None
    entry = device_entry(name, storage=storage_probe, compute=compute_probe, powers=given, power_source=power_source,
                         gemm=gemm_probe)
    return DeviceMeasurement(write_device_entry(output, name, entry), storage_probe, compute_probe)
