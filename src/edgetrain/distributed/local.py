"""A cluster on one machine: N node processes under a supervisor that survives a node's failure.

NOTE [ Supervision ]
torchrun's elastic agent restarts the whole group on a failure and its survivors have hung on
scale-down (pytorch#111646, #67742); the issue measured 45-64 s to resume after a kill or a cut
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..train.config import TrainConfig
from ..train.rundir import METRICS_FILE
from .group import ClusterError
from .node import ClusterOptions, NodeSpec, node_speed
from .worker import EXIT_REFUSED, write_spec

if TYPE_CHECKING:
    from .netns import NetworkEmulation

__all__ = ["Fault", "FailureRecord", "LocalOptions", "LocalReport", "run_local", "free_port"]

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"
LOG_DIR = "node-logs"
FAULT_KINDS = ("kill", "stop", "cut")


@dataclass(frozen=True)
class Fault:
    """A failure to inject on ``node`` once rank 0 logged ``at_step``: "kill" (SIGKILL), "stop" (SIGSTOP: a hung
    node) or "cut" (its link taken down; needs the network emulation)."""

    node: int
    at_step: int
    kind: str = "kill"

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
    emulation: str = "plain local processes: no network shaping, no CPU or memory limits per node"

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "restarts": self.restarts, "failures": [f.to_dict() for f in self.failures],
                "rejoins": self.rejoins, "wall_time_s": self.wall_time_s, "emulation": self.emulation}


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (bound to port 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare(config: TrainConfig, nodes: Sequence[NodeSpec]) -> tuple[TrainConfig, tuple[NodeSpec, ...]]:
    """Check the run, generate its data once and fix each node's speed, before any node starts.

    Nodes would otherwise each write the same synthetic dataset and each calibrate this machine.
    """
    from ..data import open_dataset
    from ..models import get_model_spec

    for node in nodes:
        replace(config, device=node.device, memory=node.memory).check()
    root = config.data_root or config.run_dir / "data"
    open_dataset(config.data, image_size=config.image, samples=config.samples, seed=config.seed, root=root,
                 skip_corrupt=config.skip_corrupt, vocab_size=get_model_spec(config.model).vocab_size)
    rated = tuple(replace(node, rate_flops_per_s=node_speed(node)) for node in nodes)
    return replace(config, data_root=root), rated


def run_local(config: TrainConfig, nodes: Sequence[NodeSpec], options: LocalOptions = LocalOptions()) -> LocalReport:
    """Train ``config`` on ``len(nodes)`` local processes under supervision (NOTE [ Supervision ]).

    Raises:
        ClusterError: a refusal every node shares (with its message), more failures than
            ``max_restarts``, no node left, or a "cut" fault without the network emulation.
    """
    started = time.time()
    config, rated = prepare(config, nodes)
    report = LocalReport(nodes=len(rated))
    with contextlib.ExitStack() as stack:
        network = None
        if options.preset is not None:
            network, report.emulation = _network(stack, config, rated, options)
        if network is None and any(f.kind == "cut" for f in options.faults):
            raise ClusterError("a 'cut' fault needs the network emulation (--netns, as root)")
        _supervise(config, rated, options, report, network)
    report.wall_time_s = time.time() - started
    _write_report(config.run_dir, report)
    return report


def _network(stack: contextlib.ExitStack, config: TrainConfig, nodes: Sequence[NodeSpec],
             options: LocalOptions) -> tuple[NetworkEmulation | None, str]:
    """The emulated network, entered on ``stack``, and what it emulates; None and why not without root."""
    from .netns import NOT_EMULATED, NetworkEmulation, can_emulate

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
               network: NetworkEmulation | None) -> None:
    alive = list(range(len(rated)))
    down: list[int] = []
    pending = list(options.faults)
    with tempfile.TemporaryDirectory(prefix="edgetrain-cluster-") as scratch:
        attempt = 0
        while True:
            group = _Group(config if attempt == 0 else replace(config, resume=True, overwrite=False),
                           [(n, rated[n]) for n in alive], options, Path(scratch), attempt, network)
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


def _write_report(run_dir: Path, report: LocalReport) -> None:
    from ..fileio import write_json

    write_json(run_dir / CLUSTER_FILE, report.to_dict())


@dataclass(frozen=True)
class _Outcome:
    kind: str  # done, failed, refused, rejoin
    node: int | None = None
    message: str = ""
    step: int = 0


class _Group:
    """One attempt: the nodes started on one port, watched until they finish or one fails."""

    def __init__(self, config: TrainConfig, members: list[tuple[int, NodeSpec]], options: LocalOptions,
                 scratch: Path, attempt: int, network: NetworkEmulation | None) -> None:
        self.options, self.members, self.config, self.network = options, members, config, network
        self.metrics = config.run_dir / METRICS_FILE
        port = free_port()  # in a fresh namespace every port is free; else one free here now
        master = "127.0.0.1" if network is None else network.address(members[0][0])
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Path] = {}
        self.heartbeats: dict[int, Path] = {}
        self.started = time.time()
        self.seen_step, self.seen_time = _last_step(self.metrics) if attempt else (0, None)
        for rank, (node_id, spec) in enumerate(members):
            beat = scratch / f"heartbeat-{attempt}-{node_id}"
            cluster_options = ClusterOptions(connect_timeout_s=options.connect_timeout_s, timeout_s=options.timeout_s,
                                             heartbeat=beat, average_every=options.average_every)
            spec_file = write_spec(scratch / f"node-{attempt}-{node_id}.json", config, spec, cluster_options)
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(len(members)), "MASTER_ADDR": master,
                   "MASTER_PORT": str(port), **({} if network is None else network.env(node_id))}
            command = [sys.executable, "-m", "edgetrain.distributed.worker", str(spec_file)]
            if network is not None:
                command = network.wrap(node_id, command)
            self.logs[node_id] = config.run_dir / LOG_DIR / f"attempt-{attempt}-node-{node_id}.log"
            self.logs[node_id].parent.mkdir(parents=True, exist_ok=True)
            self.heartbeats[node_id] = beat
            with self.logs[node_id].open("wb") as log_file:
                self.procs[node_id] = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                                       start_new_session=True)

    def watch(self, pending: list[Fault], report: LocalReport, down: list[int]) -> _Outcome:
        """Poll the nodes until all finish, one fails, or a lost node may rejoin."""
        injected: dict[int, float] = {}
        while True:
            time.sleep(0.05)
            now = time.time()
            step, step_time = _last_step(self.metrics)
            last = report.failures[-1] if report.failures else None
            if last is not None and last.first_step_time is None and step_time is not None \
                    and step_time > last.detected_at:
                first_step, last.first_step_time = _first_step_after(self.metrics, last.detected_at)
                last.resumed_step = first_step - 1
            if step_time != self.seen_time:
                self.seen_step, self.seen_time = step, step_time
            for fault in [f for f in pending if f.at_step <= step and f.node in self.procs]:
                pending.remove(fault)
                injected[fault.node] = time.time()
                self._inject(fault)
            codes = {n: p.poll() for n, p in self.procs.items()}
            if all(code == 0 for code in codes.values()):
                return _Outcome("done")
            refused = [n for n, code in codes.items() if code == EXIT_REFUSED]
            if refused:
                return _Outcome("refused", message=self._error_line(refused[0]))
            lost = next((n for n, code in codes.items() if code is not None and code < 0), None)
            kind = "killed"
            if lost is None:
                lost, kind = self._silent(codes, now), "hung or cut off"
            if lost is not None:
                report.failures.append(FailureRecord(node=lost, kind=kind, injected_at=injected.get(lost),
                                                     detected_at=now, last_step=self.seen_step,
                                                     last_step_time=self.seen_time,
                                                     world_size_after=len(self.procs) - 1))
                return _Outcome("failed", node=lost, message=f"node {lost} {kind}")
            broken = [n for n, code in codes.items() if code not in (None, 0)]
            if broken:  # no node died or hung: the network broke (a cut link) or a bug; all restart
                return _Outcome("failed", message=self._error_line(broken[0]))
            rejoin = self.options.rejoin_after_steps
            if down and rejoin is not None and report.failures and step - report.failures[-1].last_step >= rejoin:
                return _Outcome("rejoin", step=step, message=f"nodes {down} rejoin")

    def _inject(self, fault: Fault) -> None:
        if fault.kind == "cut":
            assert self.network is not None
            self.network.cut(fault.node)
        else:
            os.kill(self.procs[fault.node].pid, signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)

    def _silent(self, codes: dict[int, int | None], now: float) -> int | None:
        """The node that stopped beating; the master when every other node did (it is the one cut off)."""
        stale = [n for n in self.procs if codes[n] is None and self._stale(n, now)]
        master = self.members[0][0]
        if len(stale) > 1 and len(stale) == len(self.procs) - 1 and master not in stale:
            return master
        return stale[0] if stale else None

    def _stale(self, node: int, now: float) -> bool:
        try:
            return now - self.heartbeats[node].stat().st_mtime > self.options.heartbeat_timeout_s
        except FileNotFoundError:  # not started yet: importing torch takes seconds
            return now - self.started > self.options.connect_timeout_s

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
