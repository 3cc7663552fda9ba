"""A fresh memory cgroup around child processes: a limit the kernel enforces, and the kernel's own count of their use.

A child joins the group before it runs anything (``subprocess.Popen(..., preexec_fn=group.enter)``), so everything it
and its own children touch is charged to the group: resident memory, page cache it fills, kernel memory. The group is
removed when the ``with`` block ends, also on an exception; a process still in it then is killed first, since the
kernel refuses to remove a group that holds one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .cgroups import remove_cgroup

__all__ = ["MemoryCgroup", "memory_cgroup", "memory_cgroup_unavailable", "V1_ROOT", "V2_ROOT"]

V1_ROOT, V2_ROOT = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryCgroup:
    """One memory cgroup directory and its hierarchy's version (1 or 2)."""

    path: Path
    version: int

    def enter(self) -> None:
        """Move the calling process into the group: a subprocess's ``preexec_fn``."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        """The processes in the group now."""
        with contextlib.suppress(FileNotFoundError):
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        return []

    def peak_bytes(self) -> int | None:
        """The kernel's high-water mark of the group's charge (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``,
        Linux >= 5.19); None where the kernel has no such file.

        A peak equal to the group's limit means the charge reached it and the kernel reclaimed (page cache first)
        to keep the group inside; the failure counters (v1 ``memory.failcnt``) do not say so on every kernel.
        """
        return _read_int(self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))

    def oom_kills(self) -> int | None:
        """How many processes of the group the kernel's OOM killer ended (the ``oom_kill`` count; None on kernels
        that do not keep it)."""
        return _read_field(self.path / ("memory.oom_control" if self.version == 1 else "memory.events"), "oom_kill")


def memory_cgroup_unavailable() -> str | None:
    """Why no memory cgroup can be made here (not root, no memory controller mounted); None when one can."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    if V1_ROOT.is_dir():
        return None
    with contextlib.suppress(OSError):
        if "memory" in (V2_ROOT / "cgroup.controllers").read_text().split():
            return None
    return "no memory cgroup controller is mounted (neither /sys/fs/cgroup/memory nor cgroup v2's memory)"


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int | None, prefix: str = "edgetrain") -> Iterator[MemoryCgroup]:
    """A new memory cgroup limited to ``limit_bytes`` (None: no limit, a meter only), swap included, removed after.

    Raises:
        OSError: the group cannot be made (see :func:`memory_cgroup_unavailable`) or the limit not set.
    """
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    if V1_ROOT.is_dir():
        group = MemoryCgroup(V1_ROOT / name, 1)
    elif "memory" in (V2_ROOT / "cgroup.controllers").read_text().split():
        group = MemoryCgroup(V2_ROOT / name, 2)
    else:
        raise OSError("no memory cgroup controller mounted")
    group.path.mkdir()
    try:
        if limit_bytes is not None:
            if group.version == 1:
                (group.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):   # absent without swap accounting: nothing to swap around
                    (group.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            else:
                (group.path / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (group.path / "memory.swap.max").write_text("0")
        yield group
    finally:
        _remove(group)


def _remove(group: MemoryCgroup) -> None:
    """Kill what is left in the group, wait for the kernel to let it go, and remove it."""
    for pid in group.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(200):   # a killed process leaves the group once the kernel has reaped its memory
        try:
            group.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    remove_cgroup(group.path)   # moves what is still there to the parent, then removes it


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_field(path: Path, key: str) -> int | None:
    """The value of ``key`` in a flat keyed file (``key value`` lines)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
