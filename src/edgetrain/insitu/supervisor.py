"""The service's side of the student process: start it, share the store's lock with it, stop and continue it, and
read its CPU time and the cause of its failure.

The student itself is :mod:`.student` (NOTE [ The student process ]); this module is what the inference process
does with it (NOTE [ An unattended node's service ], NOTE [ Yielding per frame ]).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import EdgetrainError
from ..sysutil.processes import pid_running
from ..train.rundir import LOCK_FILE, RunDirectory, RunLockedError
from .service_config import ServiceConfig
from .student import STATUS, StudentConfig, write_config

__all__ = ["StoreLock", "start_student", "student_failed", "stopped", "process_cpu_s", "STUDENT_LOG",
           "STUDENT_EXIT_WAIT_S"]

STUDENT_LOG = "student.log"  # the student's stderr: warnings, a crash's traceback
# A service started while a killed one's student still holds the store's lock waits this long for it to exit
# (NOTE [ An unattended node's service ]): the kernel kills it with its parent, at once, and where it cannot, the
# student stops at its next step.
STUDENT_EXIT_WAIT_S = 10.0


class StoreLock(RunDirectory):
    """The store's lock: ``train``'s run-directory lock (NOTE [ Run directory protocol ]), refused in terms of
    ``--store``, whose file descriptor the student inherits (NOTE [ An unattended node's service ]).

    The cluster commands share their lock the same way; this one does not import the cluster's package into
    the node's inference process, whose memory is budgeted.
    """

    def __enter__(self) -> StoreLock:
        deadline = time.monotonic() + STUDENT_EXIT_WAIT_S
        while True:
            try:
                super().__enter__()
                return self
            except RunLockedError:
                holder = self._holder()
                if holder is not None and not pid_running(holder) and time.monotonic() < deadline:
                    time.sleep(0.1)  # its service is gone: the student that shares the lock is exiting
                    continue
                raise RunLockedError(f"--store {self.path} is in use by another edgetrain process (pid "
                                     f"{'unknown' if holder is None else holder}, or its student): wait for it "
                                     "to end or use another --store") from None

    def _holder(self) -> int | None:
        """The pid the holder wrote into the lock file (:meth:`claim`); None where there is none."""
        try:
            text = (self.path / LOCK_FILE).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None


def start_student(root: Path, config: ServiceConfig, student_bytes: int, *, lock: StoreLock | None = None,
                  quiet: bool = False) -> subprocess.Popen[bytes]:
    """The student process (NOTE [ The student process ]); ``quiet``: its status lines go to status.jsonl only.

    Started from the calling thread, which must live as long as it does (NOTE [ Children die with their
    parent ]): the service's main thread. It inherits ``lock``, the store's, so the store stays locked while it
    lives; its stderr goes to ``student.log``, where a failure's cause is read (:func:`student_failed`).
    """
    student = StudentConfig(store_dir=str(root), process_bytes=student_bytes, quota_bytes=config.quota_bytes,
                            steps=config.student_steps, round_steps=config.round_steps, margin=config.margin,
                            seed=config.seed, parent_pid=os.getpid())
    path = write_config(student, root / "student.json")
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}  # as cli.main sets it (NOTE [ Returning freed memory ])
    with open(root / STUDENT_LOG, "wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "edgetrain.insitu.background", str(path)], env=env,
                                stdout=subprocess.DEVNULL if quiet else None, stderr=stderr,
                                pass_fds=() if lock is None else (lock.lock_fd,))

def student_failed(student: subprocess.Popen[bytes], root: Path) -> EdgetrainError:
    """The service's error for a student that exited with a non-zero status, with the cause it left: its
    ``student_error`` status line, else the signal that killed it, else its stderr's last line."""
    status = student.returncode
    cause = _student_error(root / STATUS, student.pid)
    if cause is None and status is not None and status < 0:
        name = signal.Signals(-status).name
        cause = f"killed by {name}" + (" (out of memory, or kill -9)" if -status == signal.SIGKILL else "")
    if cause is None:
        cause = _last_line(root / STUDENT_LOG) or f"it left no cause in {root / STATUS} or {root / STUDENT_LOG}"
    return EdgetrainError(f"the student process exited with status {status}: {cause}")


def _student_error(status: Path, pid: int) -> str | None:
    """The error of the last ``student_error`` line process ``pid`` wrote to ``status``; None without one."""
    errors = [record["error"] for record in map(json.loads, status.read_text().splitlines())
              if record.get("event") == "student_error" and record.get("pid") == pid] if status.exists() else []
    return errors[-1] if errors else None


def _last_line(path: Path) -> str | None:
    """The last non-blank line of a text file (a traceback's last is its exception); None where there is none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


@contextlib.contextmanager
def stopped(student: subprocess.Popen[bytes] | None) -> Iterator[None]:
    """The student stopped (SIGSTOP) for the block, continued (SIGCONT) after it.

    A student already reaped (it finished its steps) is left alone: its pid may be another process's now.
    """
    if student is None or student.returncode is not None:
        yield
        return
    os.kill(student.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(student.pid, signal.SIGCONT)


def process_cpu_s(process: subprocess.Popen[bytes] | None) -> float:
    """CPU seconds ``process`` has used (user + system, from /proc); 0 without one or once it is gone.

    The chunk status reports the student's share of a chunk's time: SCHED_IDLE gets no CPU on a
    machine kept busy by others, and a latency ratio measured beside a starved student means little.
    """
    if process is None:
        return 0.0
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15

