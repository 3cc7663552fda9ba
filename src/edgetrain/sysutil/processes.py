"""Processes that edgetrain starts die with their parent; files left by dead processes are found by PID.

NOTE [ Children die with their parent ]
An unattended node's supervisor can be killed by anything (kill -9, the OOM killer, a power
button). Every process edgetrain starts (cluster nodes and spares, the federated server and
clients, the in-situ student) asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), so none trains on unsupervised, holds a lock or writes a run directory
after its parent is gone. SIGKILL, not SIGTERM: a child that is stopped (SIGSTOP) or blocked in
a collective never runs a handler. Two properties of the kernel's contract shape the use:

* the signal follows the *thread* that forked the child, not the process: start children from
  a thread that lives as long as they do (the main thread), never from a short-lived worker;
* it is set in the child after ``fork``, so a parent that died in between is caught by checking
  that the parent is still the one that forked (else the child exits at once).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import signal
from collections.abc import Callable

__all__ = ["pid_running", "die_with_parent", "dies_with_this_process", "worker_dies_with_parent"]

_PR_SET_PDEATHSIG = 1
_ORPHANED_EXIT = 3


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


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, found once: ``find_library`` runs ``ldconfig``, which a forked child must not."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when its parent dies (Linux); False where it cannot.

    Exits at once (status 3) if the parent is no longer ``parent_pid``: it died before the request took effect.
    """
    prctl = _prctl()
    ok = prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    if os.getppid() != parent_pid:
        os._exit(_ORPHANED_EXIT)
    return ok


def dies_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child is SIGKILLed when this process (the calling thread,
    NOTE [ Children die with their parent ]) dies. libc is looked up here, in the parent."""
    parent = os.getpid()
    _prctl()

    def tie() -> None:
        die_with_parent(parent)

    return tie


def worker_dies_with_parent(_worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: the worker is SIGKILLed when the process that iterates the loader dies
    (PyTorch's own watchdog looks every 5 s)."""
    die_with_parent(os.getppid())
