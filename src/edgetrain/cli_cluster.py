"""``edgetrain cluster``: data-parallel training across edge nodes (``run``, ``local``; ``federated`` is in
``cli_federated``).

Registered on the main app by one line in :mod:`edgetrain.cli`; the library is imported inside
each command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import typer

from .cli_common import clean_errors, console, error
from .fileio import to_json

cluster_app = typer.Typer(help="Data-parallel training across edge nodes on torch.distributed: one node in "
                                "torchrun's environment, a supervised cluster on this machine, or federated rounds.",
                          no_args_is_help=True)

ModelOpt = typer.Option("resnet18_cifar", "--model", "-m", help="Model name from the zoo.")
DataOpt = typer.Option("synthetic", "--data", help="'synthetic', an image folder or a CIFAR-10 folder.")
SamplesOpt = typer.Option(1000, "--samples", min=1, help="Size of the synthetic dataset.")
BatchOpt = typer.Option(32, "--batch", "-b", min=1, help="Global batch: the samples of one step of the whole "
                        "cluster, split among the nodes in proportion to their speed.")
ImageOpt = typer.Option(32, "--image", "--size", min=1, help="Image side in pixels.")
EpochsOpt = typer.Option(1, "--epochs", min=1, help="Passes over the training split.")
OptimizerOpt = typer.Option("sgd", "--optimizer", help="sgd (with momentum) or adam.")
LrOpt = typer.Option(None, "--lr", help="Learning rate (default 0.01 SGD, 0.001 Adam).")
LrScheduleOpt = typer.Option("constant", "--lr-schedule", help="constant, or cosine: from --lr down to 0 at the "
                             "run's last step.")
SeedOpt = typer.Option(0, "--seed", help="Seed of the data, the model and the order.")
SaveEveryOpt = typer.Option(1, "--save-every", min=1, help="Rank 0 saves the state every N steps (a failure "
                            "repeats at most N - 1 steps).")
RunDirOpt = typer.Option(Path("runs/cluster"), "--run-dir", help="Rank 0's metrics, state and summary.")
ResumeOpt = typer.Option(False, "--resume", help="Continue the run in --run-dir (at any number of nodes).")
OverwriteOpt = typer.Option(False, "--overwrite", help="Replace a run already in --run-dir.")
AverageOpt = typer.Option(1, "--average-every", min=1, help="1: sum gradients every step (exact). K > 1: local "
                          "steps, weights averaged every K steps (for slow links).")
CompressOpt = typer.Option(0, "--compress-rank", min=0, help="0: whole gradients. R > 0: PowerSGD rank-R "
                           "approximations with error feedback (for slow links).")
CompressAfterOpt = typer.Option(0, "--compress-after", min=0, help="With --compress-rank: the first N steps "
                                "sum whole gradients, PowerSGD from then on (early gradients compress worst).")
LocalNormOpt = typer.Option(False, "--local-batch-norm", help="Each node's BatchNorm normalises over its own "
                            "slice (no collective; ghost batches) instead of the global batch (the default, as "
                            "one node training on the whole batch would).")
OuterLrOpt = typer.Option(1.0, "--outer-lr", min=0.0, help="With --average-every K > 1: DiLoCo's outer step, "
                          "SGD on the averaged weights' move at this rate (1 with --outer-momentum 0: plain "
                          "averaging; the paper: 0.7).")
OuterMomentumOpt = typer.Option(0.0, "--outer-momentum", min=0.0, max=0.999, help="The outer step's Nesterov "
                                "momentum (the paper: 0.9).")
WireOpt = typer.Option("float32", "--wire", help="How whole gradients cross the links: float32 (as they are, after "
                       "the backward), float16 or bfloat16 (half the bytes, each bucket sent while the backward "
                       "computes the rest; for slow links).")
ConnectOpt = typer.Option(60.0, "--connect-timeout", min=0.1, help="Seconds to wait for the master and every node.")


def _quiet_c10d() -> None:
    """Before torch is imported: quiet c10d's C++ log, whose multi-line socket errors would drown the one-line
    message (set ``TORCH_CPP_LOG_LEVEL=INFO`` to see them)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


def _config(**settings: Any) -> Any:
    from .train import TrainConfig

    return TrainConfig(**settings)


@cluster_app.command("run")
@clean_errors
def run_command(model: str = ModelOpt, data: str = DataOpt, samples: int = SamplesOpt, batch: int = BatchOpt,
                image: int = ImageOpt, epochs: int = EpochsOpt, optimizer: str = OptimizerOpt,
                lr: float | None = LrOpt, lr_schedule: str = LrScheduleOpt, seed: int = SeedOpt,
                save_every: int = SaveEveryOpt,
                run_dir: Path = RunDirOpt, resume: bool = ResumeOpt, overwrite: bool = OverwriteOpt,
                connect_timeout: float = ConnectOpt, average_every: int = AverageOpt,
                compress_rank: int = CompressOpt, compress_after: int = CompressAfterOpt,
                local_batch_norm: bool = LocalNormOpt, outer_lr: float = OuterLrOpt,
                outer_momentum: float = OuterMomentumOpt, wire: str = WireOpt,
                device: str | None = typer.Option(None, "--device", "-d", help="This node's device (it plans "
                                                     "for its memory and gets a share by its speed)."),
                memory: str | None = typer.Option(None, "--memory", help="This node's process budget, e.g. "
                                                     "600MiB (default: the device's RAM)."),
                rate: float | None = typer.Option(None, "--rate", min=0.0, help="This node's training rate "
                                                     "in FLOP/s, for a device the catalog has none for."),
                timeout: float = typer.Option(120.0, "--timeout", min=0.1, help="Seconds a collective may wait "
                                              "for a node before the run stops.")) -> None:
    """One node of a cluster, started by torchrun or by hand (reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    import faulthandler
    faulthandler.enable(all_threads=True)  # a native crash (gloo's std::terminate) prints every thread's stack
    _quiet_c10d()
    from .distributed import ClusterEnv, ClusterError, ClusterOptions, NodeSpec, train_node
    from .distributed.group import end_refused_node

    config = _config(model=model, data=data, samples=samples, batch=batch, image=image, epochs=epochs,
                     optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, seed=seed, save_every=save_every,
                     run_dir=run_dir, resume=resume,
                     overwrite=overwrite)
    env = ClusterEnv.from_environ()
    try:
        summary = train_node(config, NodeSpec(device, memory, rate), env,
                             ClusterOptions(connect_timeout_s=connect_timeout, timeout_s=timeout,
                                            average_every=average_every, compress_rank=compress_rank,
                                            compress_after=compress_after, local_batch_norm=local_batch_norm,
                                            outer_lr=outer_lr, outer_momentum=outer_momentum,
                                            wire_dtype=wire))
    except ClusterError as exc:  # a refusal every node shares: its one line, then the node ends at once
        error(str(exc))
        end_refused_node(2)
    if summary is not None:
        console.print(f"{summary.steps} steps on {env.world_size} nodes in {summary.wall_time_s:.1f} s; "
                      f"metrics: {run_dir / 'metrics.jsonl'}")


def _per_node(option: str, values: list[str], nodes: int) -> list[str | None]:
    """One value for every node: none given, one for all, or one each."""
    if not values:
        return [None] * nodes
    if len(values) not in (1, nodes):
        raise ValueError(f"{option}: give one value for all nodes or one per node ({nodes}), got {len(values)}")
    return [values[0] if len(values) == 1 else values[node] for node in range(nodes)]


def _rates(values: list[str], nodes: int) -> list[float | None]:
    """Every node's ``--rate``: None for 'auto' or none given, else a finite number of FLOP/s above 0.

    Parsed here, before anything is imported: a rate that is no number stops the run at once, named.
    """
    rates: list[float | None] = []
    for value in _per_node("--rate", values, nodes):
        if value is None or value == "auto":
            rates.append(None)
            continue
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"--rate takes 'auto' or a training rate in FLOP/s above 0 (e.g. 20e9), got {value!r}")
        rates.append(number)
    return rates


def _faults(kills: list[str], stops: list[str], cuts: list[str]) -> tuple[Any, ...]:
    from .distributed.local import Fault

    faults = []
    for kind, specs in (("kill", kills), ("stop", stops), ("cut", cuts)):
        for spec in specs:
            node, _, step = spec.partition("@")
            if not (node.isdigit() and step.isdigit()):
                raise ValueError(f"--{kind} takes NODE@STEP, e.g. 1@5, got {spec!r}")
            faults.append(Fault(int(node), int(step), kind))
    return tuple(faults)


@cluster_app.command("local")
@clean_errors
def local_command(model: str = ModelOpt, data: str = DataOpt, samples: int = SamplesOpt, batch: int = BatchOpt,
                  image: int = ImageOpt, epochs: int = EpochsOpt, optimizer: str = OptimizerOpt,
                  lr: float | None = LrOpt, lr_schedule: str = LrScheduleOpt, seed: int = SeedOpt,
                  save_every: int = SaveEveryOpt,
                  run_dir: Path = RunDirOpt, resume: bool = ResumeOpt, overwrite: bool = OverwriteOpt,
                  connect_timeout: float = ConnectOpt, average_every: int = AverageOpt,
                  compress_rank: int = CompressOpt, compress_after: int = CompressAfterOpt,
                  local_batch_norm: bool = LocalNormOpt, outer_lr: float = OuterLrOpt,
                  outer_momentum: float = OuterMomentumOpt, wire: str = WireOpt,
                  nodes: int = typer.Option(2, "--nodes", "-n", min=1, help="Node processes to start."),
                  device: list[str] = typer.Option([], "--device", "-d", help="Device of every node, or one "
                                                   "--device per node (e.g. -d rpi4 -d rpi4 -d jetson-nano)."),
                  memory: list[str] = typer.Option([], "--memory", help="Process budget of every node, or one "
                                                   "per node."),
                  rate: list[str] = typer.Option([], "--rate", help="Training rate (FLOP/s) of every node, or one "
                                                 "per node ('auto': the device's from the time model), for "
                                                 "devices the catalog has none for."),
                  kill: list[str] = typer.Option([], "--kill", help="Inject a failure: SIGKILL node N once step S "
                                                 "is logged (N@S; repeatable)."),
                  stop: list[str] = typer.Option([], "--stop", help="Inject a hang: SIGSTOP node N at step S (N@S)."),
                  cut: list[str] = typer.Option([], "--cut", help="Inject a partition: take node N's link down at "
                                                "step S (N@S; needs --netns as root)."),
                  netns: bool = typer.Option(False, "--netns", help="Each node in its own network namespace and "
                                             "cgroup, links shaped by --preset (needs root; else plain processes, "
                                             "and the report says what is not emulated)."),
                  preset: str = typer.Option("gigabit", "--preset", help="Link of every node with --netns: "
                                             "gigabit, 100mbit (bandwidth only), wifi20 (20 Mbit/s, 5 ms one way, "
                                             "through a user-space delaying switch) or wifi20-lossy (1% frame loss)."),
                  cpus_per_node: float | None = typer.Option(None, "--cpus-per-node", min=0.01, help="CPU quota "
                                                                "of each node with --netns (default: cores / "
                                                                "nodes)."),
                  heartbeat_timeout: float = typer.Option(5.0, "--heartbeat-timeout", min=0.1, help="Seconds "
                                                          "without a heartbeat before a node is declared hung."),
                  timeout: float = typer.Option(30.0, "--timeout", min=0.1, help="Seconds a collective may wait "
                                                "(the backstop behind the heartbeat)."),
                  rejoin_after: int | None = typer.Option(None, "--rejoin-after", min=1, help="A lost node "
                                                             "comes back after the others trained N steps.")) -> None:
    """Start a cluster of --nodes processes on this machine under a supervisor that survives node failures."""
    rates = _rates(rate, nodes)
    _quiet_c10d()
    from .distributed import NodeSpec
    from .distributed.local import LocalOptions, run_local

    config = _config(model=model, data=data, samples=samples, batch=batch, image=image, epochs=epochs,
                     optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, seed=seed, save_every=save_every,
                     run_dir=run_dir, resume=resume,
                     overwrite=overwrite)
    specs = [NodeSpec(d, m, r) for d, m, r in zip(_per_node("--device", device, nodes),
                                                   _per_node("--memory", memory, nodes), rates, strict=True)]
    options = LocalOptions(heartbeat_timeout_s=heartbeat_timeout, timeout_s=timeout,
                           connect_timeout_s=connect_timeout, rejoin_after_steps=rejoin_after,
                           faults=_faults(kill, stop, cut), preset=preset if netns else None,
                           cpus_per_node=cpus_per_node, average_every=average_every, compress_rank=compress_rank,
                           compress_after=compress_after, local_batch_norm=local_batch_norm,
                           outer_lr=outer_lr, outer_momentum=outer_momentum, wire_dtype=wire)
    report = run_local(config, specs, options)
    console.print(to_json(report, indent=2))
    console.print(f"{nodes} nodes ({report['emulation']}), {report['restarts']} restart(s); metrics: "
                  f"{run_dir / 'metrics.jsonl'}, cluster report: {run_dir / 'cluster.json'}")
