"""Whether a process that left files behind is still running (scratch directories name their owner's PID)."""

from __future__ import annotations

import os

__all__ = ["pid_running"]


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists; a PID reused since counts as running, so its files are kept."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # it exists, owned by someone else
        return True
    return True
