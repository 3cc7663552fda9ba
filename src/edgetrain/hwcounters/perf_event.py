"""Hardware and software event counters of this process through ``perf_event_open(2)``, by ctypes.

NOTE [ Counters without perf ]
No ``perf`` binary and no compiler: the ``perf_event_attr`` record is a ctypes structure (the
kernel's layout up to ``PERF_ATTR_SIZE_VER5``, 112 bytes), the system call is ``syscall(298)`` on
x86_64, ``syscall(241)`` on aarch64 and ``syscall(364)`` on 32-bit ARM. Every counter is read
with ``PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING``, so a multiplexed counter
says how long it really counted (``running_s`` of ``enabled_s``) and its value can be scaled.

* *Every thread*: a counter opened with ``pid = 0`` counts the calling thread only. PyTorch's
  intra-op threads exist by the time a step runs, so one counter is opened per thread in
  ``/proc/self/task`` (with ``inherit`` for threads created later) and their counts are summed.
* *big.LITTLE*: a board whose cores have different PMUs (the XU4's Cortex-A15 and Cortex-A7, an
  Intel hybrid's ``cpu_core`` and ``cpu_atom``) lists each under
  ``/sys/bus/event_source/devices/<pmu>/type``. A hardware event is then opened once per PMU, as
  ``PERF_TYPE_HARDWARE`` with the PMU's type in the config's upper 32 bits (the kernel's extended
  hardware type), and reported per PMU: the cycles of a little core are not a big core's.
* *No PMU* (a VM, a container, this machine): each hardware counter reports ``unavailable:
  <reason>`` from the error of its own ``perf_event_open`` (ENOENT: no such event; EACCES/EPERM:
  ``perf_event_paranoid``), while the software events (task clock, page faults, context
  switches) still count.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgetrainError

__all__ = ["Counter", "CounterSet", "EventSpec", "HARDWARE_EVENTS", "Reading", "SOFTWARE_EVENTS", "cpu_pmus",
           "syscall_number"]

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE = 0, 1, 3
PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING = 1, 2
PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_DISABLE = 0x2400, 0x2401
EXTENDED_TYPE_SHIFT = 32
_SYSCALLS = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "armv7l": 364, "armv6l": 364}
EVENT_SOURCES = Path("/sys/bus/event_source/devices")


@dataclass(frozen=True)
class EventSpec:
    """One event: a name as ``perf stat`` writes it, its perf type and config."""

    name: str
    type: int
    config: int

    @property
    def hardware(self) -> bool:
        return self.type in (PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE)


def _cache(cache: int, op: int, result: int) -> int:
    return cache | (op << 8) | (result << 16)


HARDWARE_EVENTS = (
    EventSpec("instructions", PERF_TYPE_HARDWARE, 1),
    EventSpec("cycles", PERF_TYPE_HARDWARE, 0),
    EventSpec("branches", PERF_TYPE_HARDWARE, 4),
    EventSpec("branch-misses", PERF_TYPE_HARDWARE, 5),
    EventSpec("L1-dcache-loads", PERF_TYPE_HW_CACHE, _cache(0, 0, 0)),
    EventSpec("L1-dcache-load-misses", PERF_TYPE_HW_CACHE, _cache(0, 0, 1)),
)
SOFTWARE_EVENTS = (
    EventSpec("task-clock", PERF_TYPE_SOFTWARE, 1),   # nanoseconds on a CPU
    EventSpec("page-faults", PERF_TYPE_SOFTWARE, 2),
    EventSpec("context-switches", PERF_TYPE_SOFTWARE, 3),
)


class _PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to PERF_ATTR_SIZE_VER5 (include/uapi/linux/perf_event.h)."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
                ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
                ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
                ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
                ("sample_max_stack", ctypes.c_uint16), ("reserved_2", ctypes.c_uint16)]


FLAG_DISABLED, FLAG_INHERIT, FLAG_EXCLUDE_KERNEL, FLAG_EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 5, 1 << 6


def syscall_number(machine: str | None = None) -> int | None:
    """``perf_event_open``'s system call number on this (or ``machine``'s) architecture, if known."""
    return _SYSCALLS.get((machine or platform.machine()).lower())


def cpu_pmus(root: Path = EVENT_SOURCES) -> dict[str, int]:
    """CPU PMUs by name -> perf type: ``cpu`` on most x86, ``armv*``/``cpu_core``/``cpu_atom`` and the like elsewhere.

    A PMU counts as a CPU PMU when it is named ``cpu``/``cpu_*`` or ``armv*``, or lists the CPUs it
    covers in a ``cpus`` file (an ARM PMU); uncore, software, tracepoint and breakpoint PMUs do not.
    """
    pmus: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for entry in sorted(root.iterdir()):
            name = entry.name
            if name == "cpu" or name.startswith(("cpu_", "armv")) or (entry / "cpus").exists():
                with contextlib.suppress(OSError, ValueError):
                    pmus[name] = int((entry / "type").read_text())
    return pmus


def _reason(code: int, event: str) -> str:
    if code in (errno.ENOENT, errno.ENODEV, errno.EOPNOTSUPP, errno.EINVAL):
        return f"no hardware PMU counts {event} here ({errno.errorcode.get(code, code)})"
    if code in (errno.EACCES, errno.EPERM):
        paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
        level = paranoid.read_text().strip() if paranoid.exists() else "?"
        return f"no permission (perf_event_paranoid = {level}; run as root or lower it)"
    return f"perf_event_open failed: {os.strerror(code)}"


@dataclass(frozen=True)
class Reading:
    """A counter's count (summed over threads), and the nanoseconds it was enabled and really counting."""

    value: int
    enabled_ns: int
    running_ns: int

    def __sub__(self, other: Reading) -> Reading:
        return Reading(self.value - other.value, self.enabled_ns - other.enabled_ns,
                       self.running_ns - other.running_ns)

    @property
    def scaled(self) -> float:
        """The count scaled to the whole enabled time (a multiplexed counter counted only part of it)."""
        if self.running_ns <= 0:
            return float(self.value)
        return self.value * self.enabled_ns / self.running_ns


@dataclass
class Counter:
    """One event on one PMU (``pmu`` empty for the default), open on every thread, or why it is unavailable."""

    event: EventSpec
    pmu: str
    fds: list[int]
    unavailable: str | None = None

    @property
    def label(self) -> str:
        return f"{self.pmu}/{self.event.name}/" if self.pmu else self.event.name

    def read(self) -> Reading | None:
        if self.unavailable is not None:
            return None
        total = [0, 0, 0]
        for fd in self.fds:
            value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
            total = [total[0] + value, total[1] + enabled, total[2] + running]
        return Reading(*total)


class CounterSet:
    """Counters of this process's threads: the software events and, per CPU PMU, the hardware events.

    Use as a context manager (the descriptors are closed at the end); :meth:`read` takes a
    snapshot, and the difference of two snapshots is what ran between them.

    Raises:
        EdgetrainError: ``perf_event_open`` has no known system call number on this architecture.
    """

    def __init__(self, events: Sequence[EventSpec] = (*SOFTWARE_EVENTS, *HARDWARE_EVENTS),
                 pmus: dict[str, int] | None = None) -> None:
        number = syscall_number()
        if number is None:
            raise EdgetrainError(f"unavailable: no known perf_event_open system call number for {platform.machine()}")
        self._number = number
        self._libc = ctypes.CDLL(None, use_errno=True)
        pmus = cpu_pmus() if pmus is None else pmus
        per_pmu = list(pmus.items()) if len(pmus) > 1 else [("", None)]
        self.counters: list[Counter] = []
        for event in events:
            for pmu, pmu_type in (per_pmu if event.hardware else [("", None)]):
                self.counters.append(self._open(event, pmu, pmu_type))
        for counter in self.counters:
            for fd in counter.fds:
                self._ioctl(fd, PERF_EVENT_IOC_ENABLE)

    def _ioctl(self, fd: int, request: int) -> None:
        import fcntl

        fcntl.ioctl(fd, request, 0)

    def _open(self, event: EventSpec, pmu: str, pmu_type: int | None) -> Counter:
        attr = _PerfEventAttr()
        attr.type = event.type
        attr.size = ctypes.sizeof(_PerfEventAttr)
        attr.config = event.config | ((pmu_type << EXTENDED_TYPE_SHIFT) if pmu_type is not None else 0)
        attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
        attr.flags = FLAG_DISABLED | FLAG_INHERIT | FLAG_EXCLUDE_HV
        if event.hardware and os.geteuid() != 0:
            attr.flags |= FLAG_EXCLUDE_KERNEL  # what an unprivileged user may count at perf_event_paranoid 2
        fds: list[int] = []
        for tid in self._threads():
            fd = self._libc.syscall(self._number, ctypes.byref(attr), tid, -1, -1, 0)
            if fd < 0:
                code = ctypes.get_errno()
                if code == errno.ESRCH:  # the thread ended meanwhile
                    continue
                for opened in fds:
                    os.close(opened)
                return Counter(event, pmu, [], f"unavailable: {_reason(code, event.name)}")
            fds.append(fd)
        return Counter(event, pmu, fds)

    @staticmethod
    def _threads() -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir("/proc/self/task"))
        except OSError:
            return [0]

    def read(self) -> dict[str, Reading | None]:
        """Every counter's current reading by label (``None`` for an unavailable one)."""
        return {counter.label: counter.read() for counter in self.counters}

    def unavailable(self) -> dict[str, str]:
        """Label -> why, for every counter that could not be opened."""
        return {c.label: c.unavailable for c in self.counters if c.unavailable is not None}

    def close(self) -> None:
        for counter in self.counters:
            for fd in counter.fds:
                with contextlib.suppress(OSError):
                    self._ioctl(fd, PERF_EVENT_IOC_DISABLE)
                os.close(fd)
            counter.fds = []

    def __enter__(self) -> CounterSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

