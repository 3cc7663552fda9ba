"""Linux cgroup v1 directories that edgetrain makes for a while (emulated nodes, CPU-quota modes)."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["remove_cgroup"]


def remove_cgroup(path: Path) -> None:
    """Move any process left in the cgroup ``path`` to its parent, then remove it; one already gone is skipped.

    The kernel refuses to remove a cgroup that still holds a process, so a child that outlived
    its run would otherwise leave the directory behind.
    """
    with contextlib.suppress(FileNotFoundError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (path.parent / "cgroup.procs").write_text(pid)
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()
