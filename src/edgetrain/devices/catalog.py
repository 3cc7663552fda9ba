"""The device catalog: edge machines a training step is planned for, every figure with its source.

NOTE [ Device figures and their sources ]
The figures live in ``devices.toml`` (package data), one table per device, read into frozen
:class:`Device` records. The rules, checked when a file is loaded:

* units are in the field names (``memory_bytes``, ``cpu_max_freq_hz``, ``peak_power_w``,
  ``storage_read_bps``, ``peak_fp32_gflops``); byte sizes are exact integers, and a DRAM or SRAM
  size a vendor writes as "2 GB" or "32 KB" is binary (2 GiB, 32 KiB), as DRAM parts are;
* every numeric figure that is set names its source in ``sources`` (a datasheet or vendor page
  URL, or a paper); derived figures say how they were derived;
* an unknown figure is left out (``None``), never written as 0, and the shipped catalog says
  in ``sources`` why it is unknown ("unknown: ...", "not applicable: ...");
* no figure is zero or negative, and a field name the record does not have is an error.

``this-machine`` is not in the file: :func:`this_machine` detects it at run time and says so in
its sources.

``usable_memory_bytes`` is the RAM a training process can really have on the device's usual
image: what the kernel reports as ``MemAvailable`` at idle, with the OS, its services and (on a
Jetson, whose GPU shares the RAM) the boot-time carve-outs already taken. It is at most
``memory_bytes``. :meth:`Device.training_memory_bytes` takes the runtime's own baseline (Python,
PyTorch, edgetrain) off it, leaving what a training step's tensors may use. Where no source gives
it for the usual image, it is unknown and ``edgetrain bench device`` measures it on the board.

The energy figures (:data:`ENERGY_FIELDS`) follow the same rules: ``compute_flops_per_s`` is an
*achieved* training rate measured on the device (POET's, not the datasheet peak in
``peak_fp32_gflops``), ``compute_power_w`` the power drawn while computing, and
``pagein_*`` / ``pageout_*`` the latency per transfer, throughput and power of paging to the
device's flash or SD card. :mod:`edgetrain.costs.energy` turns them into an
:class:`~edgetrain.costs.energy.EnergyProfile` and refuses a device that lacks any of them, naming
the fields, rather than guessing.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import EdgetrainError, UnknownNameError
from ..units import MAX_BYTES, format_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "Device",
    "DeviceCatalogError",
    "ENERGY_FIELDS",
    "INT_FIELDS",
    "NUMERIC_FIELDS",
    "THIS_MACHINE",
    "DEVICES_ENV",
    "device_names",
    "devices_table",
    "get_device",
    "load_catalog",
    "load_devices_file",
    "proc_kib_fields",
    "this_machine",
    "user_devices",
]

logger = logging.getLogger(__name__)

THIS_MACHINE = "this-machine"
DEVICES_ENV = "EDGETRAIN_DEVICES"   # device files the user adds to the catalog (os.pathsep-separated)
INT_FIELDS = ("memory_bytes", "usable_memory_bytes", "flash_bytes", "cpu_cores")
# The figures an energy cost model needs (see edgetrain.costs.energy), each in its unit.
ENERGY_FIELDS = ("compute_flops_per_s", "compute_power_w", "pagein_latency_s", "pagein_bps", "pagein_power_w",
                 "pageout_latency_s", "pageout_bps", "pageout_power_w")
# A sustained rate on a named microbenchmark, the time model's calibration (NOTE [ One time model ]).
RATE_FIELDS = ("gemm_fp64_flops_per_s",)
FLOAT_FIELDS = ("cpu_max_freq_hz", "peak_fp32_gflops", "typical_power_w", "peak_power_w",
                "storage_read_bps", "storage_write_bps", *RATE_FIELDS, *ENERGY_FIELDS)
NUMERIC_FIELDS = INT_FIELDS + FLOAT_FIELDS
TEXT_FIELDS = ("title", "cpu", "accelerator", "storage")
_REQUIRED = ("title", "memory_bytes", "cpu")
_DATA_FIELDS = TEXT_FIELDS + NUMERIC_FIELDS  # what sources and notes may be keyed by
_NOTE_KEYS = (*_DATA_FIELDS, "device")  # "device": a note on the record as a whole
_NOT_MEASURED = "unknown: not measured"


class DeviceCatalogError(EdgetrainError, ValueError):
    """A device file that breaks the catalog's rules (unknown field, missing source, bad value)."""


@dataclass(frozen=True)
class Device:
    """One machine: memory, compute, power and storage figures, each with its source.

    Args:
        name: the command-line name, e.g. ``"odroid-xu4"``.
        title: a human-readable name, e.g. ``"Hardkernel ODROID-XU4"``.
        memory_bytes: main memory (RAM) in bytes; for a microcontroller, its SRAM.
        usable_memory_bytes: the part of ``memory_bytes`` a training process can have on the
            device's usual image (``MemAvailable`` at idle; for a microcontroller, the SRAM its
            firmware leaves), at most ``memory_bytes``.
        cpu: the processor in words (cores, clusters, clock).
        cpu_cores: number of CPU cores (all clusters).
        cpu_max_freq_hz: clock of the fastest CPU core, in Hz.
        accelerator: the GPU / NPU in words, or ``None`` when there is none.
        peak_fp32_gflops: peak FP32 rate of the device's best compute unit, in GFLOP/s
            (``notes["peak_fp32_gflops"]`` says which unit).
        typical_power_w: typical power draw in watts (``notes`` say of what).
        peak_power_w: peak power draw, or a supply or mode budget that bounds it, in watts.
        storage: secondary storage type, e.g. ``"eMMC/microSD"``, ``"microSD"``, ``"NVMe"``.
        storage_read_bps: sequential read bandwidth of that storage, in bytes per second.
        storage_write_bps: sequential write bandwidth of that storage, in bytes per second.
        flash_bytes: on-chip program flash of a microcontroller, in bytes.
        gemm_fp64_flops_per_s: sustained FP64 LINPACK / DGEMM rate of the whole device, achieved
            (measured), in FLOP/s; with the same probe run here it calibrates the device's
            training time (NOTE [ One time model ] in :mod:`edgetrain.costs.timemodel`).
        compute_flops_per_s: achieved (measured) training compute rate in FLOP/s, measured by a
            training step on the device itself; not a peak.
        compute_power_w: power drawn while computing, in watts (``notes`` say whether it is the
            whole board or the increment above idle).
        pagein_latency_s: fixed latency of one page-in (storage to RAM) transfer, in seconds.
        pagein_bps: page-in throughput, in bytes per second.
        pagein_power_w: power drawn while paging in, in watts.
        pageout_latency_s: fixed latency of one page-out (RAM to storage) transfer, in seconds.
        pageout_bps: page-out throughput, in bytes per second.
        pageout_power_w: power drawn while paging out, in watts.
        sources: field name -> where the figure comes from, or why it is unknown.
        notes: field name (or ``"device"``) -> a remark on the figure.
    """

    name: str
    title: str
    memory_bytes: int
    cpu: str
    usable_memory_bytes: int | None = None
    cpu_cores: int | None = None
    cpu_max_freq_hz: float | None = None
    accelerator: str | None = None
    peak_fp32_gflops: float | None = None
    typical_power_w: float | None = None
    peak_power_w: float | None = None
    storage: str | None = None
    storage_read_bps: float | None = None
    storage_write_bps: float | None = None
    flash_bytes: int | None = None
    gemm_fp64_flops_per_s: float | None = None
    compute_flops_per_s: float | None = None
    compute_power_w: float | None = None
    pagein_latency_s: float | None = None
    pagein_bps: float | None = None
    pagein_power_w: float | None = None
    pageout_latency_s: float | None = None
    pageout_bps: float | None = None
    pageout_power_w: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)
    notes: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for key in ("name", "title", "cpu"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key).strip():
                raise DeviceCatalogError(f"device {self.name!r}: {key} must be non-empty text")
        for key in NUMERIC_FIELDS:
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DeviceCatalogError(f"device {self.name!r}: {key} must be a finite number, got {value!r}")
            if key in INT_FIELDS and not isinstance(value, int):
                raise DeviceCatalogError(f"device {self.name!r}: {key} must be an integer, got {value!r}")
            if value <= 0:
                raise DeviceCatalogError(
                    f"device {self.name!r}: {key} must be > 0, got {value!r} "
                    "(leave an unknown figure out and say why in sources; never write 0)")
            if key.endswith("_bytes") and value >= MAX_BYTES:
                raise DeviceCatalogError(f"device {self.name!r}: {key} = {value!r} is more than any machine's "
                                         f"address space (2**63 bytes)")
            if not str(self.sources.get(key, "")).strip():
                raise DeviceCatalogError(f"device {self.name!r}: {key} = {value!r} has no entry in sources")
        if self.usable_memory_bytes is not None and self.usable_memory_bytes > self.memory_bytes:
            raise DeviceCatalogError(f"device {self.name!r}: usable_memory_bytes = {self.usable_memory_bytes} exceeds "
                                     f"memory_bytes = {self.memory_bytes}")
        for label, mapping, allowed in (("sources", self.sources, _DATA_FIELDS), ("notes", self.notes, _NOTE_KEYS)):
            unknown = sorted(set(mapping) - set(allowed))
            if unknown:
                raise DeviceCatalogError(f"device {self.name!r}: {label} names unknown fields {unknown}; "
                                         f"valid: {', '.join(allowed)}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "notes", MappingProxyType(dict(self.notes)))

    def training_memory_bytes(self, runtime_baseline_bytes: int) -> int | None:
        """What a training step's tensors may use here: usable memory minus the runtime's baseline.

        Args:
            runtime_baseline_bytes: the training process's memory before its first step (the
                interpreter, PyTorch, edgetrain and the model's code), measured, in bytes.

        Returns:
            ``usable_memory_bytes - runtime_baseline_bytes``; zero or less means nothing is left
            for training. ``None`` when the usable memory is unknown.

        Raises:
            ValueError: a negative baseline.

        Example:
            >>> Device("b", "B", 2 * 1024**3, "cpu", usable_memory_bytes=1024**3,
            ...        sources={"memory_bytes": "s", "usable_memory_bytes": "s"}).training_memory_bytes(300 * 1024**2)
            759169024
        """
        if runtime_baseline_bytes < 0:
            raise ValueError(f"runtime_baseline_bytes must be >= 0, got {runtime_baseline_bytes}")
        return None if self.usable_memory_bytes is None else self.usable_memory_bytes - runtime_baseline_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (``None`` for unknown figures)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["sources"] = dict(self.sources)
        out["notes"] = dict(self.notes)
        return out


def _device_from_table(name: str, table: Any, origin: str) -> Device:
    if not isinstance(table, dict):
        raise DeviceCatalogError(f"{origin}: device {name!r} must be a table, got {type(table).__name__}")
    allowed = set(_DATA_FIELDS) | {"sources", "notes"}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise DeviceCatalogError(f"{origin}: device {name!r} has unknown field(s) {', '.join(map(repr, unknown))}; "
                                 f"valid fields: {', '.join(sorted(allowed))}")
    missing = [key for key in _REQUIRED if key not in table]
    if missing:
        raise DeviceCatalogError(f"{origin}: device {name!r} lacks required field(s) {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key in TEXT_FIELDS:
        if key in table and not isinstance(table[key], str):
            raise DeviceCatalogError(f"{origin}: device {name!r}: {key} must be text, got {table[key]!r}")
        values[key] = table.get(key)
    for key in FLOAT_FIELDS:
        value = table.get(key)
        # TOML writes 20 and 20.0 differently; both are fine for a float field.
        values[key] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    for key in INT_FIELDS:
        values[key] = table.get(key)
    for key in ("sources", "notes"):
        mapping = table.get(key, {})
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise DeviceCatalogError(f"{origin}: device {name!r}: {key} must be a table of text")
        values[key] = mapping
    try:
        return Device(name=name, **values)
    except DeviceCatalogError as exc:
        raise DeviceCatalogError(f"{origin}: {exc}") from None


def parse_catalog(text: str, origin: str) -> dict[str, Device]:
    """The devices of a device file's ``text`` (``origin`` names it in errors), validated; raises DeviceCatalogError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeviceCatalogError(f"{origin}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"devices"})
    if extra:
        raise DeviceCatalogError(f"{origin}: unknown top-level key(s) {extra}; devices go in [devices.<name>] tables")
    tables = data.get("devices", {})
    if THIS_MACHINE in tables:
        raise DeviceCatalogError(f"{origin}: {THIS_MACHINE!r} is detected at run time and cannot be defined")
    devices = {name: _device_from_table(name, table, origin) for name, table in tables.items()}
    logger.debug("read %d devices from %s", len(devices), origin)
    return devices


def load_devices_file(path: str | os.PathLike[str]) -> dict[str, Device]:
    """Read and validate a device file in the format of the shipped ``devices.toml``.

    Args:
        path: a TOML file with one ``[devices.<name>]`` table per device.

    Returns:
        name -> :class:`Device`, in file order.

    Raises:
        DeviceCatalogError: unknown field, a set figure without a source, a zero, negative or
            non-numeric figure, a missing required field, or invalid TOML.

    Example:
        >>> load_devices_file("my_devices.toml")["my-board"].memory_bytes  # doctest: +SKIP
        4294967296
    """
    return parse_catalog(Path(path).read_text(encoding="utf-8"), str(path))


@functools.lru_cache(maxsize=1)
def _builtin_devices() -> tuple[Device, ...]:
    text = resources.files(__package__).joinpath("devices.toml").read_text(encoding="utf-8")
    return tuple(parse_catalog(text, "edgetrain/devices/devices.toml").values())


def load_catalog() -> dict[str, Device]:
    """The shipped catalog, name -> :class:`Device` (``this-machine`` is not in it).

    The file is read and validated once per process; each call returns a new dict, so callers
    may change theirs freely.

    Example:
        >>> load_catalog()["odroid-xu4"].memory_bytes == 2 * 1024**3
        True
    """
    return {device.name: device for device in _builtin_devices()}


def user_devices() -> dict[str, Device]:
    """Devices of the files named in ``EDGETRAIN_DEVICES`` (paths joined by ``os.pathsep``), in order.

    A later file's entry replaces an earlier one of the same name, and a user entry replaces
    the shipped entry of that name wherever a device is looked up (e.g. an ``odroid-xu4``
    measured with ``edgetrain bench device``). Read on every call: the variable may change.

    Raises:
        DeviceCatalogError: a file that is missing or invalid, naming it.
    """
    found: dict[str, Device] = {}
    for path in filter(None, os.environ.get(DEVICES_ENV, "").split(os.pathsep)):
        try:
            found.update(load_devices_file(path))
        except OSError as exc:
            raise DeviceCatalogError(f"device file {path} (from {DEVICES_ENV}): {exc.strerror or exc}") from None
    return found


def device_names() -> list[str]:
    """Every name :func:`get_device` accepts: the catalog's, in file order, the user's, then ``this-machine``."""
    shipped = [device.name for device in _builtin_devices()]
    return shipped + [name for name in user_devices() if name not in shipped] + [THIS_MACHINE]


def get_device(name: str) -> Device:
    """The device called ``name``: a user device file's (:func:`user_devices`) before the shipped one.

    ``"this-machine"`` is detected now (see :func:`this_machine`).

    Raises:
        UnknownNameError: for a name not in :func:`device_names`; the message lists them.

    Example:
        >>> get_device("jetson-nano").cpu_cores
        4
    """
    if name == THIS_MACHINE:
        return this_machine()
    user = user_devices()
    if name in user:
        return user[name]
    for device in _builtin_devices():
        if device.name == name:
            return device
    raise UnknownNameError("device", name, device_names())


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def proc_kib_fields(text: str) -> dict[str, int]:
    r"""The ``Name: N kB`` lines of ``/proc/meminfo`` or ``/proc/<pid>/status``, name -> bytes.

    The kernel's "kB" is KiB. Lines without that unit (counts such as ``HugePages_Total``, text
    such as ``Name:\tpython3``, the octal ``Umask``) are left out.

    Example:
        >>> proc_kib_fields("MemTotal:        2009632 kB\nMemAvailable:    1502340 kB\n")["MemAvailable"]
        1538396160
    """
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":") and parts[1].isdigit() and parts[2].lower() == "kb":
            found[parts[0][:-1]] = int(parts[1]) * 1024
    return found


def _detect_memory(proc: Path) -> tuple[int, str]:
    meminfo = proc_kib_fields(_read_text(proc / "meminfo") or "")
    if "MemTotal" in meminfo:
        return (meminfo["MemTotal"], f"detected at run time: MemTotal in {proc / 'meminfo'} (RAM the kernel manages, "
                                     "a little below the installed DRAM)")
    try:
        n_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        n_bytes = -1
    if n_bytes > 0:
        logger.debug("no MemTotal in %s; memory from os.sysconf", proc / "meminfo")
        return n_bytes, "detected at run time: os.sysconf SC_PHYS_PAGES x SC_PAGE_SIZE"
    raise EdgetrainError("cannot detect this machine's memory (no /proc/meminfo, no os.sysconf)")


def _detect_usable_memory(proc: Path, memory_bytes: int) -> tuple[int | None, str]:
    # NOTE [ Usable memory, measured from inside ]
    # MemAvailable is the kernel's estimate of what new processes can have without swapping. The
    # process reading it holds memory too (this one: Python, perhaps PyTorch), which a training
    # process started in its place would have; its anonymous RSS is added back. Its file-backed
    # pages are page cache, already counted in MemAvailable as far as they can be reclaimed.
    available = proc_kib_fields(_read_text(proc / "meminfo") or "").get("MemAvailable")
    if available is None:
        return None, f"unknown: no MemAvailable in {proc / 'meminfo'} (Linux before 3.14, or not Linux)"
    own = proc_kib_fields(_read_text(proc / "self/status") or "").get("RssAnon", 0)
    return (min(available + own, memory_bytes),
            f"detected at run time: MemAvailable in {proc / 'meminfo'} plus this process's RssAnon in "
            f"{proc / 'self/status'} ({own} B): what a process could have here without swapping")


def _detect_cpu_model(proc: Path) -> tuple[str, str]:
    cpuinfo = _read_text(proc / "cpuinfo") or ""
    found: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            found.setdefault(key.strip().lower(), value.strip())
    # x86 names the CPU in "model name"; ARM boards name the board in "Model" or the SoC in "Hardware".
    for key in ("model name", "model", "hardware", "cpu model"):
        if key in found and not found[key].isdigit():
            return found[key], f"detected at run time: {key!r} in {proc / 'cpuinfo'}"
    model = platform.processor() or platform.machine()
    if model:
        return model, "detected at run time: Python's platform module"
    return "unknown CPU", "unknown: neither /proc/cpuinfo nor the platform module names the CPU"


def _detect_max_freq_hz(sys_dir: Path) -> float | None:
    best = 0
    for path in sorted((sys_dir / "devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq")):
        text = (_read_text(path) or "").strip()
        if text.isdigit():
            best = max(best, int(text))
    return best * 1000.0 if best > 0 else None  # sysfs gives kHz


def _detect_nvidia_gpus(proc: Path) -> list[str]:
    models = []
    for info in sorted((proc / "driver/nvidia/gpus").glob("*/information")):
        for line in (_read_text(info) or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model" and value.strip():
                models.append(value.strip())
    return models


def _detect_this_machine(proc: Path = Path("/proc"), sys_dir: Path = Path("/sys")) -> Device:
    memory_bytes, memory_source = _detect_memory(proc)
    usable_bytes, usable_source = _detect_usable_memory(proc, memory_bytes)
    cpu, cpu_source = _detect_cpu_model(proc)
    cores = os.cpu_count()
    freq_hz = _detect_max_freq_hz(sys_dir)
    gpus = _detect_nvidia_gpus(proc)
    sources = {
        "memory_bytes": memory_source,
        "usable_memory_bytes": usable_source,
        "cpu": cpu_source,
        "cpu_cores": "detected at run time: os.cpu_count() (logical CPUs)" if cores else
                     "unknown: os.cpu_count() returned None",
        "cpu_max_freq_hz": f"detected at run time: largest cpuinfo_max_freq under {sys_dir / 'devices/system/cpu'}"
                           if freq_hz else f"{_NOT_MEASURED} (no cpufreq entries in sysfs)",
        "peak_fp32_gflops": _NOT_MEASURED,
        "typical_power_w": _NOT_MEASURED,
        "peak_power_w": _NOT_MEASURED,
        "storage_read_bps": _NOT_MEASURED,
        "storage_write_bps": _NOT_MEASURED,
        "flash_bytes": "not applicable: a machine that runs CPython and PyTorch is not a microcontroller",
        **{key: _NOT_MEASURED for key in (*RATE_FIELDS, *ENERGY_FIELDS)},
    }
    notes = {"device": "Detected at run time from the operating system; no benchmark is run.",
             "storage": "Storage type is not detected."}
    if gpus:
        sources["accelerator"] = f"detected at run time: {proc / 'driver/nvidia/gpus'}"
    else:
        notes["accelerator"] = "Only NVIDIA GPUs (through /proc/driver/nvidia) are detected."
    return Device(
        name=THIS_MACHINE,
        title=f"this machine ({platform.system() or 'unknown OS'} {platform.machine()})".strip(),
        memory_bytes=memory_bytes,
        usable_memory_bytes=usable_bytes,
        cpu=cpu,
        cpu_cores=cores,
        cpu_max_freq_hz=freq_hz,
        accelerator=", ".join(gpus) if gpus else None,
        sources=sources,
        notes=notes,
    )


def this_machine() -> Device:
    """The machine this process runs on, detected now.

    Memory comes from ``/proc/meminfo`` (else ``os.sysconf``), usable memory from its
    ``MemAvailable`` plus this process's own anonymous memory (NOTE [ Usable memory, measured
    from inside ]), cores from ``os.cpu_count()``, the
    CPU model from ``/proc/cpuinfo`` (else :mod:`platform`), the fastest core clock from
    ``cpufreq`` in sysfs, NVIDIA GPUs from ``/proc/driver/nvidia``. Nothing is benchmarked:
    FLOP/s, power, storage and energy figures are ``None`` with ``"unknown: not measured"`` as
    source.

    Raises:
        EdgetrainError: when not even the memory size can be detected.

    Example:
        >>> this_machine().memory_bytes > 0
        True
    """
    return _detect_this_machine()


def _number(value: float | None, fmt: str = "{:g}") -> str:
    return "?" if value is None else fmt.format(value)


def devices_table(devices: Iterable[Device]) -> Table:
    """A rich table of devices for the CLI; unknown figures show as ``?``.

    Example:
        >>> from rich.console import Console
        >>> Console().print(devices_table(load_catalog().values()))  # doctest: +SKIP
    """
    from rich.table import Table

    table = Table(title="Devices (sources: edgetrain devices --json)")
    for header, justify in (("name", "left"), ("title", "left"), ("memory", "right"), ("usable", "right"),
                            ("cores", "right"),
                            ("peak GFLOP/s", "right"), ("power W typ/peak", "right"), ("storage", "left"),
                            ("read/write MB/s", "right")):
        table.add_column(header, justify=justify, no_wrap=header != "title")  # type: ignore[arg-type]
    for device in devices:
        read = None if device.storage_read_bps is None else device.storage_read_bps / 1e6
        write = None if device.storage_write_bps is None else device.storage_write_bps / 1e6
        table.add_row(
            device.name,
            device.title,
            format_bytes(device.memory_bytes),
            "?" if device.usable_memory_bytes is None else format_bytes(device.usable_memory_bytes),
            _number(device.cpu_cores),
            _number(device.peak_fp32_gflops, "{:.1f}"),
            f"{_number(device.typical_power_w, '{:.3g}')}/{_number(device.peak_power_w, '{:.3g}')}",
            device.storage or "?",
            f"{_number(read, '{:.1f}')}/{_number(write, '{:.1f}')}",
        )
    return table
