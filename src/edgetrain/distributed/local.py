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
remove the emulated network (``_termination_unwinds``). Its default action would end the
supervisor at once: the kernel would kill the nodes with it, as after a SIGKILL of the
supervisor (NOTE [ Children die with their parent ]), but the network would stay. The
SystemExit the handler raises can be swallowed: a signal that arrives while the interpreter runs
a callback it cannot propagate from (logging's at-fork hook, run in the parent after every
``Popen``'s fork) is printed as "Exception ignored", and the supervisor would go on watching, its
nodes training (about 1 run in 4 full test suites). So the handler also records the signal, and
the watch loop unwinds on it (``_unwind_if_terminated``).

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
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import EdgetrainError
from ..fileio import LeftAsItWas
from ..sysutil.processes import dies_with_this_process, pid_running
from ..train.config import TrainConfig
from ..train.rundir import LOCK_FILE, METRICS_FILE, RunDirectory
from .group import ClusterError
from .netns import NOT_EMULATED, PRESETS, NetworkEmulation, can_emulate, exit_on_signal
from .node import ClusterOptions, NodeSpec, batch_shares, check_speeds, node_speed
from .split import split_batch
from .worker import EXIT_REFUSED, SPARE_FLAG, write_spec

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

    What can be refused is refused before anything is written (:func:`_check_before_work`); then
    the run directory is locked for the whole run, by the supervisor and every node it starts
    (NOTE [ One lock for a run's processes ] in runlock.py), which all die with the supervisor
    (NOTE [ Children die with their parent ]). ``resume`` of a finished run starts no node, changes
    no file and returns the report saved when it finished.

    Raises:
        ClusterError: a refusal every node shares (with its message), more failures than
            ``max_restarts``, no node left.
        RunLockedError: another process writes ``config.run_dir``.
        RunMismatchError: ``resume`` with settings that differ from the run's.
        EdgetrainError: see :func:`_check_before_work`; a fresh run into a directory that holds
            one without ``overwrite``.
    """
    from ..train.loop import open_run

    started = time.time()
    rated = _check_before_work(config, nodes, options)
    undo = LeftAsItWas(config.run_dir, own=(LOCK_FILE,))
    with RunDirectory(config.run_dir) as run, undo:
        opening = open_run(run, config)  # as rank 0 will: a run of other settings, or one there without --resume
        if opening.finished is not None:
            log.info("the run in %s is finished; nothing to do", run.path)
            undo.commit()
            return _saved_report(config.run_dir, len(rated))
        run.claim()
        config = _generate_data(config)  # a data folder it cannot read: refused with nothing made kept
        undo.commit()
        report = LocalReport(nodes=len(rated))
        with contextlib.ExitStack() as stack:
            stack.enter_context(_termination_unwinds())
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


def _check_before_work(config: TrainConfig, nodes: Sequence[NodeSpec], options: LocalOptions) -> tuple[NodeSpec, ...]:
    """Refuse, before anything is written, what no node could run; every node with its speed fixed.

    Every node's settings, the link preset, the speeds (some nodes with one and others none), the
    faults (a node that does not exist, a cut without the network emulation), the batch (a share
    for every node) and every budget against the least step of the node's share
    (:func:`_refuse_budgets_below_the_least_step`). Nodes would otherwise each calibrate this
    machine for their speed.

    Raises:
        EdgetrainError: the first refusal, in one line.
    """
    for node in nodes:
        replace(config, device=node.device, memory=node.memory).check()
    if options.preset is not None and options.preset not in PRESETS:  # also where the emulation falls back
        raise ClusterError(f"--preset must be one of {', '.join(PRESETS)}; got {options.preset!r}")
    _check_faults(options, len(nodes))
    rated = tuple(replace(node, rate_flops_per_s=node_speed(node)) for node in nodes)
    check_speeds([node.rate_flops_per_s for node in rated])
    _refuse_budgets_below_the_least_step(config, rated, _first_shares(config, rated, options))
    return rated


def _check_faults(options: LocalOptions, nodes: int) -> None:
    """Refuse a fault that could not fire: on a node that does not exist, a cut without the emulated links."""
    ids = "0" if nodes == 1 else f"0 to {nodes - 1}"
    for fault in options.faults:
        if not 0 <= fault.node < nodes:
            raise ClusterError(f"--{fault.kind} {fault.node}@{fault.at_step}: there is no node {fault.node}; "
                               f"the nodes of --nodes {nodes} are {ids}")
    if any(f.kind == "cut" for f in options.faults) and (options.preset is None or can_emulate() is not None):
        raise ClusterError("a 'cut' fault needs the network emulation (--netns, as root)")


def _classes(config: TrainConfig) -> int:
    """The classes a model is built for before the data is read: the synthetic set's, else the least a dataset has
    (others change only the last layer)."""
    from ..data import SYNTHETIC_CLASSES

    return SYNTHETIC_CLASSES if config.data == "synthetic" else 2


def _first_shares(config: TrainConfig, rated: Sequence[NodeSpec], options: LocalOptions) -> tuple[int, ...]:
    """Every node's share of the global batch in the whole group, as the nodes will split it.

    Raises:
        EdgetrainError: the batch cannot give every node its least share.
    """
    own_norms = not options.node_options().normalises_across_nodes(len(rated)) and _has_batch_norm(config)
    return batch_shares(config.batch, [n.rate_flops_per_s for n in rated], own_norms=own_norms)


def _has_batch_norm(config: TrainConfig) -> bool:
    from torch import nn

    from ..models import get_model_spec

    model = get_model_spec(config.model).build(_classes(config))
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _refuse_budgets_below_the_least_step(config: TrainConfig, rated: Sequence[NodeSpec],
                                         shares: Sequence[int]) -> None:
    """Refuse every node whose budget cannot hold the least step of its share, as its own plan would.

    The least step is profiled here on an example batch of the share's shape. The runtime
    baseline is the one estimated for a fresh training process
    (:func:`~edgetrain.train.budget.estimate_runtime_baseline_bytes`); a node measures its own,
    typically higher, so a budget let through here may still be refused by the node, never one
    the other way round.
    """
    budgets = [replace(config, device=n.device, memory=n.memory).budget_bytes() for n in rated]
    if all(budget is None for budget in budgets):
        return
    from ..models import get_model_spec
    from ..planners.plan import least_step_bytes
    from ..train.budget import ProcessBudget, estimate_runtime_baseline_bytes
    from ..train.loop import profile_batch

    spec = get_model_spec(config.model)
    model = spec.build(_classes(config))
    baseline = estimate_runtime_baseline_bytes()
    least: dict[int, int] = {}
    refusals = []
    for node, (share, budget) in enumerate(zip(shares, budgets, strict=True)):
        if budget is None:
            continue
        if share not in least:
            x, y = spec.example_input(share, config.image), spec.example_target(share, num_classes=_classes(config))
            least[share] = least_step_bytes(profile_batch(model, x, y, replace(config, batch=share)))
        process = ProcessBudget(budget, baseline)
        if process.predicted_process_bytes(least[share]) > budget:
            refusals.append(f"node {node} cannot hold its share of {share} of {config.batch} samples per step: "
                            f"{process.infeasible(least[share])}")
    if refusals:
        raise ClusterError("; ".join(refusals))


def _generate_data(config: TrainConfig) -> TrainConfig:
    """Generate the run's data once (nodes would otherwise each write the same synthetic dataset); ``config`` with
    its data root fixed."""
    from ..train.loop import open_run_data

    open_run_data(config, config.run_dir)
    return replace(config, data_root=config.data_root or config.run_dir / "data")


_TERMINATED: list[int] = []   # signals received inside _termination_unwinds, whether or not their SystemExit got out
_DEFERRING: list[bool] = []   # non-empty inside _starting: a SIGTERM is recorded, and raised when the start is held


@contextlib.contextmanager
def _termination_unwinds() -> Iterator[None]:
    """While inside (in the main thread), SIGTERM raises SystemExit, so the supervisor's ``finally`` blocks kill
    its nodes and spares, and is recorded for :func:`_unwind_if_terminated` (NOTE [ Supervision ])."""
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
def _starting() -> Iterator[None]:
    """Around starting a process and holding it where the ``finally`` blocks that kill find it: a SIGTERM inside
    is raised only on leaving. Raised inside ``Popen`` (after its fork) or before the process is held, it left
    a node or spare running with no one to end it (CI: a spare outlived its supervisor, 1 in about 4 suites)."""
    received = len(_TERMINATED)
    _DEFERRING.append(True)
    try:
        yield
    finally:
        _DEFERRING.pop()
    _unwind_if_terminated(since=received)


def _unwind_if_terminated(since: int = 0) -> None:
    """Raise the SystemExit of a SIGTERM whose own was swallowed or held (NOTE [ Supervision ]): one of those
    received after the first ``since``."""
    if len(_TERMINATED) > since:
        raise SystemExit(128 + _TERMINATED[-1])


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
            _Spares(config.run_dir / LOG_DIR, Path(scratch), network, options.spares, lock_fd) as spares:
        attempt = 0
        while True:
            group = _Group(config if attempt == 0 else replace(config, resume=True, overwrite=False),
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
    from ..fileio import write_json

    write_json(run_dir / CLUSTER_FILE, report.to_dict())


class _Spares:
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

        with log_path.open("wb") as log_file, _starting():
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

    def __enter__(self) -> _Spares:
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


@dataclass(frozen=True)
class _Outcome:
    kind: str  # done, failed, refused, rejoin
    node: int | None = None
    message: str = ""
    step: int = 0


class _Group:
    """One attempt: the nodes started on one port, watched until they finish or one fails."""

    def __init__(self, config: TrainConfig, members: list[tuple[int, NodeSpec]], options: LocalOptions,
                 scratch: Path, attempt: int, network: NetworkEmulation | None, spares: _Spares,
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
                with self.logs[node_id].open("wb") as log_file, _starting():
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
            _unwind_if_terminated()
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

    def _inject(self, fault: Fault) -> None:
        if fault.kind == "cut":
            assert self.network is not None
            self.network.cut(fault.node)
        else:
            os.kill(self.procs[fault.node].pid, signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)

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
