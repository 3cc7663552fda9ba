"""One node of a data-parallel cluster: plan for its own device, train its share, sum gradients with the others.

The step itself, and periodic averaging, are in ``step.py`` (NOTE [ Cluster step ]).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..core.chain import Chain
from ..core.optim import make_optimizer, set_learning_rate
from ..data import collate_skip_corrupt, first_batch
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..models import get_model_spec
from ..models.stages import training_stages
from ..planners import Plan
from ..profiling.process import configure_allocator, read_process_memory, reset_peak, return_freed_memory
from ..runtime import Executor
from ..sysutil.fileio import write_json
from ..train.budget import ProcessBudget, measure_runtime_baseline, split_process_budget
from ..train.config import TrainConfig
from ..train.loop import (
    MetricsLog,
    Opening,
    TrainSummary,
    choose_plan,
    evaluate,
    open_run,
    open_run_data,
    profile_batch,
    truncate_metrics,
)
from ..train.rundir import METRICS_FILE, PLAN_FILE, STATE_DIR, SUMMARY_FILE, RunDirectory
from ..train.state import ResumableSampler, StateStore, TrainingState
from ..units import format_bytes
from .batch_norm import synchronise_batch_norm
from .batch_shares import split_batch
from .compress import PowerSGD
from .group import (
    ClusterEnv,
    ClusterError,
    config_hash,
    farewell,
    gather_verdicts,
    join,
    leave,
)
from .half_allreduce import WIRE_DTYPES, HalfPrecisionAllReduce
from .runlock import InheritedRunDirectory
from .step import OuterStep, average_parameters, cluster_step, restart_optimizer, seed_step

__all__ = ["NodeSpec", "ClusterOptions", "train_node", "node_speed", "check_speeds", "cluster_settings", "batch_shares",
           "profile_share", "profile_shares", "weights_digest"]

log = logging.getLogger(__name__)

# A beat's write to the master's store may wait this long: the master's store thread shares a
# throttled CPU quota with its training, so a second can pass; above it, the node is cut off.
STORE_BEAT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class NodeSpec:
    """What one node is: the device it plans for, its memory budget, and optionally its measured speed.

    Args:
        device: a catalog device name (its RAM is the budget when ``memory`` is None).
        memory: the process budget, e.g. ``"600MiB"``.
        rate_flops_per_s: the node's training rate; None takes it from the time model (NOTE [ One
            time model ]). Needed for a device whose catalog gives no rate.
    """

    device: str | None = None
    memory: str | int | None = None
    rate_flops_per_s: float | None = None


@dataclass(frozen=True)
class ClusterOptions:
    """How long to wait for the cluster, and where a supervisor watches this node's heartbeat.

    Args:
        connect_timeout_s: joining (master unreachable, a node that never comes).
        timeout_s: every collective after joining (a node that stopped answering).
        heartbeat: a file whose modification time this node refreshes every ``heartbeat_s``
            from a thread of its own; a stopped (SIGSTOP) or dead process stops refreshing it.
        average_every: 1 sums gradients every step (exact data parallelism); ``K > 1`` trains
            locally and averages the weights every ``K`` steps (NOTE [ Periodic averaging ]).
        compress_rank: 0 sums whole gradients; ``R > 0`` sums rank-``R`` PowerSGD approximations with
            error feedback (NOTE [ PowerSGD on plain all-reduces ]).
        compress_after: with ``compress_rank``, the first steps that still sum whole gradients: the
            early steps, where gradients change fastest, are the ones a low rank approximates worst
            (PyTorch's PowerSGD hook starts late for the same reason, ``start_powerSGD_iter``).
        profile_dir: this node's profiles by share (``chain-<share>.json``): a profile at a share
            this node has profiled before is read, not measured again (NOTE [ Warm spares ]).
        local_batch_norm: each node's BatchNorm normalises over its own slice (ghost batches, no
            collective) instead of the global batch (NOTE [ Cross-node BatchNorm ]); periodic
            averaging always does.
        outer_lr, outer_momentum: with ``average_every > 1``, DiLoCo's outer step on the averaged
            weights (NOTE [ Outer step ]); 1 and 0 are plain averaging.
        wire_dtype: ``float32`` sums whole gradients as they are, after the backward; ``float16`` or
            ``bfloat16`` sums them in that precision, bucket by bucket while the backward runs (NOTE
            [ Half-precision buckets overlapped with the backward ]); with ``compress_rank``, in
            the exact steps before compression starts.
        run_dir_locked: the supervisor holds the run directory's lock and this process inherited it (NOTE [ One
            lock for a run's processes ] in runlock.py): rank 0 writes under it instead of taking its own.
    """

    connect_timeout_s: float = 60.0
    timeout_s: float = 120.0
    heartbeat: Path | None = None
    heartbeat_s: float = 0.25
    average_every: int = 1
    compress_rank: int = 0
    compress_after: int = 0
    profile_dir: Path | None = None
    local_batch_norm: bool = False
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    wire_dtype: str = "float32"
    run_dir_locked: bool = False

    def __post_init__(self) -> None:
        if self.wire_dtype not in ("float32", *WIRE_DTYPES):
            raise EdgetrainError(f"--wire must be one of float32, {', '.join(WIRE_DTYPES)}; got {self.wire_dtype!r}")
        if self.wire_dtype != "float32" and self.average_every > 1:
            raise EdgetrainError(f"--wire {self.wire_dtype} sums gradients every step; with --average-every "
                                 f"{self.average_every} the nodes average weights instead (use one or the other)")
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise EdgetrainError(f"--outer-lr must be a finite number > 0, got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise EdgetrainError(f"--outer-momentum must be in [0, 1), got {self.outer_momentum}")

    @property
    def outer_step(self) -> bool:
        """Whether the averaging is DiLoCo's outer step rather than plain averaging."""
        return self.average_every > 1 and (self.outer_lr != 1.0 or self.outer_momentum != 0.0)

    def normalises_across_nodes(self, world_size: int) -> bool:
        """Whether a BatchNorm takes the global batch's statistics (NOTE [ Cross-node BatchNorm ]) rather than its
        node's slice's."""
        return self.average_every == 1 and world_size > 1 and not self.local_batch_norm


def batch_shares(batch: int, speeds: Sequence[float | None], *, own_norms: bool) -> tuple[int, ...]:
    """Every node's share of the global batch, by speed (equal without speeds); two samples at least where a
    BatchNorm normalises over each node's own slice (``own_norms``)."""
    return split_batch(batch, [1.0 if s is None else s for s in speeds], least=2 if own_norms else 1)


def cluster_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings every node must share (the run's identity, the epochs, the save interval).

    A dataset folder is named by its last component: each node reads its own copy, wherever it is mounted.
    """
    data = config.data if config.data == "synthetic" else f"folder:{Path(config.data).expanduser().resolve().name}"
    return {**config.identity().identity, "data": data, "epochs": config.epochs, "save_every": config.save_every}


def node_speed(node: NodeSpec) -> float | None:
    """The node's predicted training rate (FLOP/s); None without a device or a rate.

    Raises:
        EdgetrainError: the device has no rate in the catalog (message says why and what to give).
    """
    if node.rate_flops_per_s is not None:
        return float(node.rate_flops_per_s)
    if node.device is None:
        return None
    from ..costs.timemodel import needs_calibration, training_rate, unknown_rate_reason
    from ..devices import get_device
    from ..profiling.host import host_calibration

    device = get_device(node.device)
    rate = training_rate(device, host_calibration() if needs_calibration(device) else None)
    if rate is None:
        raise EdgetrainError(f"{unknown_rate_reason(device)}; give the node's --rate in FLOP/s")
    return rate.flops_per_s


def train_node(config: TrainConfig, node: NodeSpec, env: ClusterEnv,
               options: ClusterOptions = ClusterOptions()) -> TrainSummary | None:
    """Train this node's share of every step of ``config`` (the global run) with the other nodes.

    ``config.batch`` is the global batch; ``config.device``/``memory`` are ignored in favour of
    ``node``'s. Returns the summary on rank 0, None elsewhere.

    Raises:
        ClusterError: on every node alike (NOTE [ One error on every node ]): unreachable master,
            nodes with other versions or settings, a node whose budget cannot hold its share.
        EdgetrainError: a bad setting, found before joining.
    """
    local = replace(config, device=node.device, memory=node.memory)
    local.check()
    with _Heartbeat(options, env) as heartbeat:
        join(env, connect_timeout_s=options.connect_timeout_s, timeout_s=options.timeout_s)
        heartbeat.joined.set()
        try:
            summary = _train_joined(config, local, node, env, options)
        except ClusterError:  # every node refuses alike (NOTE [ One error on every node ]): leave together
            farewell()
            leave()
            raise
        except BaseException:  # the cluster broke: waiting for the others could hang
            leave()
            raise
        farewell()
        leave()
        return summary


class _Heartbeat:
    """A thread that touches ``options.heartbeat`` every ``heartbeat_s`` until the block ends (nothing without a file).

    Once the node has joined, a beat first counts ``heartbeat/<rank>`` up in the master's store over
    its own connection: a node cut off from the master stops beating as a stopped one does
    (NOTE [ Supervision ] in supervisor.py).

    The block's end waits for the thread: a daemon thread still inside a store call (torch releases
    the GIL there) when the interpreter finalizes takes the GIL back on return, and Python 3.11 ends
    such a thread with ``pthread_exit``, whose unwinding through pybind11's ``gil_scoped_release``
    destructor calls ``std::terminate``: the node, its training done, would die by SIGABRT ("terminate
    called without an active exception"), and the supervisor would count a crash and restart it.
    """

    def __init__(self, options: ClusterOptions, env: ClusterEnv) -> None:
        self.path, self.every_s, self.env = options.heartbeat, options.heartbeat_s, env
        self.stop = threading.Event()
        self.joined = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="edgetrain-heartbeat", daemon=True)

    def _beat(self) -> None:
        assert self.path is not None
        store: Any = None
        while not self.stop.is_set():
            try:
                if self.joined.is_set():
                    if store is None:
                        store = self._connect()
                    store.add(f"heartbeat/{self.env.rank}", 1)  # a round trip: set() does not wait for a reply
                self.path.touch()
            except RuntimeError as exc:  # the master is unreachable: no beat
                log.warning("heartbeat: the master's store did not answer (%s)", str(exc).splitlines()[0])
                store = None
            self.stop.wait(self.every_s)

    def _connect(self) -> Any:
        import datetime

        import torch.distributed as dist

        return dist.TCPStore(self.env.master_addr, self.env.master_port, is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=STORE_BEAT_TIMEOUT_S))

    def __enter__(self) -> _Heartbeat:
        if self.path is not None:
            self.path.touch()
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():  # a beat in flight: a connect and an add, each bounded by the store's timeout
            self.thread.join(timeout=2 * STORE_BEAT_TIMEOUT_S + self.every_s + 1.0)


def _agree(config: TrainConfig, node: NodeSpec, options: ClusterOptions) -> list[float | None]:
    """Check that all nodes run the same versions and settings; every node's speed, in rank order."""
    try:
        speed: float | None = node_speed(node)
        speed_error = None
    except EdgetrainError as exc:
        speed, speed_error = None, str(exc)
    settings = {**cluster_settings(config), "average_every": options.average_every,
                "compress_rank": options.compress_rank, "compress_after": options.compress_after,
                "local_batch_norm": options.local_batch_norm, "outer_lr": options.outer_lr,
                "outer_momentum": options.outer_momentum, "wire_dtype": options.wire_dtype}
    mine = {"edgetrain": __version__, "torch": torch.__version__, "config": config_hash(settings),
            "speed": speed, "speed_error": speed_error, "device": node.device}
    verdicts = gather_verdicts(mine)
    for key, what in (("edgetrain", "edgetrain version"), ("torch", "torch version"), ("config", "run settings")):
        values = [v[key] for v in verdicts]
        if len(set(values)) > 1:
            raise ClusterError(f"the nodes disagree on the {what}: " + ", ".join(
                f"node {r}: {value}" for r, value in enumerate(values)) + "; run every node with the same "
                + ("edgetrain and torch" if key != "config" else "settings (model, data, batch, seed, ...)"))
    errors = [f"node {r}: {v['speed_error']}" for r, v in enumerate(verdicts) if v["speed_error"]]
    if errors:
        raise ClusterError("; ".join(errors))
    speeds = [v["speed"] for v in verdicts]
    check_speeds(speeds)
    return speeds


def check_speeds(speeds: Sequence[float | None]) -> None:
    """Refuse a cluster where some nodes have a speed and others none: the batch could not be split by speed."""
    if any(s is None for s in speeds) and any(s is not None for s in speeds):
        unknown = ", ".join(str(r) for r, s in enumerate(speeds) if s is None)
        raise ClusterError(f"nodes {unknown} have no --device or --rate while others do: the batch cannot be "
                           "split by speed; give every node a device (or a rate), or none")


def _open_on_rank0(config: TrainConfig, env: ClusterEnv, run: RunDirectory | None) -> tuple[Opening, bool]:
    """Rank 0 decides how the run starts (fresh, resumed); every node learns it, and whether the run is finished."""
    import torch.distributed as dist

    verdict: Any = None
    opening = Opening()
    if run is not None:
        try:
            opening = open_run(run, config)
        except EdgetrainError as exc:
            verdict = str(exc)
    errors = gather_verdicts(verdict)
    if errors[0] is not None:
        raise ClusterError(f"node 0: {errors[0]}")
    payload: list[Any] = [None if opening.state is None else opening.state.to_payload(),
                          opening.finished is not None]
    dist.broadcast_object_list(payload, src=0)
    if env.rank != 0:
        opening = Opening(state=None if payload[0] is None else TrainingState.from_payload(payload[0]))
    return opening, bool(payload[1])


def _train_joined(config: TrainConfig, local: TrainConfig, node: NodeSpec, env: ClusterEnv,
                  options: ClusterOptions) -> TrainSummary | None:
    speeds = _agree(config, node, options)
    run = _hold_run_directory(config, options) if env.rank == 0 else None
    try:
        opening, finished = _open_on_rank0(config, env, run)
        if finished:
            return opening.finished
        if run is not None:
            run.claim()
        return NodeRun(config, local, env, speeds, opening, run, options).train()
    finally:
        if run is not None:
            run.__exit__(None, None, None)


def _hold_run_directory(config: TrainConfig, options: ClusterOptions) -> RunDirectory:
    """Rank 0's hold on the run directory: the lock its supervisor passed down (NOTE [ One lock for a run's
    processes ] in runlock.py), else one of its own (a node under torchrun)."""
    held = InheritedRunDirectory(config.run_dir) if options.run_dir_locked else RunDirectory(config.run_dir)
    return held.__enter__()


class NodeRun:
    """One node's training in a data-parallel cluster: its model, its share of the data, its plan and executor.

    Built once per node process by :func:`train_node`; :meth:`train` runs the epochs, averaging gradients
    (or parameters, on slow links) with the other nodes at every step and checkpointing as rank 0.
    """

    def __init__(self, config: TrainConfig, local: TrainConfig, env: ClusterEnv, speeds: list[float | None],
                 opening: Opening, run: RunDirectory | None, options: ClusterOptions) -> None:
        self.started = time.perf_counter()
        self.average_every, self.profile_dir = options.average_every, options.profile_dir
        self.compress_after = options.compress_after
        if local.budget_bytes() is not None:  # as `edgetrain train` (NOTE [ Returning freed memory ])
            configure_allocator()
        self.config, self.env, self.run = config, env, run
        self.replaces = opening.replaces  # --overwrite: the old run goes once this one has planned
        spec = get_model_spec(config.model)
        self.train_set, self.val_set, self.num_classes = open_run_data(config, config.run_dir)
        torch.manual_seed(config.seed)
        self.model = spec.build(self.num_classes)
        has_batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.model.modules())
        # NOTE [ Cross-node BatchNorm ]; with periodic averaging each node keeps its own statistics
        self.cross_node_norms = options.normalises_across_nodes(env.world_size) and \
            synchronise_batch_norm(self.model) > 0
        self.shares = batch_shares(config.batch, speeds, own_norms=has_batch_norm and not self.cross_node_norms)
        self.share = self.shares[env.rank]
        self.offset = sum(self.shares[:env.rank])
        if len(self.train_set) < config.batch:
            raise ClusterError(f"the training split has {len(self.train_set)} samples, fewer than one global batch "
                               f"of {config.batch}")
        self.optimizer = make_optimizer(config.optimizer, self.model.parameters(), config.lr)
        self.outer = OuterStep(list(self.model.parameters()), options.outer_lr, options.outer_momentum) \
            if options.outer_step else None
        self.sampler = ResumableSampler(len(self.train_set), config.seed)
        self.total_steps = config.total_steps(len(self.train_set))  # whole global batches only
        self.chosen, self.budget = self._plan(replace(local, batch=self.share))
        x, y = first_batch(self.train_set, 1)
        self.no_sample = (x[:0], y[:0])  # a node's step when none of its slice is readable (cross-node norms)
        self.executor = Executor(training_stages(self.model), self.chosen.schedule, None)
        self.compressor = None if options.compress_rank == 0 else PowerSGD(self.model.parameters(),
                                                                           options.compress_rank, seed=config.seed)
        self.half = None
        if options.wire_dtype in WIRE_DTYPES and env.world_size > 1:  # every node makes the group: all agree
            import torch.distributed as dist

            self.half = HalfPrecisionAllReduce(self.model.parameters(), WIRE_DTYPES[options.wire_dtype],
                                               group=dist.new_group(backend="gloo"))
        self.step, self.epoch = 0, 0
        self.resumed_from: int | None = None
        if opening.state is not None:
            opening.state.restore(self.model, self.optimizer, sampler=self.sampler)
            if self.outer is not None:
                self.outer.load_state_dict(opening.state.metadata.get("outer"))
            self.step, self.epoch, self.resumed_from = opening.state.step, opening.state.epoch, opening.state.step
        log.info("node %d of %d: %d of %d samples per step, plan %s", env.rank, env.world_size, self.share,
                 config.batch, self.chosen.strategy)
        return_freed_memory()
        reset_peak()  # from here on the kernel's high-water mark is training's, as in `edgetrain train`

    def _plan(self, local: TrainConfig) -> tuple[Plan, ProcessBudget | None]:
        """Profile and plan this node's step at its share, under its budget; every node learns every verdict."""
        x, y = first_batch(self.train_set, self.share)
        verdict: str | None = None
        chosen: Plan | None = None
        budget = None
        try:
            chain = profile_share(self.model, x, y, local, self.profile_dir)
            optimizer_state = [t for s in self.optimizer.state.values() for t in s.values()
                               if isinstance(t, torch.Tensor)]
            baseline = measure_runtime_baseline(self.model, x, y, *optimizer_state)
            process_bytes = local.budget_bytes()
            budget = None if process_bytes is None else split_process_budget(process_bytes, baseline)
            chosen = choose_plan(chain, local, budget, None)
        except InfeasibleBudgetError as exc:
            verdict = str(exc)
        verdicts = gather_verdicts(verdict)
        failed = [(r, v) for r, v in enumerate(verdicts) if v is not None]
        if failed:
            raise ClusterError("; ".join(f"node {r} cannot hold its share of {self.shares[r]} of {self.config.batch} "
                                         f"samples per step: {v}" for r, v in failed))
        assert chosen is not None
        return chosen, budget

    def train(self) -> TrainSummary | None:
        config, store = self.config, None
        past: list[dict[str, Any]] = []
        if self.run is not None:
            if self.replaces:
                self.run.remove_run()
            self.run.record(config.identity())
            store = StateStore(self.run.file(STATE_DIR), keep_last=config.keep_last)
            write_json(self.run.file(PLAN_FILE), {"schedule": self.chosen.schedule.to_dict(), **self.chosen.to_dict()})
            resumed_at = None if self.resumed_from is None else (self.step, self.epoch)
            past = truncate_metrics(self.run.file(METRICS_FILE), resumed_at)
        last_eval: dict[str, Any] = next((r for r in reversed(past) if "val_accuracy" in r), {})
        accuracy, val_loss = last_eval.get("val_accuracy"), last_eval.get("val_loss")
        with _metrics(self.run) as metrics:
            while self.epoch < config.epochs:
                for indices in self._global_batches():
                    record = self._train_step(indices)
                    if metrics is not None:
                        metrics.append(record)
                    if store is not None and self.step % config.save_every == 0:
                        store.save(self._capture(self.sampler.position))
                if self.env.rank == 0:
                    accuracy, val_loss = evaluate(self.model, self.val_set, config.batch)
                    if metrics is not None:
                        metrics.append({"step": self.step, "epoch": self.epoch, "val_accuracy": accuracy,
                                        "val_loss": val_loss})
                self.epoch += 1
                self.sampler.set_epoch(self.epoch)
                if store is not None:
                    store.save(self._capture(0))
        log.info("node %d: weights after step %d: sha256 %s", self.env.rank, self.step, weights_digest(self.model))
        return self._summary(accuracy, val_loss) if self.run is not None else None

    def _global_batches(self) -> Iterator[list[int]]:
        """The epoch's global batches from the sampler's position: whole batches only (drop_last)."""
        order = self.sampler.order().tolist()
        while self.sampler.position + self.config.batch <= len(order):
            start = self.sampler.position
            self.sampler.position += self.config.batch
            yield order[start:start + self.config.batch]

    def _train_step(self, indices: list[int]) -> dict[str, Any]:
        started = time.perf_counter()
        batch = collate_skip_corrupt([self.train_set[i] for i in indices[self.offset:self.offset + self.share]])
        if self.cross_node_norms and batch is None:  # its layers' all-reduces need this node too
            batch = self.no_sample
        elif not self.cross_node_norms and batch is not None and len(batch[1]) < 2 <= self.share:
            # a BatchNorm over this node's slice cannot train on one sample
            batch = None
        exact = self.average_every == 1
        seed_step(self.config.seed, self.step, self.env.rank)
        rate = self.config.learning_rate_at(self.step, self.total_steps)
        set_learning_rate(self.optimizer, rate)
        result = cluster_step(self.executor, self.model, self.optimizer, batch, average=exact,
                              compressor=self.compressor if self.step >= self.compress_after else None,
                              half=self.half)
        if result.samples == 0:
            raise ClusterError(f"step {self.step + 1}: no readable sample in the global batch")
        self.step += 1
        sync_s = result.sync_s
        if not exact and self.step % self.average_every == 0:
            sync_s += average_parameters(self.model, self.share / self.config.batch)
            if self.outer is not None:
                self.outer.step()
                restart_optimizer(self.optimizer)
        elapsed = time.perf_counter() - started
        return {"step": self.step, "epoch": self.epoch, "loss": result.loss, "samples_per_s": result.samples / elapsed,
                "time_s": elapsed, "sync_s": sync_s, "world_size": self.env.world_size, "lr": rate,
                "samples": result.samples, "wall_time": time.time()}

    def _capture(self, consumed: int) -> TrainingState:
        return TrainingState.capture(step=self.step, epoch=self.epoch, model=self.model, optimizer=self.optimizer,
                                     schedule=self.chosen.schedule, sampler=self.sampler.state_dict(consumed=consumed),
                                     metadata={"world_size": self.env.world_size, "shares": list(self.shares),
                                               **({} if self.outer is None else {"outer": self.outer.state_dict()})})

    def _summary(self, accuracy: float | None, val_loss: float | None) -> TrainSummary:
        assert self.run is not None

        config = self.config
        baseline = 0 if self.budget is None else self.budget.runtime_baseline_bytes
        summary = TrainSummary(
            accuracy=accuracy, chance_accuracy=1 / self.num_classes, val_loss=val_loss, measured_peak_bytes=None,
            predicted_peak_bytes=self.chosen.predicted_peak_bytes, budget_bytes=None if self.budget is None
            else self.budget.process_bytes, tensor_budget_bytes=None if self.budget is None
            else self.budget.tensor_bytes, process_peak_bytes=read_process_memory().peak_rss_bytes,
            runtime_baseline_bytes=baseline,
            predicted_process_peak_bytes=ProcessBudget(0, baseline).predicted_process_bytes(
                self.chosen.predicted_peak_bytes),
            recompute_factor=self.chosen.recompute_factor, strategy=self.chosen.strategy,
            wall_time_s=time.perf_counter() - self.started, steps=self.step, epochs=config.epochs,
            train_samples=len(self.train_set), val_samples=len(self.val_set), resumed_from_step=self.resumed_from,
            skipped_samples=self.train_set.corrupt_count + self.val_set.corrupt_count,
            config={**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
                    "world_size": self.env.world_size, "shares": list(self.shares)})
        write_json(self.run.file(SUMMARY_FILE), asdict(summary))
        log.info("rank 0: %d steps, budget %s", self.step, format_bytes(summary.budget_bytes or 0))
        return summary


def weights_digest(model: nn.Module) -> str:
    """The sha256 of the parameters' bytes, in order: the same on every node after exact or compressed steps
    (each node logs it at the end, so a run whose nodes' weights parted shows it)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def profile_share(model: nn.Module, x: torch.Tensor, y: torch.Tensor, local: TrainConfig,
                  profile_dir: Path | None) -> Chain:
    """The profile of a step at ``local.batch`` samples: read from ``profile_dir`` when this node measured it
    before, else measured (:func:`~edgetrain.train.loop.profile_batch`) and kept there."""
    cached = None if profile_dir is None else profile_dir / f"chain-{local.batch}.json"
    if cached is not None and cached.exists():
        return Chain.load(cached)
    chain = profile_batch(model, x, y, local)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        chain.save(cached)
    return chain


def profile_shares(config: TrainConfig, node: NodeSpec, options: ClusterOptions, shares: list[int]) -> None:
    """Profile this node at each of ``shares`` into ``options.profile_dir`` ahead of need (a warm spare's
    work: NOTE [ Warm spares ] in spares.py)."""
    if not shares:
        return
    spec = get_model_spec(config.model)
    train_set, _, num_classes = open_run_data(config, config.run_dir)
    torch.manual_seed(config.seed)
    model = spec.build(num_classes)
    for share in shares:
        x, y = first_batch(train_set, share)
        profile_share(model, x, y, replace(config, device=node.device, memory=node.memory, batch=share),
                      options.profile_dir)


def _metrics(run: RunDirectory | None) -> Any:
    """Rank 0's metrics log; nothing on the other nodes."""
    return contextlib.nullcontext() if run is None else MetricsLog(run.file(METRICS_FILE))
