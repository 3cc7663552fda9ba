"""A cluster on one machine: N node processes under a supervisor that survives a node's failure.

NOTE [ Supervision ]
torchrun's elastic agent restarts the whole group on a failure and its survivors have hung on
scale-down (pytorch#111646, #67742), and it takes 45-64 s to resume after a kill or a cut
link. Here the supervisor watches every node directly, with no rendezvous round:

* a node that *dies* is seen by ``waitpid`` at once (its exit status says it was killed);
* a node that *hangs* (SIGSTOP, a stuck kernel) or is *cut off* stops refreshing its heartbeat
  file, which a thread of its own touches every ``heartbeat_s`` after a round trip to the
  master's store; it is declared lost after ``heartbeat_timeout_s``. When every node but the
  master goes silent at once, the master is the one cut off. The survivors are blocked in an
  all-reduce meanwhile, which the supervisor does not wait out (their collective timeout is
  only the backstop);
* nodes that exit because the cluster broke, with no node found dead or silent, are all
  started again;
* a node that exits with :data:`EXIT_REFUSED` reports a refusal every node shares (versions,
  settings, budget): nothing is restarted and its one-line message is raised.

On a failure every node still running is killed (SIGKILL: rank 0 saves its state atomically,
so a kill at any instant leaves the last complete state) and the group is re-formed at once
from the nodes left, on a fresh port: the batch is split again among them and the run resumes
from the last saved state (``--resume``), so steps after that state are repeated, none lost.
One failure costs one restart. A lost node comes back (``rejoin_after_steps``) at a re-form
made for it once the smaller group has trained that many steps.

The nodes and spares run in sessions of their own (a signal meant for one reaches its whole
process group), so a signal to the supervisor does not reach them: SIGTERM, like SIGINT, unwinds
the supervisor through its ``finally`` blocks, which kill and reap every node and spare and
remove the emulated network (``termination_unwinds`` in ``termination.py``). Its default action would end the
supervisor at once: the kernel would kill the nodes with it, as after a SIGKILL of the
supervisor (NOTE [ Children die with their parent ]), but the network would stay. The
SystemExit the handler raises can be swallowed: a signal that arrives while the interpreter runs
a callback it cannot propagate from (logging's at-fork hook, run in the parent after every
``Popen``'s fork) is printed as "Exception ignored", and the supervisor would go on watching, its
nodes training (about 1 run in 4 full test suites). So the handler also records the signal, and
the watch loop unwinds on it (``unwind_if_terminated``).

Own supervision rather than a fault-tolerant layer such as torchft: torchft replaces the
process group and runs a quorum service (its lighthouse) beside the job, and it is not
installed here; the supervisor needs nothing but torch.distributed, and the nodes' state
protocol (rank 0's atomic state, resumable at any world size) already makes a restart exact.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import EdgetrainError
from ..sysutil.fileio import LeftAsItWas
from ..sysutil.processes import dies_with_this_process, pid_running
from ..train.config import TrainConfig
from ..train.rundir import LOCK_FILE, METRICS_FILE, RunDirectory
from .batch_shares import split_batch
from .group import ClusterError
from .netns import NOT_EMULATED, NetworkEmulation, can_emulate
from .node import ClusterOptions, NodeSpec
from .precheck import check_before_work, generate_data
from .spares import WarmSpares
from .termination import starting, termination_unwinds, unwind_if_terminated
from .worker import EXIT_REFUSED, write_spec

__all__ = ["Fault", "FailureRecord", "LocalOptions", "LocalReport", "run_local", "free_port",
           "SCRATCH_PREFIX"]

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"
LOG_DIR = "node-logs"
FAULT_KINDS = ("kill", "stop", "cut")
SCRATCH_PREFIX = "edgetrain-cluster-"  # then the supervisor's pid, a dash and mkdtemp's random letters
_SCRATCH_DIR = re.compile(re.escape(SCRATCH_PREFIX) + r"(\d+)-\w+")


@dataclass(frozen=True)
class Fault:
    """A failure to inject on ``node`` once rank 0 logged ``at_step``: "kill" (SIGKILL), "stop" (SIGSTOP: a hung
    node) or "cut" (its link taken down; needs the network emulation). ``when_warm``: not before the warm
    spares are ready (NOTE [ Warm spares ]), as they are after a run's first seconds."""

    node: int
    at_step: int
    kind: str = "kill"
    when_warm: bool = True

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ClusterError(f"a fault is one of {', '.join(FAULT_KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class LocalOptions:
    """How the supervisor runs and watches the nodes (NOTE [ Supervision ]).

    ``preset``: run every node in its own network namespace and cgroup, links shaped to this
    :data:`~edgetrain.distributed.netns.PRESETS` entry (NOTE [ What the emulation is ]); without
    root the nodes run as plain processes and the report says what is not emulated.
    ``cpus_per_node``: each emulated node's CPU quota (default: the cores shared out evenly).
    """

    heartbeat_timeout_s: float = 5.0
    timeout_s: float = 30.0
    connect_timeout_s: float = 60.0
    max_restarts: int = 8
    rejoin_after_steps: int | None = None
    faults: tuple[Fault, ...] = ()
    preset: str | None = None
    cpus_per_node: float | None = None
    average_every: int = 1
    compress_rank: int = 0
    compress_after: int = 0
    local_batch_norm: bool = False
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    wire_dtype: str = "float32"
    spares: bool = True

    def __post_init__(self) -> None:
        self.node_options()  # the nodes' own checks of these settings, made once before any node starts

    def node_options(self, **own: Any) -> ClusterOptions:
        """What every node is given of these settings; ``own``: a node's own (its heartbeat file, its profiles)."""
        return ClusterOptions(connect_timeout_s=self.connect_timeout_s, timeout_s=self.timeout_s,
                              average_every=self.average_every, compress_rank=self.compress_rank,
                              compress_after=self.compress_after, local_batch_norm=self.local_batch_norm,
                              outer_lr=self.outer_lr, outer_momentum=self.outer_momentum, wire_dtype=self.wire_dtype,
                              **own)


@dataclass
class FailureRecord:
    """One failure and what it cost: when it was seen, and the first step trained after it."""

    node: int
    kind: str
    injected_at: float | None
    detected_at: float
    last_step: int
    last_step_time: float | None
    world_size_after: int
    resumed_step: int | None = None
    first_step_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        detection = None if self.injected_at is None else self.detected_at - self.injected_at
        stall = (None if self.first_step_time is None or self.last_step_time is None
                 else self.first_step_time - self.last_step_time)
        repeated = None if self.resumed_step is None else self.last_step - self.resumed_step
        return {"node": self.node, "kind": self.kind, "detection_s": detection, "stall_s": stall,
                "last_step_before": self.last_step, "resumed_from_step": self.resumed_step,
                "steps_repeated": repeated, "steps_lost": 0 if self.resumed_step is not None else None,
                "world_size_after": self.world_size_after}


@dataclass
class LocalReport:
    """What the supervisor did: restarts, failures, rejoins and the exit of the last attempt."""

    nodes: int
    restarts: int = 0
    failures: list[FailureRecord] = field(default_factory=list)
    rejoins: list[dict[str, Any]] = field(default_factory=list)
    wall_time_s: float = 0.0
    heartbeat_max_gap_s: float = 0.0
    emulation: str = "plain local processes: no network shaping, no CPU or memory limits per node"

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "restarts": self.restarts, "failures": [f.to_dict() for f in self.failures],
                "rejoins": self.rejoins, "wall_time_s": self.wall_time_s,
                "heartbeat_max_gap_s": self.heartbeat_max_gap_s, "emulation": self.emulation}


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (bound to port 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_local(config: TrainConfig, nodes: Sequence[NodeSpec],
              options: LocalOptions = LocalOptions()) -> dict[str, Any]:
    """Train ``config`` on ``len(nodes)`` local processes under supervision (NOTE [ Supervision ]); returns the
    supervisor's report (:class:`LocalReport`, as written to ``cluster.json``).

    What can be refused is refused before anything is written (:func:`.precheck.check_before_work`); then
    the run directory is locked for the whole run, by the supervisor and every node it starts
    (NOTE [ One lock for a run's processes ] in runlock.py), which all die with the supervisor
    (NOTE [ Children die with their parent ]). ``resume`` of a finished run starts no node, changes
    no file and returns the report saved when it finished.

    Raises:
        ClusterError: a refusal every node shares (with its message), more failures than
            ``max_restarts``, no node left.
        RunLockedError: another process writes ``config.run_dir``.
        RunMismatchError: ``resume`` with settings that differ from the run's.
        EdgetrainError: see :func:`.precheck.check_before_work`; a fresh run into a directory that holds
            one without ``overwrite``.
    """
    from ..train.loop import open_run

    started = time.time()
    rated = check_before_work(config, nodes, options)
    undo = LeftAsItWas(config.run_dir, own=(LOCK_FILE,))
    with RunDirectory(config.run_dir) as run, undo:
        opening = open_run(run, config)  # as rank 0 will: a run of other settings, or one there without --resume
        if opening.finished is not None:
            log.info("the run in %s is finished; nothing to do", run.path)
            undo.commit()
            return _saved_report(config.run_dir, len(rated))
        run.claim()
        config = generate_data(config)  # a data folder it cannot read: refused with nothing made kept
        undo.commit()
        report = LocalReport(nodes=len(rated))
        with contextlib.ExitStack() as stack:
            stack.enter_context(termination_unwinds())
            network = None
            if options.preset is not None:
                network, report.emulation = _network(stack, config, rated, options)
            _supervise(config, rated, options, report, network, run.lock_fd)
        report.wall_time_s = time.time() - started
        _write_report(config.run_dir, report)
    return report.to_dict()


def _saved_report(run_dir: Path, nodes: int) -> dict[str, Any]:
    """The report a finished run saved; a report of no work where a power cut came between its summary and its
    report."""
    try:
        saved = json.loads((run_dir / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        saved = None
    return saved if isinstance(saved, dict) else LocalReport(nodes=nodes).to_dict()


def _network(stack: contextlib.ExitStack, config: TrainConfig, nodes: Sequence[NodeSpec],
             options: LocalOptions) -> tuple[NetworkEmulation | None, str]:
    """The emulated network, entered on ``stack``, and what it emulates; None and why not without root."""
    reason = can_emulate()
    if reason is not None:
        log.warning("network emulation unavailable (%s)", reason)
        return None, f"{reason}; {NOT_EMULATED}"
    limits = [replace(config, device=n.device, memory=n.memory).budget_bytes() for n in nodes]
    assert options.preset is not None
    network = stack.enter_context(NetworkEmulation(len(nodes), options.preset, cpus_per_node=options.cpus_per_node,
                                                   memory_bytes=limits))
    return network, network.describe()


def _supervise(config: TrainConfig, rated: Sequence[NodeSpec], options: LocalOptions, report: LocalReport,
               network: NetworkEmulation | None, lock_fd: int) -> None:
    """Run groups of the nodes left until the run is done (NOTE [ Supervision ]); every node and spare gets the run
    directory's locked descriptor ``lock_fd`` (NOTE [ One lock for a run's processes ] in runlock.py)."""
    alive = list(range(len(rated)))
    down: list[int] = []
    pending = list(options.faults)
    _remove_stale_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch, \
            WarmSpares(config.run_dir / LOG_DIR, Path(scratch), network, options.spares, lock_fd) as spares:
        attempt = 0
        while True:
            group = NodeGroup(config if attempt == 0 else replace(config, resume=True, overwrite=False),
                           [(n, rated[n]) for n in alive], options, Path(scratch), attempt, network, spares, lock_fd)
            try:
                outcome = group.watch(pending, report, down)
            finally:
                group.stop()
            if outcome.kind == "done":
                return
            if outcome.kind == "refused":
                raise ClusterError(outcome.message)
            attempt += 1
            report.restarts += 1
            if report.restarts > options.max_restarts:
                raise ClusterError(f"more than {options.max_restarts} restarts; last: {outcome.message}")
            if outcome.kind == "rejoin":
                report.rejoins.append({"nodes": list(down), "at_step": outcome.step})
                if network is not None:
                    for node in down:
                        network.mend(node)
                alive, down = sorted(alive + down), []
            elif outcome.node is not None:
                alive.remove(outcome.node)
                down.append(outcome.node)
            if not alive:
                raise ClusterError("every node failed")
            log.warning("re-forming the cluster with nodes %s (%s)", alive, outcome.message)


def _remove_stale_scratch() -> None:
    """Remove the scratch folders (heartbeats, node specs, profiles), named by their supervisor's pid, of supervisors
    that are gone: one killed (SIGKILL, a power cut) cannot remove its own."""
    for entry in Path(tempfile.gettempdir()).iterdir():
        match = _SCRATCH_DIR.fullmatch(entry.name)
        if match is None or pid_running(int(match.group(1))) or not entry.is_dir():
            continue
        log.info("removing the scratch folder of a supervisor that is gone: %s", entry)
        shutil.rmtree(entry, ignore_errors=True)


def _write_report(run_dir: Path, report: LocalReport) -> None:
    from ..sysutil.fileio import write_json

    write_json(run_dir / CLUSTER_FILE, report.to_dict())


@dataclass(frozen=True)
class _Outcome:
    kind: str  # done, failed, refused, rejoin
    node: int | None = None
    message: str = ""
    step: int = 0


class NodeGroup:
    """One attempt: the nodes started on one port, watched until they finish or one fails."""

    def __init__(self, config: TrainConfig, members: list[tuple[int, NodeSpec]], options: LocalOptions,
                 scratch: Path, attempt: int, network: NetworkEmulation | None, spares: WarmSpares,
                 lock_fd: int) -> None:
        self.options, self.members, self.config, self.network = options, members, config, network
        self.spares = spares
        self.metrics = config.run_dir / METRICS_FILE
        port = free_port()  # in a fresh namespace every port is free; else one free here now
        master = "127.0.0.1" if network is None else network.address(members[0][0])
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Path] = {}
        self.heartbeats: dict[int, Path] = {}
        self.spec_files: dict[int, Path] = {}
        self.started = time.time()
        self.seen_step, self.seen_time = _last_step(self.metrics) if attempt else (0, None)
        try:  # a signal while starting them (SIGTERM unwinds: NOTE [ Supervision ]) kills those started
            for rank, (node_id, spec) in enumerate(members):
                beat = scratch / f"heartbeat-{attempt}-{node_id}"
                cluster_options = options.node_options(heartbeat=beat, profile_dir=scratch / f"profiles-{node_id}",
                                                       run_dir_locked=True)
                spec_file = write_spec(scratch / f"node-{attempt}-{node_id}.json", config, spec, cluster_options)
                self.spec_files[node_id] = spec_file
                place = {"RANK": str(rank), "WORLD_SIZE": str(len(members)), "MASTER_ADDR": master,
                         "MASTER_PORT": str(port)}
                self.heartbeats[node_id] = beat
                warm = spares.take(node_id, spec_file, place)
                if warm is not None:
                    self.procs[node_id], self.logs[node_id] = warm
                    continue
                env = {**os.environ, **place, **({} if network is None else network.env(node_id))}
                command = [sys.executable, "-m", "edgetrain.distributed.worker", str(spec_file)]
                if network is not None:
                    command = network.wrap(node_id, command)
                self.logs[node_id] = config.run_dir / LOG_DIR / f"attempt-{attempt}-node-{node_id}.log"
                self.logs[node_id].parent.mkdir(parents=True, exist_ok=True)
                with self.logs[node_id].open("wb") as log_file, starting():
                    self.procs[node_id] = subprocess.Popen(
                        command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=dies_with_this_process(), pass_fds=(lock_fd,))
        except BaseException:
            self.stop()
            raise

    def watch(self, pending: list[Fault], report: LocalReport, down: list[int]) -> _Outcome:
        """Poll the nodes until all finish, one fails, or a lost node may rejoin."""
        injected: dict[int, float] = {}
        own_from: int | None = None   # the step this group resumed from, once it has logged one of its own
        while True:
            time.sleep(0.05)
            unwind_if_terminated()
            now = time.time()
            step, step_time = _last_step(self.metrics)
            last = report.failures[-1] if report.failures else None
            if last is not None and last.first_step_time is None and step_time is not None \
                    and step_time > last.detected_at:
                first_step, last.first_step_time = _first_step_after(self.metrics, last.detected_at)
                last.resumed_step = first_step - 1
            if step_time != self.seen_time:
                self.seen_step, self.seen_time = step, step_time
            if own_from is None and step_time is not None and step_time > self.started:
                own_from = _first_step_after(self.metrics, self.started)[0] - 1
            if step_time is not None and step_time > self.started:  # trained: warm up for the next re-form
                for node in filter(self.spares.wants, self.procs):
                    self.spares.fill(node, {"spec": str(self.spec_files[node]), "shares": self._failure_shares(node)})
                for node in filter(self.spares.wants, down):  # back at the first world size: profiled then
                    self.spares.fill(node, {"spec": str(self.spec_files[self.members[0][0]]), "shares": []})
            for fault in [f for f in pending if f.at_step <= step and f.node in self.procs
                          and (self.spares.ready() or not f.when_warm)]:
                pending.remove(fault)
                at = time.time()
                if self._inject(fault):
                    injected[fault.node] = at
            codes = {n: p.poll() for n, p in self.procs.items()}
            if all(code == 0 for code in codes.values()):
                return _Outcome("done")
            refused = [n for n, code in codes.items() if code == EXIT_REFUSED]
            if refused:
                return _Outcome("refused", message=self._error_line(refused[0]))
            lost = next((n for n, code in codes.items() if code is not None and code < 0), None)
            kind = "killed"
            if lost is None:
                lost, kind = self._silent(codes, now, injected, report), "hung or cut off"
            if lost is not None:
                report.failures.append(FailureRecord(node=lost, kind=kind, injected_at=injected.get(lost),
                                                     detected_at=now, last_step=self.seen_step,
                                                     last_step_time=self.seen_time,
                                                     world_size_after=len(self.procs) - 1))
                return _Outcome("failed", node=lost, message=self._loss_line(lost, kind, codes[lost]))
            broken = [n for n, code in codes.items() if code not in (None, 0)]
            if broken:  # no node died or hung: the network broke (a cut link) or a bug; all restart
                return _Outcome("failed", message=self._error_line(broken[0]))
            rejoin = self.options.rejoin_after_steps
            # counted from this group's own first step: the steps the old group trained before a kill landed
            # (logged after the supervisor saw the failure) are not the smaller group's
            if down and rejoin is not None and own_from is not None and step - own_from >= rejoin:
                return _Outcome("rejoin", step=step, message=f"nodes {down} rejoin")

    def _failure_shares(self, node: int) -> list[int]:
        """The shares ``node`` gets if any one other member fails (with or without BatchNorm's two samples)."""
        shares = set()
        for gone, _ in self.members:
            rest = [(n, 1.0 if spec.rate_flops_per_s is None else spec.rate_flops_per_s)
                    for n, spec in self.members if n != gone]
            if gone == node or not rest:
                continue
            for least in (1, 2):
                with contextlib.suppress(EdgetrainError):
                    split = split_batch(self.config.batch, [speed for _, speed in rest], least=least)
                    shares.add(split[[n for n, _ in rest].index(node)])
        return sorted(shares)

    def _inject(self, fault: Fault) -> bool:
        """Apply ``fault``; False when its node has already exited (its run ended first), so nothing was injected."""
        proc = self.procs[fault.node]
        if proc.poll() is not None:
            return False
        if fault.kind == "cut":
            assert self.network is not None
            self.network.cut(fault.node)
            return True
        try:
            os.kill(proc.pid, signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
        except ProcessLookupError:  # it exited between the poll and the signal
            return False
        return True

    def _silent(self, codes: dict[int, int | None], now: float, injected: dict[int, float],
                report: LocalReport) -> int | None:
        """The node that stopped beating; the master when every other node did (it is the one cut off).

        Records in ``report`` the longest silence of a node no fault was injected on: the margin
        the heartbeat timeout had against a false alarm.
        """
        ages = {n: self._age(n, now) for n in self.procs if codes[n] is None}
        healthy = [age for n, age in ages.items() if age is not None and n not in injected]
        report.heartbeat_max_gap_s = max([report.heartbeat_max_gap_s, *healthy])
        stale = [n for n, age in ages.items() if (age is None and now - self.started > self.options.connect_timeout_s)
                 or (age is not None and age > self.options.heartbeat_timeout_s)]
        master = self.members[0][0]
        if len(stale) > 1 and len(stale) == len(self.procs) - 1 and master not in stale:
            return master
        return stale[0] if stale else None

    def _age(self, node: int, now: float) -> float | None:
        """Seconds since node ``node`` last beat; None before its first beat (importing torch takes seconds)."""
        try:
            return now - self.heartbeats[node].stat().st_mtime
        except FileNotFoundError:
            return None

    def _loss_line(self, node: int, kind: str, code: int | None) -> str:
        """``node N killed by SIGABRT; its log ...``: the signal tells an injected kill (SIGKILL) from a crash
        (SIGABRT from a C++ exception, SIGSEGV); a crash's log holds every thread's stack (the worker's
        faulthandler), which the message names with the crash's own lines; else the log's last line says where."""
        if code is None or code >= 0:
            return f"node {node} {kind}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        log_path = self.logs.get(node)
        lines = log_path.read_text(errors="replace").splitlines() if log_path is not None else []
        crash = _crash_lines(lines)
        if crash:
            return f"node {node} {kind} by {name}; every thread's stack is in {log_path}: {' | '.join(crash)}"
        return f"node {node} {kind} by {name}" + (f"; its log's last line: {lines[-1]}" if lines else "")

    def _error_line(self, node: int) -> str:
        lines = self.logs[node].read_text(errors="replace").splitlines()
        message = next((line for line in reversed(lines) if line.startswith("error: ")), None)
        return message[len("error: "):] if message else f"node {node} exited: {(lines or ['no output'])[-1]}"

    def stop(self) -> None:
        """Kill every node still running (a stopped one too) and reap it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()


def _crash_lines(lines: list[str]) -> list[str]:
    """A native crash's lines in a node's log: what C++ printed just before faulthandler's ``Fatal Python error``
    (``terminate called ...``, its ``what():``), that line, and the crashing thread's innermost Python frame;
    none without a crash."""
    fatal = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Fatal Python error: ")), None)
    if fatal is None:
        return []
    before = [line.strip() for line in lines[max(0, fatal - 3):fatal]
              if line.startswith(("terminate called", "  what():"))]
    current = next((i for i in range(fatal, len(lines)) if lines[i].startswith("Current thread ")), None)
    frame = [lines[current + 1].strip()] if current is not None and current + 1 < len(lines) else []
    return [*before, lines[fatal], *frame]


def _last_step(metrics: Path) -> tuple[int, float | None]:
    """The last step rank 0 logged and its wall time; (0, None) before any."""
    try:
        with metrics.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            lines = file.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return 0, None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if "wall_time" in record:
                return int(record["step"]), float(record["wall_time"])
    return 0, None


def _first_step_after(metrics: Path, after: float) -> tuple[int, float]:
    """The first step rank 0 logged after the wall time ``after``, and its wall time."""
    for line in metrics.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if float(record.get("wall_time", 0.0)) > after:
                return int(record["step"]), float(record["wall_time"])
    raise AssertionError("called once a step after the failure was logged")
