"""Data-parallel training across emulated edge nodes: scaling, periodic averaging for slow links, failures survived.

Tables from ``edgetrain cluster local`` runs on this machine; every time they print is the
median over ``--repeats`` runs with its IQR and CoV (:func:`edgetrain.bench.stats.spread`):

* **link**: what an emulated link delivers between two nodes: one-byte TCP round trips (spread over
  every ping of every probe) and bulk TCP throughput (spread over the probes), the switch's counters.
* **scaling**: throughput of ResNet-18 with the CIFAR stem on CIFAR-10-shaped synthetic data
  (32 px, 10 classes) per number of nodes x network preset x global batch, with the share of
  each step spent in the all-reduces (``sync_s / time_s``, which includes waiting for the
  slowest node). Every node gets the same CPU quota whatever the node count (``cores / max
  nodes``), so a node is a fixed-size board and N nodes have N times the compute. Each run gives
  its median step (the warm-up left out); the table gives the spread of those over the runs.
* **ttt**: time to a target training loss, one node against N (exact, PowerSGD, periodic
  averaging, DiLoCo's outer step on it: NOTE [ Outer step ]), once per seed, each seed's target
  from its own single-node run (``--ttt-modes`` picks the rows).
* **compression**: single-node training (the reference), then exact data parallelism (gradients
  summed every step: the same maths, so its distance from the reference is the noise floor), then
  ``--compress-modes``: PowerSGD rank R with error feedback after A exact steps (NOTE [ PowerSGD on
  plain all-reduces ]), periodic weight averaging every K steps (NOTE [ Periodic averaging ]) and
  DiLoCo, on the slowest link: the held-out loss after every epoch and the final one against the
  reference's and the exact run's, seed by seed (mean, standard error, largest), numbers sent per
  step, training loss of the last steps, and crashes over the runs (one seed each).
* **failures**: a node killed (SIGKILL), stopped (SIGSTOP) and, as root, cut off (its link
  taken down, ``--failure-preset``) on 3 nodes at step 4 or later, once the warm spares are ready
  (NOTE [ Warm spares ]): detection time, restarts, steps lost and repeated, stall, and the longest
  heartbeat gap of a healthy node (the margin of the heartbeat timeout against a false alarm).
* **crashes**: ``--crash-runs`` runs of 2 local processes training a tiny CNN with PowerSGD
  through the cluster step (a crash: any exception, or the nodes' weights differing).
* **node-crashes**: ``--node-crash-runs`` whole-node runs of ``cluster local`` per ``--node-crash-after``
  value (the supervisor, ``--node-crash-nodes`` node processes, cross-node BatchNorm, PowerSGD rank
  ``--compress-rank`` after that many exact steps), seeds 0 .. N-1; a crash: a node killed by a
  signal, any restart or exception, or the nodes' final weights differing (each node logs its weights' digest).
  The default model, ResNet-18 with ImageNet's stem at 32 px, has the CIFAR ResNet-18's layers and so
  its collectives (the same BatchNorm layers, the same PowerSGD matrices but the stem's), at a fraction
  of the compute.
* **save**: ``--saves`` durable saves of the model's training state (what rank 0 pays every
  ``--save-every`` steps).

Repeats go in rounds over a table's points (all points once, then again), so a change in the
machine's load spreads over every point. Spares are off in the scaling and compression runs (no
failure is expected there).

As root, nodes run in network namespaces with tc-shaped links and cgroup CPU quotas (NOTE [ What
the emulation is ]); otherwise as plain processes, which the output says. Writes JSON (``--out``,
every run's figures too) and a markdown table (``--md``), and prints the markdown.

Usage: ``python benchmarks/cluster.py [--nodes 1,2,4] [--presets gigabit,100mbit,wifi20] [--batches 8,32]
[--steps N] [--average-every K] [--outer-lr L] [--outer-momentum M] [--ttt-modes single,...] [--compress-rank R]
[--compress-after N] [--compress-steps N] [--compress-epochs E] [--compress-modes powersgd:8:10,average,...]
[--compress-seed S] [--lr-schedule constant|cosine]
[--repeats R]
[--failures kill,stop,cut] [--failure-preset gigabit|wifi20] [--crash-runs N] [--saves N] [--local-batch-norm]
[--node-crash-runs N] [--node-crash-model M] [--node-crash-nodes N] [--node-crash-batch B] [--node-crash-steps S]
[--node-crash-after A,B] [--tables link,scaling,ttt,compression,failures,crashes,node-crashes,save] [--out PATH]
[--md PATH] [--keep-runs DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from edgetrain.bench.stats import Spread, equivalence, rerun_command, spread
from edgetrain.distributed.compress import PowerSGD
from edgetrain.distributed.local import LOG_DIR, Fault, LocalOptions, run_local
from edgetrain.distributed.netns import PRESETS, LinkPreset, NetworkEmulation, can_emulate
from edgetrain.distributed.node import NodeSpec
from edgetrain.models import get_model_spec
from edgetrain.sysutil.fileio import read_jsonl
from edgetrain.train import TrainConfig

log = logging.getLogger("cluster")
WARM_UP_STEPS = 1  # the first step brings up caches and connections: not timed
PLAIN = (1.0, 0.0)  # outer rate and momentum of plain averaging (NOTE [ Outer step ])


def _config(run_dir: Path, model: str, batch: int, steps: int, image: int, epochs: int = 1) -> TrainConfig:
    """``epochs`` epochs of exactly ``steps`` global batches each (the split keeps 80% for training)."""
    samples = -(-batch * steps * 5 // 4) + batch  # the split rounds the validation share up
    return TrainConfig(model=model, samples=samples, batch=batch, image=image, epochs=epochs, save_every=10**6,
                       run_dir=run_dir)


def _records(run_dir: Path, key: str) -> list[dict[str, Any]]:
    """The run's metrics records that hold ``key`` (``loss``: its steps; ``val_loss``: its evaluations), in order."""
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if key in r]


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return _records(run_dir, "loss")


def _run(config: TrainConfig, nodes: int, options: LocalOptions) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    report = run_local(config, [NodeSpec()] * nodes, options)
    return _steps(config.run_dir), report


def _keep_logs(run_dir: Path, kept: Path) -> Path:
    """Copy a crashed run's node logs out of the scratch folder (removed at the end) to ``kept`` (none when no node
    started)."""
    if (run_dir / LOG_DIR).exists():
        shutil.copytree(run_dir / LOG_DIR, kept, dirs_exist_ok=True)
    return kept


def _spread(values: list[float | None]) -> dict[str, Any] | None:
    """:func:`edgetrain.bench.stats.spread` of the values that are not None, as a dict; None when none are."""
    kept = [v for v in values if v is not None]
    return spread(kept).to_dict() if kept else None


def _spread_text(value: dict[str, Any] | None, fmt: str = "{:.3g}") -> str:
    """'median (IQR x, CoV y%, n=k)' of a :func:`_spread` dict; '-' for None."""
    if value is None:
        return "-"
    return Spread(value["n"], value["median"], value["q1"], value["q3"], value["cov_pct"]).text(fmt)


def _step_medians(steps: list[dict[str, Any]]) -> dict[str, float]:
    """One run's median step time, sync time and sync share, the warm-up steps left out."""
    timed = steps[WARM_UP_STEPS:]
    return {"step_s": statistics.median(r["time_s"] for r in timed),
            "mean_step_s": statistics.mean(r["time_s"] for r in timed),
            "sync_s": statistics.median(r["sync_s"] for r in timed),
            "sync_share": statistics.median(r["sync_s"] / r["time_s"] for r in timed)}


def scaling(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Per point (preset x batch x nodes), ``--repeats`` runs, each giving its median step time and sync share;
    the row holds their spread over the runs. The repeats are rounds over all points, so a change of the machine's
    load during the benchmark spreads over every point instead of biasing some."""
    points = [(preset, batch, nodes) for preset in args.presets for batch in args.batches for nodes in args.nodes]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {point: [] for point in points}
    for repeat in range(args.repeats):
        for preset, batch, nodes in points:
            config = _config(scratch / f"scale-{preset}-{batch}-{nodes}-{repeat}", args.model, batch, args.steps,
                             args.image)
            steps, report = _run(config, nodes, LocalOptions(preset=preset, cpus_per_node=cpus, spares=False,
                                                             local_batch_norm=args.local_batch_norm))
            runs[(preset, batch, nodes)].append({**_step_medians(steps), "restarts": report["restarts"],
                                                 "steps_timed": len(steps) - WARM_UP_STEPS, "load": _load(),
                                                 "emulation": report["emulation"]})
            log.info("scaling %s %s %s round %d: %s", preset, batch, nodes, repeat, runs[(preset, batch, nodes)][-1])
    rows = [_scaling_row(preset, batch, nodes, runs[(preset, batch, nodes)]) for preset, batch, nodes in points]
    for row in rows:
        single = next((r for r in rows if r["nodes"] == 1 and r["preset"] == row["preset"]
                       and r["batch"] == row["batch"]), None)
        row["speedup"] = None if single is None else row["samples_per_s"] / single["samples_per_s"]
        row["efficiency"] = None if row["speedup"] is None else row["speedup"] / row["nodes"]
    return rows


def _scaling_row(preset: str, batch: int, nodes: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One scaling point from its runs: throughput from the median over the runs of their median step."""
    step = _spread([r["step_s"] for r in runs])
    assert step is not None
    return {"nodes": nodes, "preset": preset, "batch": batch, "step_s": step["median"], "step_spread_s": step,
            "samples_per_s": batch / step["median"], "sync_share": statistics.median(r["sync_share"] for r in runs),
            "sync_share_spread": _spread([r["sync_share"] for r in runs]), "restarts": sum(r["restarts"] for r in runs),
            "steps_timed": runs[0]["steps_timed"], "repeats": len(runs), "runs": runs,
            "emulation": runs[0]["emulation"]}


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


def numbers_per_step(model: str, row: Mode, classes: int = 10) -> float:
    """Numbers (float32) a node sends into the all-reduces per step once compression is on: whole gradients, PowerSGD's
    ``P`` and ``Q`` with the tensors it sums whole, or the weights once every ``every`` steps (BatchNorm's per-channel
    statistics, a few thousand numbers per layer, not counted); 0 for one node."""
    if row.nodes == 1:
        return 0.0
    parameters = [p for p in get_model_spec(model).build(classes).parameters() if p.requires_grad]
    if row.rank:
        return float(PowerSGD(parameters, row.rank).sent_numbers)
    half = 0.5 if row.wire != "float32" else 1.0  # a float16 number is half a float32's bytes
    return half * sum(p.numel() for p in parameters) / row.every


def compression(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Single-node training (the reference), then ``--nodes``' largest count of nodes summing whole gradients, then
    the ``--compress-modes`` rows (PowerSGD, periodic averaging, DiLoCo), on the slowest preset (``none``: plain
    processes), each for ``--compress-epochs`` epochs of ``--compress-steps`` steps, once per seed
    ``--compress-seed .. + --repeats - 1`` (a seed: the data, its held-out split, the initial weights and the order).
    Rank 0 evaluates the held-out split after every epoch (the curve shows whether the loss has flattened); the final
    one is compared seed by seed with the single node's and the exact all-reduce's: mean, standard error over the
    seeds, largest. The exact run *is* single-node training with BatchNorm over the global batch (NOTE [ Cross-node
    BatchNorm ]), only summed in another order, so its distance from the single node is the protocol's noise floor:
    float32 rounding, which training amplifies."""
    nodes = max(args.nodes)
    modes = [mode("single", args, 1), mode("exact", args, nodes)] + [mode(n, args, nodes) for n in args.compress_modes]
    seeds = range(args.compress_seed, args.compress_seed + args.repeats)
    rows = [_compression_row(args, row, [_compression_run(args, scratch, row, seed, cpus) for seed in seeds])
            for row in modes]
    for row in rows:
        for key, losses in (("vs", "final_losses"), ("val_vs", "val_losses")):
            row[f"{key}_single"] = _relative(row[losses], rows[0][losses])
            row[f"{key}_exact"] = _relative(row[losses], rows[1][losses])
    return rows


def _compression_run(args: argparse.Namespace, scratch: Path, row: Mode, seed: int,
                     cpus: float) -> dict[str, Any] | None:
    """One seed's run of a row: its step times, last steps' training loss and the held-out loss after every epoch;
    None when it crashed (its node logs kept beside ``--out``)."""
    preset = args.presets[-1]
    config = replace(_config(scratch / _run_name("compress", row, seed), args.model, args.batches[0],
                             args.compress_steps, args.image, args.compress_epochs),
                     seed=seed, lr_schedule=args.lr_schedule)
    load = _load()
    try:
        steps, report = _run(config, row.nodes, row.options(preset=None if preset == "none" else preset,
                                                            cpus_per_node=cpus, max_restarts=0,
                                                            local_batch_norm=args.local_batch_norm))
    except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
        kept = _keep_logs(config.run_dir, args.out.parent / "crash-logs" / config.run_dir.name)
        log.warning("compression run crashed: %s (node logs: %s)", exc, kept)
        return None
    evaluations = _records(config.run_dir, "val_loss")
    log.info("compression %s, seed %d: held-out loss after each epoch %s", row.label, seed,
             [round(r["val_loss"], 4) for r in evaluations])
    return {**_step_medians(steps), "restarts": report["restarts"], "load_before": load, "load_after": _load(),
            "final_loss": statistics.mean(r["loss"] for r in steps[-args.ttt_window:]),
            "val_loss": evaluations[-1]["val_loss"], "val_curve": [r["val_loss"] for r in evaluations],
            "val_steps": [r["step"] for r in evaluations], "emulation": report["emulation"]}


def _compression_row(args: argparse.Namespace, row: Mode, runs: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One row over its seeds (a crashed seed: None in the per-seed lists); the held-out curve is the mean over the
    seeds that finished."""
    done = [r for r in runs if r is not None]
    curves = [r["val_curve"] for r in done]
    return {"mode": row.label, "average_every": row.every, "compress_rank": row.rank, "compress_after": row.after,
            "outer_lr": row.outer[0], "outer_momentum": row.outer[1], "nodes": row.nodes, "preset": args.presets[-1],
            "batch": args.batches[0], "epochs": args.compress_epochs, "lr_schedule": args.lr_schedule,
            "first_seed": args.compress_seed,
            "steps": args.compress_steps * args.compress_epochs, "runs": len(runs),
            "crashes": len(runs) - len(done), "restarts": sum(r["restarts"] for r in done), "window": args.ttt_window,
            "numbers_per_step": numbers_per_step(args.model, row),
            "step_spread_s": _spread([r["step_s"] for r in done]),
            "final_losses": [None if r is None else r["final_loss"] for r in runs],
            "final_loss": statistics.mean(r["final_loss"] for r in done) if done else None,
            "val_losses": [None if r is None else r["val_loss"] for r in runs],
            "val_loss": statistics.mean(r["val_loss"] for r in done) if done else None,
            "val_curve": [statistics.mean(c) for c in zip(*curves, strict=True)],
            "val_steps": done[0]["val_steps"] if done else [], "seed_runs": runs,
            "emulation": done[0]["emulation"] if done else "plain processes"}


def _relative(losses: list[float | None], reference: list[float | None]) -> dict[str, float | None] | None:
    """Seed by seed ``loss / reference - 1``: the mean, its standard error over the seeds (None for one seed) and
    the largest in size; None unless every seed has both."""
    pairs = [(a, b) for a, b in zip(losses, reference, strict=True) if a is not None and b is not None]
    if not pairs or len(pairs) < len(losses):
        return None
    ratios = [a / b - 1 for a, b in pairs]
    error = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None
    return {"mean": statistics.mean(ratios), "se": error, "largest": max(ratios, key=abs)}


def _smoothed(losses: list[float], window: int) -> list[float]:
    """The mean of each step's loss and the ``window - 1`` before it (fewer at the start)."""
    return [statistics.mean(losses[max(0, i + 1 - window):i + 1]) for i in range(len(losses))]


def _time_to(run: dict[str, Any], target: float, window: int) -> tuple[float | None, int | None]:
    """Seconds from the start of step 1 to the end of the first step whose smoothed loss is at most ``target``
    (training only: joining, profiling and planning come before step 1), and that step; None when never."""
    for step, (wall_time, loss) in enumerate(zip(run["wall_times"], _smoothed(run["losses"], window), strict=True)):
        if loss <= target:
            return wall_time - run["started_at"], step + 1
    return None, None


def _started_at(run: dict[str, Any]) -> float:
    """The wall time step 1 of a time-to-target run started at. An older result file does not record it; a run
    of its that reached its target gives it back from its time and step to that target."""
    if "started_at" in run:
        return float(run["started_at"])
    if run.get("steps_to_target") is None:
        raise SystemExit(f"--ttt-read: {run['mode']}, seed {run['seed']}: no start time (an older result's run that "
                         "never reached its target)")
    return float(run["wall_times"][run["steps_to_target"] - 1] - run["time_to_target_s"])


def _averaged_loss(losses: list[float], every: int, window: int) -> float | None:
    """With periodic averaging, the mean loss of the last ``window`` steps that began on just-averaged weights
    (steps ``k·every + 1``): the averaged model's loss on a fresh batch, where the other steps' losses are the
    nodes' drifted local models'. None for exact steps."""
    after = losses[every::every]
    return statistics.mean(after[-window:]) if every > 1 and after else None


def time_to_target(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Time to a target training loss (the module docstring's **ttt**): one node, then ``--ttt-nodes`` nodes summing
    whole gradients, PowerSGD and periodic averaging, every node (the single one too) at the same CPU quota; once
    per seed ``--ttt-seed .. + --repeats - 1``, each seed's target taken from its own single-node run. A run of the
    same settings in a ``--ttt-read`` result is taken from there, not run again."""
    if args.ttt_modes[0] != "single":
        raise SystemExit(f"--ttt-modes: 'single' first (it sets the targets), then any of {MODE_NAMES}")
    modes = [mode(name, args, args.ttt_nodes) for name in args.ttt_modes]
    done = _read_ttt_runs(args)
    seeds = [_ttt_seed_runs(args, scratch, modes, args.ttt_seed + repeat, done) for repeat in range(args.repeats)]
    rows = [_ttt_row(args, [runs[i] for runs in seeds]) for i in range(len(modes))]
    for row in rows[1:]:
        row["final_vs_single"] = _final_versus_single(row["runs"], rows[0]["runs"], args.margin)
    return rows


def _final_versus_single(runs: list[dict[str, Any]], single: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """Seed by seed, a mode's final loss (the last ``--ttt-window`` steps' mean) over the single node's minus 1,
    and whether they are within ±``margin`` (:func:`~edgetrain.bench.stats.equivalence`)."""
    differences = [run["final_loss"] / reference["final_loss"] - 1 for run, reference in zip(runs, single, strict=True)]
    return {**equivalence(differences, margin), "differences": differences}


def _read_ttt_runs(args: argparse.Namespace) -> dict[tuple[str, int], dict[str, Any]]:
    """The time-to-target runs of the ``--ttt-read`` results whose model, image, BatchNorm and row settings are
    this call's, by mode and seed."""
    wanted = {"preset": args.ttt_preset, "weak": args.ttt_weak, "cpus_per_node": _ttt_quota(args),
              "window": args.ttt_window, "target_at": args.ttt_target_at, "steps": args.ttt_steps}
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for path in args.ttt_read:
        result = json.loads(path.read_text())
        given = _command_options(result["command"])
        if (given.get("model"), given.get("image"), result.get("local_batch_norm")) != (
                args.model, str(args.image), args.local_batch_norm):
            continue
        for row in result.get("ttt", []):
            scale = row["nodes"] if args.ttt_weak else 1
            if all(row[key] == value for key, value in wanted.items()) and row["batch"] == args.ttt_batch * scale:
                runs.update({(run["mode"], run["seed"]): run for run in row["runs"]})
    return runs


def _command_options(command: str) -> dict[str, str | None]:
    """``--name value`` and bare ``--flag`` of a recorded command line, by name."""
    words = command.split()
    return {word[2:]: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None)
            for i, word in enumerate(words) if word.startswith("--")}


def _ttt_seed_runs(args: argparse.Namespace, scratch: Path, modes: list[Mode], seed: int,
                   done: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every mode's run with one seed (from ``done`` when there), with its time and steps to the seed's target and
    its efficiency."""
    steps, window = args.ttt_steps, args.ttt_window
    runs: list[dict[str, Any]] = []
    target_step = max(1, round(steps * args.ttt_target_at))  # the others get the rest of the steps as slack
    for row in modes:
        if (row.label, seed) in done:
            log.info("time to target: %s, seed %d: read from --ttt-read", row.label, seed)
            runs.append(dict(done[row.label, seed]))
        else:
            runs.append(_ttt_run(args, scratch, row, seed))
        target = _smoothed(runs[0]["losses"], window)[target_step - 1]  # the single node's run comes first
        runs[-1]["started_at"] = _started_at(runs[-1])
        runs[-1]["target_loss"] = target
        runs[-1]["time_to_target_s"], runs[-1]["steps_to_target"] = _time_to(runs[-1], target, window)
    reference = runs[0]["time_to_target_s"]
    for run in runs:
        t = run["time_to_target_s"]
        run["efficiency"] = None if t is None or reference is None else reference / (run["nodes"] * t)
    return runs


def _ttt_run(args: argparse.Namespace, scratch: Path, row: Mode, seed: int) -> dict[str, Any]:
    """One time-to-target run and what the table reads of it."""
    batch, window = args.ttt_batch, args.ttt_window
    # weak scaling: each node keeps the single node's batch (and BatchNorm groups), the rate grows with the
    # global batch (the linear scaling rule, Goyal et al. 2017, without warm-up)
    scale = row.nodes if args.ttt_weak else 1
    config = _config(scratch / _run_name("ttt", row, seed), args.model, batch * scale, args.ttt_steps, args.image)
    config = replace(config, seed=seed, lr=config.learning_rate() * scale)
    load = _load()
    trained, report = _run(config, row.nodes, row.options(preset=args.ttt_preset, cpus_per_node=_ttt_quota(args),
                                                          local_batch_norm=args.local_batch_norm))
    log.info("time to target: %s, seed %d, %d steps, restarts %d", row.label, seed, len(trained), report["restarts"])
    return {"mode": row.label, "nodes": row.nodes, "seed": seed, "batch": batch * scale,
            "cpus_per_node": _ttt_quota(args), "steps": len(trained),
            "final_loss": _smoothed([r["loss"] for r in trained], window)[-1],
            "averaged_loss": _averaged_loss([r["loss"] for r in trained], row.every, window),
            **_step_medians(trained), "restarts": report["restarts"], "load_before": load,
            "losses": [r["loss"] for r in trained], "wall_times": [r["wall_time"] for r in trained],
            "started_at": trained[0]["wall_time"] - trained[0]["time_s"], "emulation": report["emulation"]}


def _ttt_quota(args: argparse.Namespace) -> float:
    """Every time-to-target node's CPU quota, the single one's too: the machine's cores shared by ``--ttt-nodes``."""
    return (os.cpu_count() or 1) / args.ttt_nodes


def _run_name(table: str, row: Mode, seed: int) -> str:
    """A run's folder: every setting that tells two of a table's rows apart, and the seed."""
    return f"{table}-{row.nodes}-{row.every}-{row.rank}-{row.after}-{row.outer[0]:g}-{row.outer[1]:g}-{row.wire}-{seed}"


def _ttt_row(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode over the seeds: time to target and efficiency over the seeds that reached it, step and sync time
    (each run's median) over all seeds."""
    first = runs[0]
    return {"mode": first["mode"], "nodes": first["nodes"], "preset": args.ttt_preset, "batch": first["batch"],
            "weak": args.ttt_weak, "cpus_per_node": first["cpus_per_node"], "window": args.ttt_window,
            "target_at": args.ttt_target_at, "seeds": [r["seed"] for r in runs],
            "target_losses": [r["target_loss"] for r in runs], "reached": sum(r["time_to_target_s"] is not None
                                                                              for r in runs),
            "time_to_target_s": _spread([r["time_to_target_s"] for r in runs]),
            "efficiency": _spread([r["efficiency"] for r in runs]),
            "steps_to_target": [r["steps_to_target"] for r in runs],
            "step_s": _spread([r["step_s"] for r in runs]), "sync_s": _spread([r["sync_s"] for r in runs]),
            "mean_step_s": _spread([r["mean_step_s"] for r in runs]),
            "final_loss": statistics.mean(r["final_loss"] for r in runs), "steps": first["steps"],
            "averaged_loss": None if first["averaged_loss"] is None else statistics.mean(r["averaged_loss"]
                                                                                        for r in runs),
            "restarts": sum(r["restarts"] for r in runs), "load_before": [r["load_before"] for r in runs],
            "runs": runs, "emulation": first["emulation"]}


def failures(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """3 nodes of the small token model (seconds per run), one failure each, ``--repeats`` rounds over the kinds;
    plain processes except for a cut (``--failure-preset``: gigabit veth links, or wifi20 through the switch)."""
    skipped = {kind: f"needs the network emulation: {can_emulate()}" for kind in args.failures
               if kind == "cut" and can_emulate() is not None}
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in args.failures if kind not in skipped}
    for repeat in range(args.repeats):
        for kind in runs:
            runs[kind].append(_failure_run(args, scratch / f"failure-{kind}-{repeat}", kind, cpus))
            log.info("failure %s round %d: %s", kind, repeat, runs[kind][-1])
    return [{"kind": kind, "skipped": reason} if (reason := skipped.get(kind)) else _failure_row(kind, runs[kind])
            for kind in args.failures]


def _failure_run(args: argparse.Namespace, run_dir: Path, kind: str, cpus: float) -> dict[str, Any]:
    """One run of 3 nodes with a fault on node 1 at step 4 or later, once the warm spares are ready (NOTE [ Warm
    spares ]); on a saturated machine the idle-priority spares may not be ready before the run ends: then no fault
    is injected and the run says so (``injected``)."""
    config = TrainConfig(model="transformer_small", samples=args.failure_samples, batch=6, image=16, epochs=1,
                         save_every=1, run_dir=run_dir)
    started, load = time.time(), _load()
    options = LocalOptions(faults=(Fault(1, 4, kind),), preset=args.failure_preset if kind == "cut" else None,
                           cpus_per_node=cpus)
    report = run_local(config, [NodeSpec()] * 3, options)
    steps = _steps(config.run_dir)
    (failure,) = report["failures"] or [dict.fromkeys(("detection_s", "last_step_before", "steps_lost",
                                                         "steps_repeated", "stall_s"))]
    repeated = failure["steps_repeated"]
    return {"injected": bool(report["failures"]), "detection_s": failure["detection_s"], "restarts": report["restarts"],
            "after_step": failure["last_step_before"], "steps_lost": failure["steps_lost"],
            "steps_repeated": repeated, "stall_s": failure["stall_s"],
            "samples_repeated": None if repeated is None else repeated * config.batch,
            "heartbeat_max_gap_s": report["heartbeat_max_gap_s"], "finished_steps": len(steps), **_step_medians(steps),
            "contiguous": [r["step"] for r in steps] == list(range(1, len(steps) + 1)), "wall_s": time.time() - started,
            "load": load, "emulation": report["emulation"]}


def _failure_row(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One failure kind over its runs: detection, stall and the healthy nodes' heartbeat gap with their spread;
    restarts, steps lost and repeated per run (each should be the same every time)."""
    return {"kind": kind, "repeats": len(runs), "injected": sum(r["injected"] for r in runs),
            "after_step": [r["after_step"] for r in runs],
            "detection_s": _spread([r["detection_s"] for r in runs]), "stall_s": _spread([r["stall_s"] for r in runs]),
            "heartbeat_max_gap_s": _spread([r["heartbeat_max_gap_s"] for r in runs]),
            "step_s": _spread([r.get("step_s") for r in runs]), "sync_s": _spread([r.get("sync_s") for r in runs]),
            "restarts": [r["restarts"] for r in runs], "steps_lost": [r["steps_lost"] for r in runs],
            "steps_repeated": [r["steps_repeated"] for r in runs],
            "samples_repeated": [r["samples_repeated"] for r in runs],
            "finished_steps": [r["finished_steps"] for r in runs], "contiguous": all(r["contiguous"] for r in runs),
            "runs": runs, "emulation": runs[0]["emulation"]}


# The link probe: node 1 echoes single bytes (round trips), then counts a bulk transfer's bytes; node 0 times both.
_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5001)); s.listen()
print("up", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)) != b"x":
    c.sendall(b)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
"""
_PROBE = """
import json, socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); s.sendall(b"p"); s.recv(1); rtts.append(time.perf_counter() - t)
s.sendall(b"x"); s.close()
s, chunk, n = socket.create_connection((sys.argv[1], 5001)), bytes(1 << 16), int(sys.argv[2]) >> 16
t = time.perf_counter()
for _ in range(n):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1)  # returns when node 1 has read everything and closed
print(json.dumps({"rtts_s": rtts, "bulk_bytes": n << 16, "bulk_s": time.perf_counter() - t}))
"""


def _link_presets(names: list[str]) -> list[LinkPreset]:
    """Presets by name; ``NAME@DELAY_MS`` is NAME's rate through the switch with that one-way delay (the
    forwarder's ceiling at a given rate)."""
    out = []
    for name in names:
        base, _, delay_ms = name.partition("@")
        preset = PRESETS[base]
        out.append(preset if not delay_ms else LinkPreset(name, preset.rate_bps, float(delay_ms) / 1e3, preset.loss,
                                                          f"{base} through the delaying switch"))
    return out


def link(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """What the emulated link delivers between two nodes, ``--repeats`` probes per link in one emulation: TCP round
    trips of one byte (``--pings`` per probe, their spread pooled over the probes, and the minimum), bulk TCP
    throughput over about 2 s of the preset's rate (its spread over the probes), the switch's counters (summed) and
    its CPU seconds per probe."""
    rows = []
    for preset in _link_presets(args.links):
        with NetworkEmulation(2, preset, cpus_per_node=cpus) as net:
            probes = [_link_probe(net, preset, args.pings) for _ in range(args.repeats)]
        rtts_s = [t for p in probes for t in p["rtts_s"]]
        counts = [p["switch"] for p in probes if p["switch"]]
        rows.append({"link": preset.name, "rate_bps": preset.rate_bps, "delay_s": preset.delay_s, "loss": preset.loss,
                     "switched": preset.switched, "repeats": args.repeats, "rtt_s": _spread(rtts_s),
                     "rtt_min_s": min(rtts_s), "throughput_bps": _spread([p["throughput_bps"] for p in probes]),
                     "switch": {k: sum(c[k] for c in counts) for k in counts[0] if k != "cpu_s"} if counts else {},
                     "switch_cpu_s": _spread([c["cpu_s"] for c in counts if "cpu_s" in c]),
                     "probes": probes, "emulation": net.describe()})
        log.info("link %s", rows[-1])
    return rows


def _link_probe(net: NetworkEmulation, preset: LinkPreset, pings: int) -> dict[str, Any]:
    """One probe: node 1 echoes, node 0 times ``pings`` round trips and one bulk transfer."""
    import sys

    echo = subprocess.Popen(net.wrap(1, [sys.executable, "-c", _ECHO, net.address(1)]), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert echo.stdout is not None
        echo.stdout.readline()
        before = net.switch_counts() if preset.switched else {}
        bulk_bytes = max(1 << 20, int(preset.rate_bps * 2 / 8))
        probe = subprocess.run(net.wrap(0, [sys.executable, "-c", _PROBE, net.address(1), str(bulk_bytes),
                                            str(pings)]), capture_output=True, text=True, check=True)
        after = net.switch_counts() if preset.switched else {}
    finally:
        echo.kill()
        echo.wait()
    measured = json.loads(probe.stdout)
    return {"rtts_s": measured["rtts_s"], "throughput_bps": measured["bulk_bytes"] * 8 / measured["bulk_s"],
            "switch": {k: after[k] - before[k] for k in after}}


def _crash_runs(rank: int, runs: int, steps: int, scratch: str) -> None:
    """Node ``rank`` of 2: ``runs`` process groups, each training a tiny CNN ``steps`` steps with PowerSGD rank 2
    through :func:`cluster_step`; a run crashes on any exception or when the nodes' weights differ."""
    import torch
    import torch.distributed as dist

    from edgetrain.core.schedule import keep_all
    from edgetrain.core.stages import training_stages
    from edgetrain.distributed.compress import PowerSGD
    from edgetrain.distributed.step import cluster_step
    from edgetrain.runtime import Executor

    torch.set_num_threads(1)
    crashes = []
    for run in range(runs):
        try:
            dist.init_process_group("gloo", init_method=f"file://{scratch}/store-{run}", rank=rank, world_size=2)
            torch.manual_seed(run)
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                                        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))
            stages = training_stages(model)
            executor, optimizer = Executor(stages, keep_all(len(stages)), None), torch.optim.SGD(
                model.parameters(), lr=0.05, momentum=0.9)
            compressor = PowerSGD(model.parameters(), 2, seed=run)
            generator = torch.Generator().manual_seed(1000 * run + rank)
            for _ in range(steps):
                batch = torch.randn(3 + rank, 3, 8, 8, generator=generator), torch.randint(0, 10, (3 + rank,),
                                                                                           generator=generator)
                cluster_step(executor, model, optimizer, batch, compressor=compressor)
            checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).double().sum().reshape(1)
            low, high = checksum.clone(), checksum.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                crashes.append(f"run {run}: the nodes' weights differ")
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
            crashes.append(f"run {run}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            if dist.is_initialized():
                dist.destroy_process_group()
    Path(scratch, f"crashes-{rank}.json").write_text(json.dumps(crashes))


def crashes(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """``--crash-runs`` runs of 2 local processes (no emulation) with PowerSGD rank 2: runs that crashed."""
    import torch.multiprocessing as mp

    folder = scratch / "crashes"
    folder.mkdir()
    started = time.time()
    context = mp.start_processes(_crash_runs, args=(args.crash_runs, args.crash_steps, str(folder)), nprocs=2,
                                 join=False, start_method="spawn")
    try:
        while not context.join():
            pass
        failed = sorted({c for r in range(2) for c in json.loads((folder / f"crashes-{r}.json").read_text())})
    except mp.ProcessRaisedException as exc:  # a node died: every run counts as crashed
        failed = [f"a node died: {str(exc).splitlines()[-1]}"] * args.crash_runs
    rows = [{"runs": args.crash_runs, "steps": args.crash_steps, "crashed_runs": len({f.split(':')[0] for f in failed}),
             "errors": failed[:10], "wall_s": time.time() - started}]
    log.info("crashes %s", rows[-1])
    return rows


_DIGEST = re.compile(r"node (\d+): weights after step \d+: sha256 ([0-9a-f]+)")


def node_crashes(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Whole-node compressed runs through ``cluster local``, one row per ``--node-crash-after`` value: how many
    crashed, and how (see the module's docstring). Spares are off: with no restart allowed they never train."""
    rows = []
    for after in args.node_crash_after:
        started, problems = time.time(), []
        for seed in range(args.node_crash_runs):
            config = replace(_config(scratch / f"node-crash-{after}-{seed}", args.node_crash_model,
                                     args.node_crash_batch, args.node_crash_steps, args.image), seed=seed)
            options = LocalOptions(compress_rank=args.compress_rank, compress_after=after, max_restarts=0,
                                   spares=False)
            try:
                run_local(config, [NodeSpec()] * args.node_crash_nodes, options)
                problem = _weights_parted(config.run_dir, args.node_crash_nodes)
            except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
                problem = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            if problem:
                kept = _keep_logs(config.run_dir, args.out.parent / "crash-logs" / config.run_dir.name)
                log.warning("seed %d crashed: %s (node logs: %s)", seed, problem, kept)
                problems.append(f"seed {seed}: {problem}")
            if config.run_dir.exists():  # its data and rank 0's state: 100 runs would fill the disk
                shutil.rmtree(config.run_dir)
        rows.append({"model": args.node_crash_model, "nodes": args.node_crash_nodes, "batch": args.node_crash_batch,
                     "steps": args.node_crash_steps, "compress_rank": args.compress_rank, "compress_after": after,
                     "runs": args.node_crash_runs, "crashed_runs": len(problems), "crashes": problems,
                     "wall_s": time.time() - started})
        log.info("node crashes %s", rows[-1])
    return rows


def _weights_parted(run_dir: Path, nodes: int) -> str | None:
    """Why a finished run's nodes do not end with the same weights (from the digests they log); None when they do."""
    digests: dict[int, str] = {}
    for node in range(nodes):
        text = (run_dir / LOG_DIR / f"attempt-0-node-{node}.log").read_text(errors="replace")
        digests.update((int(rank), digest) for rank, digest in _DIGEST.findall(text))
    if len(digests) < nodes:
        return f"nodes {sorted(set(range(nodes)) - set(digests))} logged no final weights"
    return None if len(set(digests.values())) == 1 else f"the nodes' weights differ: {digests}"


def state_saves(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """What rank 0 pays every ``--save-every`` steps: ``--saves`` durable saves of the model's training state with
    SGD momentum (``StateStore.save(TrainingState.capture(...))``, as a node saves), one torch thread."""
    import torch

    from edgetrain.core.optim import make_optimizer
    from edgetrain.models.registry import get_model_spec
    from edgetrain.train.state import StateStore, TrainingState

    torch.set_num_threads(1)
    spec = get_model_spec(args.model)
    model = spec.builder(spec.default_num_classes)
    optimizer = make_optimizer("sgd", model.parameters())
    for parameter in model.parameters():  # one step, so the momentum buffers exist
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    store, times_s = StateStore(scratch / "saves"), []
    for step in range(1, args.saves + 1):
        started = time.perf_counter()
        path = store.save(TrainingState.capture(step=step, epoch=0, model=model, optimizer=optimizer))
        times_s.append(time.perf_counter() - started)
    rows = [{"model": args.model, "saves": args.saves, "state_bytes": path.stat().st_size, "save_s": _spread(times_s),
             "times_s": times_s}]
    log.info("state saves %s", rows[-1])
    return rows


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def _each(values: list[Any]) -> str:
    """The runs' values: one when all are equal, else each in run order ('-': none)."""
    shown = ["-" if v is None else str(v) for v in values]
    return shown[0] if len(set(shown)) == 1 else ", ".join(shown)


def _scaled(value: dict[str, Any] | None, factor: float) -> dict[str, Any] | None:
    """A :func:`_spread` dict in other units (the CoV is unchanged)."""
    if value is None:
        return None
    return {**value, **{k: value[k] * factor for k in ("median", "q1", "q3", "iqr")}}


def _equivalence_text(value: dict[str, Any] | None) -> str:
    """'mean ± SE (each seed), low .. high: verdict', '-' for none."""
    if value is None:
        return "-"
    each = ", ".join(f"{d:+.2%}" for d in value["differences"])
    if value["se"] is None:
        return f"{value['mean']:+.2%} ({each}): {value['verdict']}"
    low, high = value["ci"]
    return f"{value['mean']:+.2%} ± {value['se']:.2%} ({each}), {low:+.2%} .. {high:+.2%}: {value['verdict']}"


def _load() -> str:
    """The 1-, 5- and 15-minute load averages, as ``uptime`` shows them."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def markdown(result: dict[str, Any]) -> str:
    out = [f"Machine shared with other work (load average {result['load_before']} before, {result['load_after']} "
           f"after); rerun with `{result['command']}`. {result['cpu_note']}", ""]
    if "link" in result:
        out += ["| link | rate Mbit/s | one-way delay ms | frame loss | probes | TCP round trip ms, all pings "
                "(median, IQR, CoV) | min ms | bulk TCP Mbit/s over probes | switch: forwarded, lost, queue full | "
                "switch CPU s per probe |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result.get("link", []):
        sw = r["switch"]
        counts = f"{sw['forwarded']:.0f}, {sw['lost']:.0f}, {sw['queue_full']:.0f}" if sw else "- (veth + tc tbf)"
        out.append(f"| {r['link']} | {r['rate_bps'] / 1e6:g} | {r['delay_s'] * 1e3:g} | {r['loss']:.1%} | "
                   f"{r['repeats']} | {_spread_text(_scaled(r['rtt_s'], 1e3))} | "
                   f"{r['rtt_min_s'] * 1e3:.2f} | "
                   f"{_spread_text(_scaled(r['throughput_bps'], 1e-6), '{:.1f}')} | {counts} | "
                   f"{_spread_text(r['switch_cpu_s'], '{:.2f}')} |")
    if "scaling" in result:
        out += ["| nodes | preset | batch | runs | step s (median of runs' medians, IQR, CoV) | samples/s | speedup | "
                "efficiency | sync share (median, IQR, CoV) | restarts |",
                "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {r['nodes']} | {r['preset']} | {r['batch']} | {r['repeats']} | {_spread_text(r['step_spread_s'])} | "
            f"{_fmt(r['samples_per_s'])} | {_fmt(r['speedup'])} | {_fmt(r['efficiency'])} | "
            f"{_spread_text(r['sync_share_spread'], '{:.2f}')} | {r['restarts']} |"
            for r in result.get("scaling", [])]
    if "ttt" in result:
        first = result["ttt"][0]
        targets = ", ".join(f"{t:.4f}" for t in first["target_losses"])
        out += ["", f"Time to a training loss of the single node's mean of {first['window']} steps at "
                f"{first['target_at']:.0%} of its run (seeds {_each(first['seeds'])}: {targets}), every node "
                f"{first['cpus_per_node']:.2f} core, {first['preset']}"
                f", global batch {first['batch']}{' x nodes, learning rate x nodes' if first['weak'] else ''}; "
                "efficiency = T(1 node) / (nodes x T(nodes)), seed by seed; times over the seeds that reached the "
                "target, step and sync s: each run's median, then over the seeds:", "",
                "| mode | nodes | reached / seeds | time to target s (median, IQR, CoV) | steps to target | efficiency "
                "| step s | mean step s (averaging steps in) | sync s | final loss (last " + str(first["window"]) +
                ", mean of seeds) | final loss vs single: mean ± SE (each seed), 90% interval, within ±"
                f"{result['margin']:.1%}? | loss on averaged weights (last " + str(first["window"]) + " such steps) | "
                "steps | restarts | load before |",
                "| --- |" + " ---: |" * 9 + " --- |" + " ---: |" * 3 + " --- |"]
    out += [f"| {r['mode']} | {r['nodes']} | {r['reached']} / {len(r['seeds'])} | "
            f"{_spread_text(r['time_to_target_s'])} | {_each(r['steps_to_target'])} | "
            f"{_spread_text(r['efficiency'], '{:.2f}')} | {_spread_text(r['step_s'])} | "
            f"{_spread_text(r.get('mean_step_s'))} | {_spread_text(r['sync_s'])} | "
            f"{r['final_loss']:.4f} | {_equivalence_text(r.get('final_vs_single'))} | "
            f"{_fmt(r.get('averaged_loss'), '.4f')} | {r['steps']} | {r['restarts']} | "
            f"{'; '.join(r['load_before'])} |"
            for r in result.get("ttt", [])]
    if "compression" in result:
        first = result["compression"][0]
        out += ["", f"Held-out loss: rank 0's evaluation of the seed's validation split after every epoch "
                f"({first['epochs']} of {first['steps'] // first['epochs']} steps, global batch {first['batch']}, "
                f"{first['lr_schedule']} rate); "
                f"relative to the single node's, seed by seed (seeds {first['first_seed']} .. "
                f"{first['first_seed'] + first['runs'] - 1}): mean ± standard error over the seeds (largest). The "
                "exact all-reduce is the single node's maths in another float order: its distance is the noise "
                "floor.", "",
                "| mode | nodes | steps | seeds | numbers sent per step (M) | held-out loss (mean of seeds) | "
                "vs single node | vs exact all-reduce | held-out loss after each epoch (mean of seeds) | "
                f"train loss (last {first['window']} steps) | crashes / runs | restarts | step s (median of seeds' "
                "medians, IQR, CoV) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]

    def _versus(value: dict[str, Any] | None) -> str:
        if value is None:
            return "-"
        error = "" if value["se"] is None else f" ± {value['se']:.2%}"
        return f"{value['mean']:+.2%}{error} ({value['largest']:+.2%})"

    out += [f"| {r['mode']} | {r['nodes']} | {r['steps']} | {r['runs']} | {r['numbers_per_step'] / 1e6:.3g} | "
            f"{_fmt(r['val_loss'], '.4f')} | {_versus(r['val_vs_single'])} | {_versus(r['val_vs_exact'])} | "
            f"{', '.join(f'{v:.3f}' for v in r['val_curve'])} | {_fmt(r['final_loss'], '.4f')} | "
            f"{r['crashes']} / {r['runs']} | {r['restarts']} | {_spread_text(r.get('step_spread_s'))} |"
            for r in result.get("compression", [])]
    if "failures" in result:
        out += ["", "| failure | injected / runs | after step | detection s (median, IQR, CoV) | restarts | steps "
                "lost | steps (samples) repeated | stall s (median, IQR, CoV) | finished, in order | longest healthy "
                "heartbeat gap s (median, IQR, CoV) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in result.get("failures", []):
        if "skipped" in r:
            out.append(f"| {r['kind']} | skipped: {r['skipped']} | | | | | | | | |")
            continue
        out.append(f"| {r['kind']} | {r['injected']} / {r['repeats']} | {_each(r['after_step'])} | "
                   f"{_spread_text(r['detection_s'])} | "
                   f"{_each(r['restarts'])} | {_each(r['steps_lost'])} | {_each(r['steps_repeated'])} "
                   f"({_each(r['samples_repeated'])}) | {_spread_text(r['stall_s'])} | "
                   f"{_each(r['finished_steps'])} steps, {'yes' if r['contiguous'] else 'NO'} | "
                   f"{_spread_text(r['heartbeat_max_gap_s'])} |")
    for r in result.get("save", []):
        out += ["", f"Saving a {r['model']} training state with momentum ({r['state_bytes'] / 1e6:.1f} MB, durable, "
                f"one torch thread), {r['saves']} saves: {_spread_text(r['save_s'])} s"]
    for r in result.get("crashes", []):
        errors = ": " + "; ".join(r["errors"]) if r["errors"] else ""
        out += ["", f"PowerSGD rank 2, 2 local processes, a tiny CNN: {r['crashed_runs']} of {r['runs']} runs of "
                f"{r['steps']} steps crashed ({r['wall_s']:.0f} s){errors}"]
    if result.get("node-crashes"):
        out += ["", "| model | nodes | batch | steps | PowerSGD | runs | crashed | wall s | crashes |",
                "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in result.get("node-crashes", []):
        out.append(f"| {r['model']} | {r['nodes']} | {r['batch']} | {r['steps']} | rank {r['compress_rank']} after "
                   f"{r['compress_after']} exact steps | {r['runs']} | {r['crashed_runs']} | {r['wall_s']:.0f} | "
                   f"{'; '.join(r['crashes']) or '-'} |")
    tables = ("link", "scaling", "ttt", "compression", "failures")
    emulations = sorted({r["emulation"] for t in tables for r in result.get(t, [])
                         if r.get("emulation")})
    out += ["", "Emulation: " + " / ".join(emulations)] if emulations else []
    if any(result.get(t) for t in ("scaling", "ttt", "compression")):
        local = result.get("local_batch_norm")
        out += ["", "BatchNorm: " + ("each node over its own slice (--local-batch-norm)" if local
                                     else "over the global batch (NOTE [ Cross-node BatchNorm ]; periodic averaging: "
                                     "each node over its own slice)")]
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _scratch(kept: Path | None) -> Iterator[str]:
    """The folder the runs go in: ``kept`` (made if missing, left in place; refused when not empty, as a run folder
    that is already there would be resumed, not run) or a temporary one."""
    if kept is not None:
        if kept.exists() and any(kept.iterdir()):
            raise SystemExit(f"--keep-runs {kept}: not empty (a run already there would be resumed)")
        kept.mkdir(parents=True, exist_ok=True)
        yield str(kept)
        return
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as scratch:
        yield scratch


def write_result(result: dict[str, Any], out: Path, md: Path, render: Callable[[dict[str, Any]], str]) -> None:
    """The run's JSON to ``out`` and its markdown (``render(result)``) to ``md``, which is also printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    table = render(result)
    md.write_text(table)
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    parser.add_argument("--presets", type=lambda s: s.split(","), default=["100mbit"],
                        help="'none' (compression table only): plain local processes")
    parser.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[8])
    parser.add_argument("--model", default="resnet18_cifar")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="steps per scaling run (the first is not timed)")
    parser.add_argument("--compress-steps", type=int, default=8)
    parser.add_argument("--average-every", type=int, default=4)
    parser.add_argument("--compress-rank", type=int, default=2)
    parser.add_argument("--compress-after", type=int, default=0,
                        help="PowerSGD runs sum whole gradients for their first N steps (--compress-after)")
    parser.add_argument("--compress-epochs", type=int, default=1,
                        help="compression table: epochs of --compress-steps steps, held-out loss after each")
    parser.add_argument("--compress-seed", type=int, default=0, help="compression table: the first seed")
    parser.add_argument("--lr-schedule", default="constant", help="compression table: the rate's schedule, constant "
                        "or cosine (down to 0 at the last step: the final loss the run's, not SGD noise's)")
    parser.add_argument("--compress-modes", type=lambda s: s.split(","), default=["powersgd", "average"],
                        help=f"compression table: rows after the single node and the exact all-reduce, any of "
                        f"{MODE_NAMES} (powersgd:8:10: rank 8 after 10 exact steps)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per point, each table's times given as median, IQR and CoV over them: scaling "
                        "points, failure kinds, link probes; compression and time to target: seeds 0 .. R-1 "
                        "(time to target: from --ttt-seed)")
    parser.add_argument("--failures", type=lambda s: s.split(","), default=["kill", "stop", "cut"])
    parser.add_argument("--failure-samples", type=int, default=240,
                        help="samples of every failure run (batch 6, 80%% for training: 240 gives 31 steps); more "
                        "give a loaded machine's idle-priority spares time to get ready before the fault")
    parser.add_argument("--failure-preset", default="gigabit",
                        help="the links of the cut failure: gigabit (veth) or wifi20 (through the delaying switch)")
    parser.add_argument("--cpus-per-node", type=float, default=None,
                        help="each node's CPU quota in cores (default: cores / the largest of --nodes)")
    parser.add_argument("--saves", type=int, default=10, help="state saves timed by the save table")
    parser.add_argument("--local-batch-norm", action="store_true",
                        help="scaling, time to target, compression: each node's BatchNorm over its own slice (no "
                        "collective) rather than cross-node BatchNorm (NOTE [ Cross-node BatchNorm ])")
    parser.add_argument("--crash-runs", type=int, default=100, help="PowerSGD runs counted for crashes")
    parser.add_argument("--crash-steps", type=int, default=5)
    parser.add_argument("--node-crash-runs", type=int, default=50, help="whole-node runs per --node-crash-after value")
    parser.add_argument("--node-crash-model", default="resnet18")
    parser.add_argument("--node-crash-nodes", type=int, default=4)
    parser.add_argument("--node-crash-batch", type=int, default=32)
    parser.add_argument("--node-crash-steps", type=int, default=4)
    parser.add_argument("--node-crash-after", type=lambda s: [int(v) for v in s.split(",")], default=[0, 2],
                        help="PowerSGD after this many exact steps: one row of runs per value")
    parser.add_argument("--links", type=lambda s: s.split(","),
                        default=["wifi20", "wifi20-lossy", "100mbit", "100mbit@5", "gigabit@5"],
                        help="links of the link table (NAME@MS: NAME's rate through the switch, MS ms one way)")
    parser.add_argument("--pings", type=int, default=50)
    parser.add_argument("--outer-lr", type=float, default=0.7, help="the DiLoCo mode's outer rate")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="the DiLoCo mode's outer Nesterov momentum")
    parser.add_argument("--ttt-modes", type=lambda s: s.split(","),
                        default=["single", "exact", "powersgd", "average", "diloco"],
                        help="time-to-target rows: single (first: it sets each seed's target), exact, powersgd "
                        "(powersgd:R:A: rank R after A exact steps), average (plain, every --average-every steps), "
                        "diloco (the same with the outer step)")
    parser.add_argument("--ttt-nodes", type=int, default=4)
    parser.add_argument("--ttt-preset", default="100mbit")
    parser.add_argument("--ttt-batch", type=int, default=32)
    parser.add_argument("--ttt-steps", type=int, default=40, help="steps of every time-to-target run")
    parser.add_argument("--ttt-window", type=int, default=5, help="steps the loss is averaged over")
    parser.add_argument("--ttt-seed", type=int, default=0)
    parser.add_argument("--ttt-weak", action="store_true", help="N nodes train N x --ttt-batch per step at N x the "
                        "learning rate (each node the single node's batch); default: the same global batch")
    parser.add_argument("--ttt-read", type=lambda s: [Path(p) for p in s.split(",")], default=[],
                        help="earlier results (--out JSON) whose time-to-target runs of these settings are read, not "
                        "run again (seeds added to a table)")
    parser.add_argument("--margin", type=float, default=0.005,
                        help="the final loss's equivalence margin against the single node (0.005: ±0.5%%)")
    parser.add_argument("--ttt-target-at", type=float, default=0.75,
                        help="the target: the single node's smoothed loss at this fraction of its steps")
    parser.add_argument("--tables", type=lambda s: s.split(","),
                        default=["link", "scaling", "ttt", "compression", "failures", "crashes", "node-crashes",
                                 "save"])
    parser.add_argument("--keep-runs", type=Path, default=None,
                        help="run every table's runs in this folder and keep them (default: a scratch folder removed "
                        "at the end, also when the benchmark is stopped)")
    parser.add_argument("--out", type=Path, default=Path("out/bench_cluster.json"))
    parser.add_argument("--md", type=Path, default=Path("out/bench_cluster.md"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    cpus = args.cpus_per_node or (os.cpu_count() or 1) / max(args.nodes)
    result: dict[str, Any] = {"load_before": _load(), "local_batch_norm": args.local_batch_norm, "margin": args.margin,
        "command": rerun_command("benchmarks/cluster.py", vars(args), leave_out=("out", "md")),
        "cpu_note": (f"Each emulated node: {cpus:.2f} of this machine's {os.cpu_count()} cores (cgroup quota, the "
                     "same at every node count; the time-to-target table: cores / --ttt-nodes)."
                     if can_emulate() is None and args.presets != ["none"] else
                     f"Not emulated ({can_emulate() or 'preset none'}): nodes share the machine's {os.cpu_count()} "
                     "cores.")}
    with _scratch(args.keep_runs) as scratch:
        for table, build in (("link", link), ("scaling", scaling), ("ttt", time_to_target),
                             ("compression", compression), ("failures", failures), ("crashes", crashes),
                             ("node-crashes", node_crashes), ("save", state_saves)):
            if table in args.tables:
                result[table] = build(args, Path(scratch), cpus)
    result["load_after"] = _load()
    write_result(result, args.out, args.md, markdown)


if __name__ == "__main__":
    main()
