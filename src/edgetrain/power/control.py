"""Run under a power mode and always give the board its mode back.

NOTE [ A mode is always restored ]
Applying a mode is a list of writes (``nvpmodel -m ID``, then sysfs: CPUs online, cpufreq governor,
cpufreq max clock), each planned and checked against what the board offers *before* the first one:
an unknown mode, a governor or clock the board does not list, more cores than it has, or no
permission fail with one line and nothing written. The old value of every knob is read first and
kept in a restore file (``power_restore.json`` in edgetrain's cache directory) before anything
changes. Restoring writes the old values back in reverse order and deletes the file. It runs

* when the ``with applied_mode(...)`` block ends, normally or by an exception (Ctrl-C included);
* from an ``atexit`` hook and a SIGTERM / SIGHUP handler, for a process told to stop;
* at the next start (:func:`recover_pending`, called by every ``edgetrain power`` command and by
  :func:`applied_mode` itself) when the process died without running either (SIGKILL, power loss):
  the file is still there and says what to put back.

If the board refuses a write half-way, the writes already made are undone before the error is
raised, so a failed apply leaves the mode as it was.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import EdgetrainError
from .modes import parse_cpu_list, parse_nvpmodel_conf

__all__ = ["Board", "ModeRequest", "PowerControlError", "PowerControlUnavailable", "applied_mode",
           "default_restore_file", "recover_pending"]

log = logging.getLogger(__name__)
NVPMODEL_STATUS = "var/lib/nvpmodel/status"  # 'pmode:0002' on a Jetson: the mode nvpmodel last set
Writer = Callable[[Path, str], None]
Runner = Callable[[list[str]], None]


class PowerControlError(EdgetrainError):
    """A mode that cannot be applied (unknown, refused by the board, no permission); the mode is unchanged."""


class PowerControlUnavailable(PowerControlError):
    """This machine exposes no knob to change (no cpufreq, no nvpmodel, no CPU hot-plug)."""


@dataclass(frozen=True)
class ModeRequest:
    """What to set; ``None`` leaves a knob as it is.

    Args:
        nvpmodel_id: an nvpmodel mode ID of the board's ``/etc/nvpmodel.conf``.
        online_cores: keep the first N present CPUs online, the others offline.
        governor: the cpufreq governor of every online CPU, e.g. ``"performance"``.
        cpu_max_freq_hz: the cpufreq max clock of every online CPU, in Hz (one the board lists).
    """

    nvpmodel_id: int | None = None
    online_cores: int | None = None
    governor: str | None = None
    cpu_max_freq_hz: float | None = None

    def is_empty(self) -> bool:
        return all(value is None for value in (self.nvpmodel_id, self.online_cores, self.governor,
                                               self.cpu_max_freq_hz))


def _write_sysfs(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _run_nvpmodel(args: list[str]) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def default_restore_file() -> Path:
    """``power_restore.json`` beside the host calibration (``$EDGETRAIN_CACHE_DIR`` or ``~/.cache/edgetrain``)."""
    from ..profiling.host import calibration_cache_path

    return calibration_cache_path().parent / "power_restore.json"


@dataclass
class Board:
    """The knobs under ``root`` (``/`` on a board; a sysfs-like directory in tests).

    ``writer`` writes one sysfs value and ``runner`` runs ``nvpmodel``; tests replace them to play
    a board that refuses a value (EINVAL) or a user without permission (EACCES).
    """

    root: Path = Path("/")
    writer: Writer = _write_sysfs
    runner: Runner = _run_nvpmodel
    restore_file: Path = field(default_factory=default_restore_file)

    @property
    def cpu_dir(self) -> Path:
        return self.root / "sys/devices/system/cpu"

    def read(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    def nvpmodel_mode(self) -> int | None:
        text = self.read(self.root / NVPMODEL_STATUS) or ""
        return int(text.partition(":")[2]) if text.startswith("pmode:") and text.partition(":")[2].isdigit() else None

    def unavailable_reason(self, request: ModeRequest) -> str | None:
        """Why ``request`` cannot be applied here at all, or ``None``."""
        if self.root == Path("/") and hasattr(os, "geteuid") and os.geteuid() != 0:
            return "changing power modes needs root (run with sudo)"
        if request.nvpmodel_id is not None and self.read(self.root / "etc/nvpmodel.conf") is None:
            return f"no nvpmodel here ({self.root / 'etc/nvpmodel.conf'} does not exist)"
        if (request.governor is not None or request.cpu_max_freq_hz is not None) \
                and not (self.cpu_dir / "cpu0/cpufreq").is_dir():
            return f"no cpufreq in {self.cpu_dir / 'cpu0'} (the kernel or the container exposes no CPU clock control)"
        if request.online_cores is not None and not any(self.cpu_dir.glob("cpu[0-9]*/online")):
            return f"no CPU hot-plug in {self.cpu_dir} (no cpuN/online files)"
        return None

    def plan(self, request: ModeRequest) -> tuple[list[tuple[Path, str]], int | None]:
        """The sysfs writes and the nvpmodel ID that apply ``request``, every value checked first.

        Raises:
            PowerControlUnavailable: no knob for part of the request here.
            PowerControlError: an unknown mode, a governor or clock the board does not list, a
                core count out of range.
        """
        reason = self.unavailable_reason(request)
        if reason is not None:
            raise PowerControlUnavailable(f"unavailable: {reason}")
        if request.nvpmodel_id is not None:
            conf = self.root / "etc/nvpmodel.conf"
            modes, _ = parse_nvpmodel_conf(self.read(conf) or "", str(conf))
            ids = sorted(mode.mode_id for mode in modes)
            if request.nvpmodel_id not in ids:
                raise PowerControlError(f"unknown power mode {request.nvpmodel_id}; {conf} defines {ids}; "
                                        "mode unchanged")
        present = parse_cpu_list(self.read(self.cpu_dir / "present") or "0")
        writes: list[tuple[Path, str]] = []
        online = list(parse_cpu_list(self.read(self.cpu_dir / "online") or "0"))
        if request.online_cores is not None:
            if not 1 <= request.online_cores <= len(present):
                raise PowerControlError(f"--cores must be 1..{len(present)} on this board, got "
                                        f"{request.online_cores}; mode unchanged")
            online = list(present[:request.online_cores])
            writes += [(self.cpu_dir / f"cpu{cpu}/online", "1" if cpu in online else "0") for cpu in present
                       if (self.cpu_dir / f"cpu{cpu}/online").exists()]
        freq = self.cpu_dir / "cpu0/cpufreq"
        if request.governor is not None:
            offered = (self.read(freq / "scaling_available_governors") or "").split()
            if offered and request.governor not in offered:
                raise PowerControlError(f"governor {request.governor!r} is not offered here; the board offers "
                                        f"{', '.join(offered)}; mode unchanged")
            writes += [(self.cpu_dir / f"cpu{cpu}/cpufreq/scaling_governor", request.governor) for cpu in online]
        if request.cpu_max_freq_hz is not None:
            khz = round(request.cpu_max_freq_hz / 1e3)
            listed = [int(x) for x in (self.read(freq / "scaling_available_frequencies") or "").split()]
            low, high = (int(self.read(freq / name) or 0) for name in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
            if (listed and khz not in listed) or (high and not low <= khz <= high):
                offer = ", ".join(f"{x / 1e3:g}" for x in listed) if listed else f"{low / 1e3:g}-{high / 1e3:g}"
                raise PowerControlError(f"CPU clock {khz / 1e3:g} MHz is not offered here ({offer} MHz); "
                                        "mode unchanged")
            writes += [(self.cpu_dir / f"cpu{cpu}/cpufreq/scaling_max_freq", str(khz)) for cpu in online]
        return writes, request.nvpmodel_id


def _save_restore(path: Path, record: dict[str, Any]) -> None:
    from ..sysutil.fileio import write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def _restore(board: Board, record: dict[str, Any]) -> list[str]:
    """Write back the old values in reverse order, then nvpmodel's old mode; the failures, as text."""
    failures: list[str] = []
    for path, old in reversed(record.get("writes", [])):
        if old is None:
            continue
        try:
            board.writer(Path(path), old)
        except OSError as exc:
            failures.append(f"{path}: {exc.strerror or exc}")
    previous = record.get("nvpmodel_previous")
    if record.get("nvpmodel_applied") and previous is not None:
        try:
            board.runner(["nvpmodel", "-m", str(previous)])
        except (OSError, subprocess.CalledProcessError) as exc:
            failures.append(f"nvpmodel -m {previous}: {exc}")
    return failures


def recover_pending(board: Board | None = None) -> bool:
    """Restore what a process that died under a mode left changed (its restore file); True if it did.

    Raises:
        PowerControlError: the restore file is unreadable or a value could not be written back
            (the file is kept, so the next start tries again).
    """
    board = board or Board()
    if not board.restore_file.exists():
        return False
    try:
        record = json.loads(board.restore_file.read_text())
    except (OSError, ValueError) as exc:
        raise PowerControlError(f"cannot read the power restore file {board.restore_file}: {exc}") from None
    failures = _restore(Board(Path(record.get("root", "/")), board.writer, board.runner, board.restore_file), record)
    if failures:
        raise PowerControlError(f"could not restore the power mode: {'; '.join(failures)} "
                                f"(kept {board.restore_file} to retry)")
    board.restore_file.unlink()
    log.warning("restored the power mode a previous run left changed (%s)", board.restore_file)
    return True


@contextlib.contextmanager
def applied_mode(request: ModeRequest, board: Board | None = None) -> Iterator[dict[str, Any]]:
    """Apply ``request`` for the block, then restore (NOTE [ A mode is always restored ]).

    Yields:
        the restore record: the writes made with each knob's old value, and nvpmodel's old mode.

    Raises:
        PowerControlUnavailable: no knob to change here; PowerControlError: a bad or refused mode.
        Either way nothing is left changed.

    Example:
        >>> with applied_mode(ModeRequest(governor="performance")):  # doctest: +SKIP
        ...     train()
    """
    board = board or Board()
    recover_pending(board)
    writes, nvpmodel_id = board.plan(request)
    record: dict[str, Any] = {"pid": os.getpid(), "root": str(board.root),
                              "writes": [[str(path), board.read(path)] for path, _ in writes],
                              "nvpmodel_previous": board.nvpmodel_mode(), "nvpmodel_applied": False}
    _save_restore(board.restore_file, record)
    done = {"restored": False}

    def restore_once() -> None:
        if not done["restored"]:
            done["restored"] = True
            failures = _restore(board, record)
            if failures:
                log.error("could not restore the power mode: %s (kept %s)", "; ".join(failures), board.restore_file)
            else:
                board.restore_file.unlink(missing_ok=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        restore_once()
        raise SystemExit(128 + signum)

    # Signal handlers can only be set from the main thread; elsewhere atexit and the restore file remain.
    main = threading.current_thread() is threading.main_thread()
    previous_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    atexit.register(restore_once)
    try:
        if nvpmodel_id is not None:
            record["nvpmodel_applied"] = True
            _save_restore(board.restore_file, record)
            try:
                board.runner(["nvpmodel", "-m", str(nvpmodel_id)])
            except (OSError, subprocess.CalledProcessError) as exc:
                raise PowerControlError(f"the board refused nvpmodel -m {nvpmodel_id}: {exc}; mode unchanged") from None
        for path, value in writes:
            try:
                board.writer(path, value)
            except OSError as exc:
                why = "no permission" if isinstance(exc, PermissionError) else "the board refused it"
                raise PowerControlError(f"{why}: writing {value} to {path} ({exc.strerror or exc}); "
                                        "mode unchanged") from None
        yield record
    finally:
        restore_once()
        atexit.unregister(restore_once)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
