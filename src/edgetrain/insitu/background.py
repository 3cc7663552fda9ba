"""The student process's entry point: lower its priority and tie it to its parent *before* importing PyTorch.

``python -m edgetrain.insitu.background CONFIG.json`` (started by the service). Importing
PyTorch and profiling take seconds of CPU; done at normal priority they would land on the
inference path's frames, so this module imports only the standard library until the process
is ``SCHED_IDLE`` (NOTE [ The student process ]).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..sysutil.processes import die_with_parent

__all__ = ["lower_priority"]


def lower_priority() -> str:
    """Make this process ``SCHED_IDLE`` where allowed, else ``nice 19``; returns which."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        os.nice(19 - os.nice(0))
        return "nice 19"


def main(argv: list[str]) -> int:
    priority = lower_priority()
    # The service's pid from the config: had it died before this line, getppid() would name whoever adopted this
    # process, and the check that the parent is still the one that started it would pass.
    die_with_parent(json.loads(Path(argv[0]).read_text()).get("parent_pid") or os.getppid())
    from .student import main as student_main  # PyTorch from here on, at the lowered priority

    return student_main(argv, priority=priority)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
