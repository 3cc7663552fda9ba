"""``cluster federated`` on one machine: a Flower server and one process per node, supervised.

Plain localhost processes (``python -m edgetrain.distributed.federated_process server|client``): no network
shaping, no cgroup (docs/guide/cluster.md, "Federated mode"). The first process to fail stops the others
and its one line is the error. The launcher holds the run directory's lock, which every process it starts
shares (NOTE [ One lock for a run's processes ] in runlock.py), and they all die with it (NOTE [ Children
die with their parent ]).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..sysutil.fileio import LeftAsItWas, read_jsonl
from ..sysutil.processes import dies_with_this_process
from ..train.rundir import LOCK_FILE, RunDirectory
from .federated import (
    LOGS,
    METRICS,
    SUMMARY,
    FederatedConfig,
    FederatedError,
    Progress,
    refuse_budgets_below_the_least_step,
)
from .federated_server import finished_summary, open_run

__all__ = ["run_local", "LocalRun"]


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def last_error(self) -> str:
        """The process's one-line error (``error: ...``), else its last line."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error: ")]
        return (errors or lines or [f"exit status {self.popen.returncode}"])[-1].removeprefix("error: ")


@dataclass
class LocalRun:
    """The processes :func:`run_local` started: the server first, then the nodes in order."""

    processes: list[_Process] = field(default_factory=list)


def _spawn(role: str, config_path: Path, log_dir: Path, lock_fd: int, *extra: str) -> _Process:
    name = role if not extra else f"node-{extra[0]}"
    log_path = log_dir / f"{name}.log"
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1", "FLWR_TELEMETRY_ENABLED": "0"}  # as cli.main sets the former
    with log_path.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "edgetrain.distributed.federated_process", role,
                                  str(config_path), *extra], stdout=out, stderr=subprocess.STDOUT, env=env,
                                 preexec_fn=dies_with_this_process(), pass_fds=(lock_fd,))
    return _Process(name, popen, log_path)


def run_local(config: FederatedConfig, progress: Progress | None = None, poll_s: float = 0.2) -> dict[str, Any]:
    """Run the server and ``config.nodes`` node processes on this machine (plain localhost processes) to the end.

    ``progress`` is called with every new round's record. Returns the server's summary; ``resume`` of a finished
    run starts no process, changes no file and returns the summary saved when it finished.

    Raises:
        FederatedError: a process failed (its one-line error, named), e.g. a node whose budget cannot hold.
        InfeasibleBudgetError: a node's budget cannot hold its least step (before anything is written).
        RunLockedError: another process writes ``config.run_dir``.
    """
    config.check()
    refuse_budgets_below_the_least_step(config)
    run = Path(config.run_dir)
    undo = LeftAsItWas(run, own=(LOCK_FILE,))
    with RunDirectory(run) as lock, undo:
        finished = finished_summary(config)
        if finished is not None:
            undo.commit()
            return finished
        open_run(config)  # refuse a bad run directory before any process starts
        undo.commit()
        lock.claim()
        config = replace(config, resume=True, overwrite=False)
        (run / LOGS).mkdir(exist_ok=True)
        config_path = run / "federated-config.json"
        config_path.write_text(config.to_json())
        local = LocalRun()
        try:
            local.processes.append(_spawn("server", config_path, run / LOGS, lock.lock_fd))
            local.processes += [_spawn("client", config_path, run / LOGS, lock.lock_fd, str(node))
                                for node in range(config.nodes)]
            _watch(local, run / METRICS, progress, poll_s)
        finally:
            _stop(local)
        return dict(json.loads((run / SUMMARY).read_text()))


def _stop(local: LocalRun) -> None:
    """SIGTERM to every process still running, SIGKILL to those still running 10 s later; all reaped."""
    for process in local.processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    for process in local.processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=10)
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()


def _watch(local: LocalRun, metrics: Path, progress: Progress | None, poll_s: float) -> None:
    """Until the server and every node exit: report new rounds; stop everything at the first failure."""
    seen = len(read_jsonl(metrics))
    while True:
        records = read_jsonl(metrics)
        for record in records[seen:]:
            if progress is not None:
                progress(record)
        seen = len(records)
        # nodes first: a node's failure also fails the server's round, and the node's line says why
        failed = [p for p in local.processes[1:] + local.processes[:1] if p.popen.poll() not in (None, 0)]
        if failed:
            message = failed[0].last_error()
            named = message.startswith(("node ", "round "))  # the library's errors name the node or round
            raise FederatedError(message if named else f"{failed[0].name}: {message}")
        if all(p.popen.poll() == 0 for p in local.processes):
            return
        time.sleep(poll_s)
