"""``edgetrain cluster``: data-parallel training across edge nodes (``run``, ``local``; ``federated`` is in
:mod:`edgetrain.cli.federated`).

The main app registers ``cluster_app`` in :mod:`edgetrain.cli`; the library is imported inside
each command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ..sysutil.fileio import to_json
from .common import ModelArgOpt, clean_errors, console, error, model_name

__all__ = ["cluster_app"]

cluster_app = typer.Typer(help="Data-parallel training across edge nodes on torch.distributed: one node in "
                                "torchrun's environment, a supervised cluster on this machine, or federated rounds.",
                          no_args_is_help=True)

# The options `run` and `local` share, in their --help order: parameter -> (annotation, typer option).
# TrainConfig takes these under the same names (the factory's arguments as part of the model's name)...
TRAINING_OPTIONS: dict[str, tuple[Any, Any]] = {
    "model": (str, typer.Option("resnet18_cifar", "--model", "-m", help="A model of the zoo, or your own as "
                                "package.module:factory, a callable that returns it.")),
    "model_args": (list[str], ModelArgOpt),
    "data": (str, typer.Option("synthetic", "--data", help="'synthetic', an image folder or a CIFAR-10 folder.")),
    "samples": (int, typer.Option(1000, "--samples", min=1, help="Size of the synthetic dataset.")),
    "batch": (int, typer.Option(32, "--batch", "-b", min=1, help="Global batch: the samples of one step of the "
                                "whole cluster, split among the nodes in proportion to their speed.")),
    "image": (int, typer.Option(32, "--image", "--size", min=1, help="Image side in pixels.")),
    "epochs": (int, typer.Option(1, "--epochs", min=1, help="Passes over the training split.")),
    "optimizer": (str, typer.Option("sgd", "--optimizer", help="sgd (with momentum) or adam.")),
    "lr": (float | None, typer.Option(None, "--lr", help="Learning rate (default 0.01 SGD, 0.001 Adam).")),
    "lr_schedule": (str, typer.Option("constant", "--lr-schedule", help="constant, or cosine: from --lr down to 0 "
                                      "at the run's last step.")),
    "seed": (int, typer.Option(0, "--seed", help="Seed of the data, the model and the order.")),
    "save_every": (int, typer.Option(1, "--save-every", min=1, help="Rank 0 saves the state every N steps (a "
                                     "failure repeats at most N - 1 steps).")),
    "run_dir": (Path, typer.Option(Path("runs/cluster"), "--run-dir", help="Rank 0's metrics, state and summary.")),
    "resume": (bool, typer.Option(False, "--resume", help="Continue the run in --run-dir (at any number of nodes).")),
    "overwrite": (bool, typer.Option(False, "--overwrite", help="Replace a run already in --run-dir.")),
}
# ...and ClusterOptions and LocalOptions these, under the names LINK_KEYWORDS gives where theirs differ.
LINK_OPTIONS: dict[str, tuple[Any, Any]] = {
    "connect_timeout": (float, typer.Option(60.0, "--connect-timeout", min=0.1, help="Seconds to wait for the "
                                            "master and every node.")),
    "average_every": (int, typer.Option(1, "--average-every", min=1, help="1: sum gradients every step (exact). "
                                        "K > 1: local steps, weights averaged every K steps (for slow links).")),
    "compress_rank": (int, typer.Option(0, "--compress-rank", min=0, help="0: whole gradients. R > 0: PowerSGD "
                                        "rank-R approximations with error feedback (for slow links).")),
    "compress_after": (int, typer.Option(0, "--compress-after", min=0, help="With --compress-rank: the first N "
                                         "steps sum whole gradients, PowerSGD from then on (early gradients "
                                         "compress worst).")),
    "local_batch_norm": (bool, typer.Option(False, "--local-batch-norm", help="Each node's BatchNorm normalises "
                                            "over its own slice (no collective; ghost batches) instead of the "
                                            "global batch (the default, as one node training on the whole batch "
                                            "would).")),
    "outer_lr": (float, typer.Option(1.0, "--outer-lr", min=0.0, help="With --average-every K > 1: DiLoCo's outer "
                                     "step, SGD on the averaged weights' move at this rate (1 with --outer-momentum "
                                     "0: plain averaging; the paper: 0.7).")),
    "outer_momentum": (float, typer.Option(0.0, "--outer-momentum", min=0.0, max=0.999, help="The outer step's "
                                           "Nesterov momentum (the paper: 0.9).")),
    "wire": (str, typer.Option("float32", "--wire", help="How whole gradients cross the links: float32 (as they "
                               "are, after the backward), float16 or bfloat16 (half the bytes, each bucket sent "
                               "while the backward computes the rest; for slow links).")),
}
LINK_KEYWORDS = {"connect_timeout": "connect_timeout_s", "wire": "wire_dtype"}


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """The shared options' values: ``training`` TrainConfig's keywords, ``links`` ClusterOptions' and LocalOptions'."""

    training: dict[str, Any]
    links: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return Path(self.training["run_dir"])

    def config(self) -> Any:
        """The run's TrainConfig; imports torch, so only after :func:`_quiet_c10d`."""
        from ..train import TrainConfig

        return TrainConfig(**self.training)


def with_shared_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command(settings, **own)`` as a typer command whose options are the shared ones, then its own.

    typer reads a command's options from its signature, so the wrapper's signature lists both; the
    shared values reach ``command`` as one :class:`ClusterSettings`.
    """
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
              for name, (annotation, option) in (*TRAINING_OPTIONS.items(), *LINK_OPTIONS.items())]
    own = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for parameter in list(inspect.signature(command, eval_str=True).parameters.values())[1:]]

    @functools.wraps(command)
    def wrapper(**values: Any) -> None:
        _quiet_c10d()   # before a factory's arguments are read, which imports torch
        training = {name: values.pop(name) for name in TRAINING_OPTIONS}
        training["model"] = model_name(training["model"], training.pop("model_args"))
        links = {LINK_KEYWORDS.get(name, name): values.pop(name) for name in LINK_OPTIONS}
        command(ClusterSettings(training, links), **values)

    wrapper.__signature__ = inspect.Signature([*shared, *own])  # type: ignore[attr-defined]
    return wrapper


def _quiet_c10d() -> None:
    """Before torch is imported: quiet c10d's C++ log, whose multi-line socket errors would drown the one-line
    message (set ``TORCH_CPP_LOG_LEVEL=INFO`` to see them)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


@cluster_app.command("run")
@clean_errors
@with_shared_options
def run_command(settings: ClusterSettings,
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
    from ..distributed import ClusterEnv, ClusterError, ClusterOptions, NodeSpec, train_node
    from ..distributed.group import end_refused_node

    config = settings.config()
    env = ClusterEnv.from_environ()
    try:
        summary = train_node(config, NodeSpec(device, memory, rate), env,
                             ClusterOptions(timeout_s=timeout, **settings.links))
    except ClusterError as exc:  # a refusal every node shares: its one line, then the node ends at once
        error(str(exc))
        end_refused_node(2)
    if summary is not None:
        console.print(f"{summary.steps} steps on {env.world_size} nodes in {summary.wall_time_s:.1f} s; "
                      f"metrics: {settings.run_dir / 'metrics.jsonl'}")


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
    from ..distributed.supervisor import Fault

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
@with_shared_options
def local_command(settings: ClusterSettings,
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
    from ..distributed import NodeSpec
    from ..distributed.supervisor import LocalOptions, run_local

    config = settings.config()
    specs = [NodeSpec(d, m, r) for d, m, r in zip(_per_node("--device", device, nodes),
                                                   _per_node("--memory", memory, nodes), rates, strict=True)]
    options = LocalOptions(heartbeat_timeout_s=heartbeat_timeout, timeout_s=timeout, rejoin_after_steps=rejoin_after,
                           faults=_faults(kill, stop, cut), preset=preset if netns else None,
                           cpus_per_node=cpus_per_node, **settings.links)
    report = run_local(config, specs, options)
    console.print(to_json(report, indent=2))
    console.print(f"{nodes} nodes ({report['emulation']}), {report['restarts']} restart(s); metrics: "
                  f"{settings.run_dir / 'metrics.jsonl'}, cluster report: {settings.run_dir / 'cluster.json'}")
