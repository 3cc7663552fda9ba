"""The run directory of an unattended node: one run, one writer, an identity checked on resume.

NOTE [ Run directory protocol ]
A camera node restarts its training job after every reboot with the same command line plus
``--resume``, and nobody reads its logs. So the run directory, not the command line, is the
authority on what the run is:

* ``run.json`` records the run's *identity* (every setting that changes its numbers: model,
  data, samples, batch, image, optimizer, learning rate, seed), its *request* (memory budget,
  recompute factor, device, strategy: what the plan must meet) and, once planned, the plan's
  predicted figures. It is written atomically before the first step.
* ``--resume`` compares the command line with ``run.json`` before any work. A differing
  identity is refused, naming each field (old -> new). A differing request is accepted only if
  the saved plan meets it; otherwise refused, or replanned when the user asks (``replan``),
  which the metrics record. ``epochs`` may grow: the run continues to the new end.
* A resume of a finished run (``summary.json`` covers the requested epochs) changes nothing.
* A fresh run into a directory that holds a run is refused unless ``overwrite``, which removes
  the run's files (a generated-data cache under ``data/`` stays).
* ``.lock`` is held with ``flock`` for the whole run; a second process is refused with the
  holder's pid. The kernel drops the lock when the holder dies, so a crash never leaves the
  directory locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import EdgetrainError
from ..sysutil.fileio import write_json

__all__ = ["RunDirectory", "RunIdentity", "RunLockedError", "RunMismatchError", "RUN_FILES"]

RUN_FORMAT_VERSION = 1
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
PLAN_FILE = "plan.json"
STATE_DIR = "state"
LOCK_FILE = ".lock"
RUN_FILES = (RUN_FILE, SUMMARY_FILE, METRICS_FILE, PLAN_FILE, STATE_DIR, "tensorboard")


class RunLockedError(EdgetrainError):
    """Another process is writing the run directory."""


class RunMismatchError(EdgetrainError):
    """``--resume`` with settings that differ from the run's; lists each differing field."""


@dataclass(frozen=True)
class RunIdentity:
    """What a run is: ``identity`` fields change its numbers; ``request`` fields what its plan must meet."""

    identity: dict[str, Any]
    request: dict[str, Any]

    def identity_changes(self, saved: RunIdentity) -> list[str]:
        """``field: old -> new`` for each identity field that differs from ``saved``."""
        return _changes(saved.identity, self.identity)

    def request_changes(self, saved: RunIdentity) -> list[str]:
        return _changes(saved.request, self.request)


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = [*old, *(k for k in new if k not in old)]
    return [f"{key}: {_show(old.get(key))} -> {_show(new.get(key))}" for key in keys if old.get(key) != new.get(key)]


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)


class RunDirectory:
    """A run directory held exclusively for the lifetime of the ``with`` block.

    Example:
        >>> with RunDirectory("runs/a") as run:   # raises RunLockedError if another process has it
        ...     saved = run.saved_identity()
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def __enter__(self) -> RunDirectory:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunLockedError(f"run directory {self.path} is in use by another edgetrain process "
                                     f"(pid {holder}); wait for it or use another --run-dir") from None
            raise
        self._lock_fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def lock_fd(self) -> int:
        """The locked descriptor, for processes that write under this lock to inherit (``Popen(pass_fds=...)``):
        an ``flock`` belongs to the open file, so the lock then lasts until the last of them exits."""
        assert self._lock_fd is not None, "lock_fd inside the with block"
        return self._lock_fd

    def claim(self) -> None:
        """Write our pid into the lock file, for the message a second process gets."""
        assert self._lock_fd is not None, "claim() inside the with block"
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)

    def file(self, name: str) -> Path:
        return self.path / name

    def holds_a_run(self) -> bool:
        """Whether any file of a run is here (a data cache alone is not a run)."""
        return any((self.path / name).exists() for name in RUN_FILES)

    def remove_run(self) -> None:
        """Delete the run's files (``--overwrite``); a generated-data cache stays."""
        for name in RUN_FILES:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()

    def saved_identity(self) -> RunIdentity | None:
        """The identity in ``run.json``; None when the directory has none.

        Raises:
            RunMismatchError: ``run.json`` is unreadable or from another format version.
        """
        path = self.path / RUN_FILE
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RunMismatchError(f"{path} is unreadable ({exc}); the run cannot be checked: "
                                   "use --overwrite to start it again") from None
        if not isinstance(record, dict) or record.get("version") != RUN_FORMAT_VERSION:
            raise RunMismatchError(f"{path} is not a run record of format {RUN_FORMAT_VERSION}; "
                                   "use --overwrite to start the run again")
        return RunIdentity(identity=record["identity"], request=record["request"])

    def saved_plan(self) -> dict[str, Any] | None:
        """The plan figures ``run.json`` recorded (None before planning)."""
        path = self.path / RUN_FILE
        if not path.exists():
            return None
        plan = json.loads(path.read_text()).get("plan")
        return plan if isinstance(plan, dict) else None

    def record(self, identity: RunIdentity, plan: dict[str, Any] | None = None) -> None:
        """Write ``run.json`` atomically (the plan's figures once planned)."""
        write_json(self.path / RUN_FILE, {"version": RUN_FORMAT_VERSION, "identity": identity.identity,
                                          "request": identity.request, "plan": plan})

    def finished_summary(self, epochs: int) -> dict[str, Any] | None:
        """The saved summary if it covers ``epochs`` epochs (the run is done), else None."""
        path = self.path / SUMMARY_FILE
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(summary, dict) and isinstance(summary.get("epochs"), int) and summary["epochs"] >= epochs:
            return summary
        return None
