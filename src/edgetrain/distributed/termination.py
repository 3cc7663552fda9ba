"""SIGTERM in the supervisor: an exception that unwinds through every ``finally`` that kills nodes or removes the
emulated network, also where Python swallowed it or a process was being started (NOTE [ Supervision ] in
``supervisor.py``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from .netns import exit_on_signal

__all__ = ["termination_unwinds", "starting", "unwind_if_terminated"]

_TERMINATED: list[int] = []   # signals received inside termination_unwinds, whether or not their SystemExit got out
_DEFERRING: list[bool] = []   # non-empty inside starting: a SIGTERM is recorded, and raised when the start is held


@contextlib.contextmanager
def termination_unwinds() -> Iterator[None]:
    """While inside (in the main thread), SIGTERM raises SystemExit, so the supervisor's ``finally`` blocks kill
    its nodes and spares, and is recorded for :func:`unwind_if_terminated` (NOTE [ Supervision ])."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, _record_and_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _record_and_exit(signum: int, frame: FrameType | None) -> None:
    _TERMINATED.append(signum)
    if not _DEFERRING:
        exit_on_signal(signum, frame)


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """Around starting a process and holding it where the ``finally`` blocks that kill find it: a SIGTERM inside
    is raised only on leaving. Raised inside ``Popen`` (after its fork) or before the process is held, it left
    a node or spare running with no one to end it (CI: a spare outlived its supervisor, 1 in about 4 suites)."""
    received = len(_TERMINATED)
    _DEFERRING.append(True)
    try:
        yield
    finally:
        _DEFERRING.pop()
    unwind_if_terminated(since=received)


def unwind_if_terminated(since: int = 0) -> None:
    """Raise the SystemExit of a SIGTERM whose own was swallowed or held (NOTE [ Supervision ]): one of those
    received after the first ``since``."""
    if len(_TERMINATED) > since:
        raise SystemExit(128 + _TERMINATED[-1])
