"""What the cluster benchmark's tables share: the options several of them read, their runs' configuration and
readings, the rows a mode name stands for, and the figures' text."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from edgetrain.bench.stats import Spread, spread
from edgetrain.distributed.node import NodeSpec
from edgetrain.distributed.supervisor import LOG_DIR, LocalOptions, run_local
from edgetrain.sysutil.fileio import read_jsonl
from edgetrain.train import TrainConfig

log = logging.getLogger("cluster")
WARM_UP_STEPS = 1  # the first step brings up caches and connections: not timed
PLAIN = (1.0, 0.0)  # outer rate and momentum of plain averaging (NOTE [ Outer step ])
# a node's quota is a core or less: more intra-op threads only contend with the other nodes and the spares
NODE_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "FATAL"}


@contextlib.contextmanager
def node_environment() -> Iterator[None]:
    """Node processes started inside at one intra-op thread and without torch's C++ log lines; the environment
    restored after."""
    given = {name: os.environ.get(name) for name in NODE_ENVIRONMENT}
    os.environ.update(NODE_ENVIRONMENT)
    try:
        yield
    finally:
        for name, value in given.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def int_list(text: str) -> list[int]:
    """A comma-separated option's numbers."""
    return [int(v) for v in text.split(",")]


def name_list(text: str) -> list[str]:
    """A comma-separated option's names."""
    return text.split(",")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options more than one table reads, declared here once: the runs' model and sizes, the rows a mode name
    stands for (:func:`mode`), the repeats, BatchNorm's groups and the window a final training loss is the mean of."""
    parser.add_argument("--nodes", type=int_list, default=[1, 2])
    parser.add_argument("--presets", type=name_list, default=["100mbit"],
                        help="'none' (compression table only): plain local processes")
    parser.add_argument("--batches", type=int_list, default=[8])
    parser.add_argument("--model", default="resnet18_cifar")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--average-every", type=int, default=4)
    parser.add_argument("--compress-rank", type=int, default=2)
    parser.add_argument("--compress-after", type=int, default=0,
                        help="PowerSGD runs sum whole gradients for their first N steps (--compress-after)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="the DiLoCo mode's outer rate")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="the DiLoCo mode's outer Nesterov momentum")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per point, each table's times given as median, IQR and CoV over them: scaling "
                        "points, failure kinds, link probes; compression and time to target: seeds 0 .. R-1 "
                        "(time to target: from --ttt-seed)")
    parser.add_argument("--local-batch-norm", action="store_true",
                        help="scaling, time to target, compression: each node's BatchNorm over its own slice (no "
                        "collective) rather than cross-node BatchNorm (NOTE [ Cross-node BatchNorm ])")
    parser.add_argument("--ttt-window", type=int, default=5, help="steps the loss is averaged over (time to target; "
                        "compression: its last steps' training loss)")


def run_config(run_dir: Path, model: str, batch: int, steps: int, image: int, epochs: int = 1) -> TrainConfig:
    """``epochs`` epochs of exactly ``steps`` global batches each (the split keeps 80% for training)."""
    samples = -(-batch * steps * 5 // 4) + batch  # the split rounds the validation share up
    return TrainConfig(model=model, samples=samples, batch=batch, image=image, epochs=epochs, save_every=10**6,
                       run_dir=run_dir)


def metric_records(run_dir: Path, key: str) -> list[dict[str, Any]]:
    """The run's metrics records that hold ``key`` (``loss``: its steps; ``val_loss``: its evaluations), in order."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if key in r]


def step_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's step records, in order: each step's loss, step and sync time and wall time."""
    return metric_records(run_dir, "loss")


def run_nodes(config: TrainConfig, nodes: int, options: LocalOptions) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``cluster local`` of ``nodes`` nodes on ``config``: its step records and the supervisor's report."""
    report = run_local(config, [NodeSpec()] * nodes, options)
    return step_records(config.run_dir), report


def keep_logs(run_dir: Path, kept: Path) -> Path:
    """Copy a crashed run's node logs out of the scratch folder (removed at the end) to ``kept`` (none when no node
    started)."""
    if (run_dir / LOG_DIR).exists():
        shutil.copytree(run_dir / LOG_DIR, kept, dirs_exist_ok=True)
    return kept


def spread_of(values: Sequence[float | None]) -> dict[str, Any] | None:
    """:func:`edgetrain.bench.stats.spread` of the values that are not None, as a dict; None when none are."""
    kept = [v for v in values if v is not None]
    return spread(kept).to_dict() if kept else None


def spread_text(value: dict[str, Any] | None, fmt: str = "{:.3g}") -> str:
    """'median (IQR x, CoV y%, n=k)' of a :func:`spread_of` dict; '-' for None."""
    if value is None:
        return "-"
    return Spread.from_dict(value).text(fmt)


def step_medians(steps: list[dict[str, Any]]) -> dict[str, float]:
    """One run's median step time, sync time and sync share, the warm-up steps left out."""
    timed = steps[WARM_UP_STEPS:]
    return {"step_s": statistics.median(r["time_s"] for r in timed),
            "mean_step_s": statistics.mean(r["time_s"] for r in timed),
            "sync_s": statistics.median(r["sync_s"] for r in timed),
            "sync_share": statistics.median(r["sync_s"] / r["time_s"] for r in timed)}


class Mode(NamedTuple):
    """One row's training: its label, nodes, averaging period, PowerSGD rank (0: whole gradients) and exact steps
    before it, and the outer step's rate and momentum (:data:`PLAIN`: plain averaging)."""

    label: str
    nodes: int
    every: int = 1
    rank: int = 0
    after: int = 0
    outer: tuple[float, float] = PLAIN
    wire: str = "float32"

    def options(self, **given: Any) -> LocalOptions:
        return LocalOptions(average_every=self.every, compress_rank=self.rank, compress_after=self.after,
                            outer_lr=self.outer[0], outer_momentum=self.outer[1], wire_dtype=self.wire, spares=False,
                            **given)


MODE_NAMES = "single, exact, fp16, bf16, powersgd[:RANK[:AFTER]], average, diloco"


def mode(name: str, args: argparse.Namespace, nodes: int) -> Mode:
    """The row a name on the command line stands for: ``single`` (1 node), ``exact`` (whole gradients summed every
    step), ``fp16`` and ``bf16`` (whole gradients summed in that precision, overlapped with the backward: NOTE
    [ Half-precision buckets overlapped with the backward ]), ``powersgd`` (rank ``--compress-rank`` after
    ``--compress-after`` exact steps; ``powersgd:R`` and ``powersgd:R:A`` give the rank and the exact steps),
    ``average`` (weights averaged every ``--average-every`` steps), ``diloco`` (the same with the outer step of
    ``--outer-lr`` and ``--outer-momentum``)."""
    every, outer = args.average_every, (args.outer_lr, args.outer_momentum)
    fixed = {"single": Mode("single node", 1), "exact": Mode("all-reduce every step", nodes),
             "fp16": Mode("float16 all-reduce, overlapped", nodes, wire="float16"),
             "bf16": Mode("bfloat16 all-reduce, overlapped", nodes, wire="bfloat16"),
             "average": Mode(f"average every {every} steps", nodes, every),
             "diloco": Mode(f"DiLoCo every {every} steps, outer lr {outer[0]:g}, Nesterov {outer[1]:g}", nodes,
                            every, outer=outer)}
    if name in fixed:
        return fixed[name]
    kind, *numbers = name.split(":")
    if kind != "powersgd" or len(numbers) > 2 or not all(n.isdigit() and int(n) >= (i == 0) for i, n in
                                                        enumerate(numbers)):
        raise SystemExit(f"unknown mode {name!r}: one of {MODE_NAMES} (RANK >= 1, AFTER >= 0)")
    rank = int(numbers[0]) if numbers else args.compress_rank
    after = int(numbers[1]) if len(numbers) == 2 else args.compress_after
    return Mode(f"PowerSGD rank {rank}" + (f" after {after} exact steps" if after else ""), nodes, 1, rank, after)


def run_name(table: str, row: Mode, seed: int) -> str:
    """A run's folder: every setting that tells two of a table's rows apart, and the seed."""
    return f"{table}-{row.nodes}-{row.every}-{row.rank}-{row.after}-{row.outer[0]:g}-{row.outer[1]:g}-{row.wire}-{seed}"


def cell(value: Any, spec: str = ".3g") -> str:
    """A table cell: '-' for None, a float in ``spec``, anything else as it prints."""
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def per_run(values: list[Any]) -> str:
    """The runs' values: one when all are equal, else each in run order ('-': none)."""
    shown = ["-" if v is None else str(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else ", ".join(shown)


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as ``uptime`` shows them."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())
