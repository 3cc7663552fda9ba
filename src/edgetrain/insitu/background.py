"""The student process's entry point: lower its priority and tie it to its parent *before* importing PyTorch.

``python -m edgetrain.insitu.background CONFIG.json`` (started by the service). Importing
PyTorch and profiling take seconds of CPU; done at normal priority they would land on the
inference path's frames, so this module imports only the standard library until the process
is ``SCHED_IDLE`` (NOTE [ The student process ]).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["lower_priority", "die_with_parent"]

_PR_SET_PDEATHSIG = 1


def lower_priority() -> str:
    """Make this process ``SCHED_IDLE`` where allowed, else ``nice 19``; returns which."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        os.nice(19 - os.nice(0))
        return "nice 19"


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when its parent dies (Linux); False where it cannot.

    The service pauses the student (SIGSTOP) during its latency probes; a stopped process would
    never notice a kill -9 of its parent by polling, SIGKILL reaches it anyway.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        ok = ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(3)
    return bool(ok)


def main(argv: list[str]) -> int:
    priority = lower_priority()
    die_with_parent(os.getppid())
    from .student import main as student_main  # PyTorch from here on, at the lowered priority

    return student_main(argv, priority=priority)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
