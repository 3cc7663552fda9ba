"""Power modes: the sourced nvpmodel tables of the catalog's Jetsons, a board's own ``nvpmodel.conf``,
and what sysfs says the CPUs run at now.

NOTE [ Power modes and their sources ]
A :class:`PowerMode` is one nvpmodel mode: its ID and NAME, the CPU cores it keeps online, the CPU
and GPU clock caps, the memory-controller (EMC) cap and the power budget NVIDIA names it by. The
shipped table (``devices/power_modes.toml``) holds only numbers, each mode naming its ``source``,
and every figure it leaves out says why in ``unknown``; NVIDIA's configuration files themselves are
not redistributed. On a real board the modes come from the board's ``/etc/nvpmodel.conf``
(:func:`parse_nvpmodel_conf`), whose format the file's own header documents: ``< PARAM TYPE=...
NAME=... >`` sections naming knobs, ``< POWER_MODEL ID=... NAME=... >`` sections setting them
(CPU clocks in kHz, GPU and EMC clocks in Hz, ``-1`` or ``0`` for "no cap"), and ``< PM_CONFIG DEFAULT=... >``.
"""

from __future__ import annotations

import functools
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import EdgetrainError, UnknownNameError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CpuState", "PowerMode", "PowerModeError", "catalog_modes", "modes_for_device", "nvpmodel_conf_path",
           "parse_cpu_list", "parse_nvpmodel_conf", "read_cpu_state"]

MODE_FIGURES = ("online_cores", "cpu_max_freq_hz", "gpu_max_freq_hz", "emc_max_freq_hz", "budget_w")
NVPMODEL_CONF = "etc/nvpmodel.conf"  # relative to the board's root


class PowerModeError(EdgetrainError, ValueError):
    """A power-mode table or ``nvpmodel.conf`` that breaks its format, or a mode that does not exist."""


@dataclass(frozen=True)
class PowerMode:
    """One nvpmodel mode; a figure no source gives is ``None`` and ``unknown`` says why.

    Args:
        mode_id: the nvpmodel mode ID (``nvpmodel -m ID``).
        name: the mode's NAME, e.g. ``"MAXN"``, ``"5W"``.
        online_cores: CPU cores kept online.
        cpu_max_freq_hz: the CPU clock cap (the highest over clusters), in Hz.
        gpu_max_freq_hz: the GPU clock cap, in Hz.
        emc_max_freq_hz: the memory controller's clock cap, in Hz.
        budget_w: the power budget the mode is named for, in watts.
        source: where the figures come from (a page, or the board's file).
        unknown: figure -> why it is left out.
    """

    mode_id: int
    name: str
    online_cores: int | None = None
    cpu_max_freq_hz: float | None = None
    gpu_max_freq_hz: float | None = None
    emc_max_freq_hz: float | None = None
    budget_w: float | None = None
    source: str = ""
    unknown: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for key in MODE_FIGURES:
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise PowerModeError(f"mode {self.mode_id} ({self.name}): {key} must be a number > 0, got {value!r}")
        if self.online_cores is not None and not isinstance(self.online_cores, int):
            raise PowerModeError(f"mode {self.mode_id} ({self.name}): online_cores must be an integer")
        object.__setattr__(self, "unknown", MappingProxyType(dict(self.unknown)))

    def to_dict(self) -> dict[str, Any]:
        return {"mode_id": self.mode_id, "name": self.name, **{key: getattr(self, key) for key in MODE_FIGURES},
                "source": self.source, "unknown": dict(self.unknown)}


def _mode_from_table(device: str, mode_key: str, table: Any) -> PowerMode:
    where = f"power_modes.toml: {device} mode {mode_key}"
    if not isinstance(table, dict):
        raise PowerModeError(f"{where} must be a table")
    allowed = {"name", "source", "unknown", *MODE_FIGURES}
    extra = sorted(set(table) - allowed)
    if extra:
        raise PowerModeError(f"{where}: unknown field(s) {extra}; valid: {', '.join(sorted(allowed))}")
    if not str(table.get("source", "")).strip() or not str(table.get("name", "")).strip():
        raise PowerModeError(f"{where}: every mode needs a name and a source")
    unknown = table.get("unknown", {})
    missing = [key for key in MODE_FIGURES if key not in table and key not in unknown]
    if missing:
        raise PowerModeError(f"{where}: {', '.join(missing)} neither set nor said unknown (with why) in 'unknown'")
    try:
        mode_id = int(mode_key)
    except ValueError:
        raise PowerModeError(f"{where}: the table's key must be the nvpmodel mode ID, an integer") from None
    figures: dict[str, Any] = {key: table.get(key) for key in MODE_FIGURES}
    for key in ("cpu_max_freq_hz", "gpu_max_freq_hz", "emc_max_freq_hz", "budget_w"):
        if isinstance(figures[key], int) and not isinstance(figures[key], bool):
            figures[key] = float(figures[key])
    return PowerMode(mode_id, str(table["name"]), source=str(table["source"]), unknown=unknown, **figures)


def parse_modes_toml(text: str) -> dict[str, tuple[PowerMode, ...]]:
    """Device name -> its modes (by ID) from a ``power_modes.toml`` text; raises PowerModeError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PowerModeError(f"power_modes.toml: not valid TOML: {exc}") from None
    out: dict[str, tuple[PowerMode, ...]] = {}
    for device, table in data.items():
        modes = table.get("modes", {}) if isinstance(table, dict) else {}
        out[device] = tuple(sorted((_mode_from_table(device, key, value) for key, value in modes.items()),
                                   key=lambda mode: mode.mode_id))
    return out


@functools.lru_cache(maxsize=1)
def catalog_modes() -> Mapping[str, tuple[PowerMode, ...]]:
    """The shipped, sourced mode tables: device name -> modes (NOTE [ Power modes and their sources ])."""
    text = resources.files("edgetrain.devices").joinpath("power_modes.toml").read_text(encoding="utf-8")
    return MappingProxyType(parse_modes_toml(text))


def modes_for_device(device: str) -> tuple[PowerMode, ...]:
    """The sourced modes of a catalog device.

    Raises:
        UnknownNameError: a device that is not in the catalog.
        PowerModeError: a catalog device with no sourced mode table (says which have one).
    """
    from ..devices import device_names

    if device not in device_names():
        raise UnknownNameError("device", device, device_names())
    modes = catalog_modes().get(device)
    if not modes:
        raise PowerModeError(f"no sourced power-mode table for {device!r} in edgetrain; devices with one: "
                             f"{', '.join(sorted(catalog_modes()))} (on the board, `edgetrain power modes` reads "
                             "its /etc/nvpmodel.conf)")
    return modes


_SECTION = re.compile(r"<\s*(PARAM|POWER_MODEL|PM_CONFIG)\s+([^>]*)>")
_ATTR = re.compile(r"(\w+)=(\S+)")


def _mode_from_settings(mode_id: int, name: str, settings: dict[str, dict[str, str]], origin: str) -> PowerMode:
    """A PowerMode from one POWER_MODEL's ``PARAM -> ARG -> VALUE`` settings (CPU kHz, GPU/EMC Hz)."""
    online = settings.get("CPU_ONLINE", {})
    cores = sum(1 for value in online.values() if value.strip() == "1") if online else None
    cpu_khz = [int(args["MAX_FREQ"]) for param, args in settings.items()
               if param.startswith("CPU_") and "MAX_FREQ" in args]
    cpu_hz = None if not cpu_khz or min(cpu_khz) <= 0 else max(cpu_khz) * 1e3

    def cap_hz(param: str) -> float | None:  # -1 (and 0, as the Nano's file writes EMC's) is "no cap"
        value = int(settings.get(param, {}).get("MAX_FREQ", "-1"))
        return None if value <= 0 else float(value)

    budget = re.fullmatch(r"(?:MODE_)?(\d+(?:\.\d+)?)W(?:_.*)?", name)
    unknown = {key: "not capped by the mode (-1 or 0) or not set in the file"
               for key, value in (("cpu_max_freq_hz", cpu_hz), ("gpu_max_freq_hz", cap_hz("GPU")),
                                  ("emc_max_freq_hz", cap_hz("EMC"))) if value is None}
    if budget is None:
        unknown["budget_w"] = "the mode's name states no budget"
    return PowerMode(mode_id, name, online_cores=cores or None, cpu_max_freq_hz=cpu_hz, gpu_max_freq_hz=cap_hz("GPU"),
                     emc_max_freq_hz=cap_hz("EMC"), budget_w=None if budget is None else float(budget.group(1)),
                     source=f"{origin} (budget from the mode's name)" if budget else origin, unknown=unknown)


def parse_nvpmodel_conf(text: str, origin: str = "nvpmodel.conf") -> tuple[tuple[PowerMode, ...], int | None]:
    """The modes of an ``nvpmodel.conf`` text and its default mode ID.

    Raises:
        PowerModeError: no POWER_MODEL section, a malformed section header or setting line, a
            setting of an undeclared PARAM, or a DEFAULT that names no mode.

    Example:
        >>> parse_nvpmodel_conf("< PARAM TYPE=FILE NAME=CPU_ONLINE >\\nCORE_0 /sys/x\\n"
        ...                     "< POWER_MODEL ID=0 NAME=MAXN >\\nCPU_ONLINE CORE_0 1\\n")[0][0].online_cores
        1
    """
    params: set[str] = set()
    models: list[tuple[int, str, dict[str, dict[str, str]]]] = []
    default: int | None = None
    section: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _SECTION.fullmatch(line)
        if header:
            section, attrs = header.group(1), dict(_ATTR.findall(header.group(2)))
            try:
                if section == "PARAM":
                    params.add(attrs["NAME"])
                elif section == "POWER_MODEL":
                    models.append((int(attrs["ID"]), attrs["NAME"], {}))
                else:
                    default = int(attrs["DEFAULT"])
            except (KeyError, ValueError):
                raise PowerModeError(f"{origin}:{number}: malformed section header {line!r}") from None
            continue
        if line.startswith("<"):
            raise PowerModeError(f"{origin}:{number}: unknown section {line!r}")
        parts = line.split()
        if section == "POWER_MODEL":
            if len(parts) != 3:
                raise PowerModeError(f"{origin}:{number}: a mode's setting is 'PARAM ARG VALUE', got {line!r}")
            if parts[0] not in params:
                raise PowerModeError(f"{origin}:{number}: {parts[0]} is not a declared PARAM")
            models[-1][2].setdefault(parts[0], {})[parts[1]] = parts[2]
        elif section != "PARAM" or len(parts) != 2:
            raise PowerModeError(f"{origin}:{number}: unexpected line {line!r}")
    if not models:
        raise PowerModeError(f"{origin}: no POWER_MODEL section")
    if default is not None and default not in {mode_id for mode_id, _, _ in models}:
        raise PowerModeError(f"{origin}: PM_CONFIG DEFAULT={default} names no POWER_MODEL")
    return tuple(_mode_from_settings(mode_id, name, settings, origin) for mode_id, name, settings in models), default


def nvpmodel_conf_path(root: Path = Path("/")) -> Path | None:
    """The board's ``/etc/nvpmodel.conf`` under ``root`` when it exists."""
    path = root / NVPMODEL_CONF
    return path if path.is_file() else None


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The CPUs of a sysfs CPU list such as ``0-3,6`` (``/sys/devices/system/cpu/online``).

    Example:
        >>> parse_cpu_list("0-2,5\\n")
        (0, 1, 2, 5)
    """
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            cpus.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise PowerModeError(f"not a CPU list: {text.strip()!r}") from None
    return tuple(cpus)


@dataclass(frozen=True)
class CpuState:
    """What sysfs says about the CPUs: which are online and each one's cpufreq settings (kHz as sysfs)."""

    present: tuple[int, ...]
    online: tuple[int, ...]
    governors: Mapping[int, str]
    max_freq_khz: Mapping[int, int]
    hardware_max_freq_khz: Mapping[int, int]
    nvpmodel_available: bool

    @property
    def has_cpufreq(self) -> bool:
        return bool(self.governors)

    def to_dict(self) -> dict[str, Any]:
        return {"present": list(self.present), "online": list(self.online),
                "governors": {str(k): v for k, v in self.governors.items()},
                "max_freq_khz": {str(k): v for k, v in self.max_freq_khz.items()},
                "hardware_max_freq_khz": {str(k): v for k, v in self.hardware_max_freq_khz.items()},
                "nvpmodel_available": self.nvpmodel_available}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_cpu_state(root: Path = Path("/")) -> CpuState:
    """Online CPUs and per-CPU cpufreq (governor, max and hardware max clock) under ``root``'s sysfs.

    ``root`` is ``/`` on a board; tests pass a directory laid out like sysfs.
    """
    cpu_dir = root / "sys/devices/system/cpu"
    present = parse_cpu_list(_read(cpu_dir / "present") or "")
    online = parse_cpu_list(_read(cpu_dir / "online") or "")
    governors: dict[int, str] = {}
    max_khz: dict[int, int] = {}
    hw_khz: dict[int, int] = {}
    for cpu in present:
        freq = cpu_dir / f"cpu{cpu}" / "cpufreq"
        governor, top, hardware = (_read(freq / name) for name in
                                   ("scaling_governor", "scaling_max_freq", "cpuinfo_max_freq"))
        if governor is not None:
            governors[cpu] = governor
        if top is not None and top.isdigit():
            max_khz[cpu] = int(top)
        if hardware is not None and hardware.isdigit():
            hw_khz[cpu] = int(hardware)
    nvpmodel = nvpmodel_conf_path(root) is not None and (root != Path("/") or shutil.which("nvpmodel") is not None)
    return CpuState(present, online, MappingProxyType(governors), MappingProxyType(max_khz), MappingProxyType(hw_khz),
                    nvpmodel)
