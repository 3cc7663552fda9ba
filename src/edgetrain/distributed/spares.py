"""Warm spares: a process per node that has imported torch and profiled ahead, waiting to take its node's place.

NOTE [ Warm spares ]
Most of a re-form's time goes into starting fresh processes: importing torch and the first
profile, whose first call imports torch's dispatch and compile machinery (2-4 s of import and
5-9 s of a first profile of the small token model on a loaded 2-core machine, against well
under a second for a second profile). So once a group has trained a step, the supervisor
starts one *spare* per node (``worker --spare``): it imports, profiles a tiny model, profiles
the real model at each share its node would get if any one other node failed (into the node's
profile folder, which a node reads instead of profiling at a share it has seen), and waits on
its stdin. A re-form hands each node's spare its spec (rank, world size, master) instead of
starting a process, and the node plans from the profile ready for it; spares are started again
for the next failure. A spare runs in its node's namespace and CPU cgroup and, as root, under
SCHED_IDLE until it takes a node's place (so its warm-up takes no CPU a node wants: without it,
spares warming up on a loaded machine delay a node's heartbeat past the timeout; unprivileged,
SCHED_IDLE cannot be undone, so spares then run at normal priority). It joins the node's
memory cgroup only when it takes the node's place; as the pages it holds by then stay charged
outside (this kernel, 6.18, has no ``move_charge_at_immigrate``), a node with a memory limit
gets no spare and restarts fresh, so the kernel's limit counts its whole process. Without the
emulation a spare is a plain process; ``spares=False`` starts fresh processes on every re-form.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..sysutil.processes import dies_with_this_process
from .netns import NetworkEmulation
from .termination import starting
from .worker import SPARE_FLAG

__all__ = ["WarmSpares"]


class WarmSpares:
    """One warm process per node, waiting to take its place at the next re-form (NOTE [ Warm spares ])."""

    def __init__(self, log_dir: Path, scratch: Path, network: NetworkEmulation | None, enabled: bool,
                 lock_fd: int | None = None) -> None:
        self.log_dir, self.scratch, self.network, self.enabled = log_dir, scratch, network, enabled
        self.lock_fds = () if lock_fd is None else (lock_fd,)
        self.waiting: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
        self.ready_files: dict[int, Path] = {}
        self.started = 0
        self.privileged = os.geteuid() == 0  # may put a spare back from SCHED_IDLE

    def wants(self, node: int) -> bool:
        """Whether ``node`` needs a spare: none waits, and it has no memory limit (NOTE [ Warm spares ])."""
        limited = self.network is not None and self.network.memory_bytes[node] is not None
        return self.enabled and node not in self.waiting and not limited

    def fill(self, node: int, prepare: dict[str, Any]) -> None:
        """Start a spare for ``node``; ``prepare``: its first order (shares to profile ahead)."""
        ready = self.scratch / f"spare-{self.started}-node-{node}.ready"
        command = [sys.executable, "-m", "edgetrain.distributed.worker", SPARE_FLAG, str(ready)]
        env = dict(os.environ)
        if self.network is not None:
            command, env = self.network.wrap(node, command, memory=False), {**env, **self.network.env(node)}
        log_path = self.log_dir / f"spare-{self.started}-node-{node}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        tie = dies_with_this_process()  # NOTE [ Children die with their parent ]

        def start() -> None:
            tie()
            if self.privileged:
                _idle()

        with log_path.open("wb") as log_file, starting():
            proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=start,
                                    pass_fds=self.lock_fds)
            self.waiting[node], self.started = (proc, log_path), self.started + 1  # before anything that can raise
        self.ready_files[node] = ready
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(prepare) + "\n").encode())
        proc.stdin.flush()

    def ready(self) -> bool:
        """Whether every spare has warmed up and profiled ahead (always, with spares off)."""
        return all(path.exists() for path in self.ready_files.values()) if self.enabled else True

    def take(self, node: int, spec_file: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path] | None:
        """Node ``node``'s spare, now running ``spec_file`` with ``env``; None when it has none alive."""
        self.ready_files.pop(node, None)
        proc, log_path = self.waiting.pop(node, (None, Path()))
        if proc is None or proc.poll() is not None:
            return None
        if self.network is not None:
            self.network.admit(node, proc.pid)
        if self.privileged:
            _schedule_normally(proc.pid)
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps({"spec": str(spec_file), "env": env}) + "\n").encode())
            proc.stdin.close()
        except BrokenPipeError:  # it died just now
            return None
        return proc, log_path

    def __enter__(self) -> WarmSpares:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc, _ in self.waiting.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        self.waiting.clear()
        self.ready_files.clear()


def _idle() -> None:
    """In a spare before it starts: SCHED_IDLE, so its warm-up takes only CPU time no node wants."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _schedule_normally(pid: int) -> None:
    """Every thread of ``pid`` back to SCHED_OTHER (needs root: unprivileged, SCHED_IDLE is one-way)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(int(task.name), os.SCHED_OTHER, os.sched_param(0))
