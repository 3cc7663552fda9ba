"""The **ttt** table: time to a target training loss, one node against N.

Exact, PowerSGD, periodic averaging, DiLoCo's outer step on it (NOTE [ Outer step ]), once per seed, each seed's
target from its own single-node run (``benchmarks/cluster_ttt.py`` picks the rows); every node, the single one too,
at the same CPU quota. Its final loss is held to the single node's within a margin. Spares are off (no failure is
expected).
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgetrain.bench.stats import equivalence
from edgetrain.errors import EdgetrainError

from .common import (
    Mode,
    cell,
    load_average,
    log,
    name_list,
    per_run,
    run_config,
    run_name,
    run_nodes,
    spread_of,
    spread_text,
    step_medians,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The time-to-target table's own options (:func:`.common.add_options` has its modes' settings and window)."""
    parser.add_argument("--ttt-modes", type=name_list,
                        default=["single", "exact", "powersgd", "average", "diloco"],
                        help="time-to-target rows: single (first: it sets each seed's target), exact, powersgd "
                        "(powersgd:R:A: rank R after A exact steps), average (plain, every --average-every steps), "
                        "diloco (the same with the outer step)")
    parser.add_argument("--ttt-nodes", type=int, default=4)
    parser.add_argument("--ttt-preset", default="100mbit")
    parser.add_argument("--ttt-batch", type=int, default=32)
    parser.add_argument("--ttt-steps", type=int, default=40, help="steps of every time-to-target run")
    parser.add_argument("--ttt-seed", type=int, default=0)
    parser.add_argument("--ttt-weak", action="store_true", help="N nodes train N x --ttt-batch per step at N x the "
                        "learning rate (each node the single node's batch); default: the same global batch")
    parser.add_argument("--margin", type=float, default=0.005,
                        help="the final loss's equivalence margin against the single node (0.005: ±0.5%%)")
    parser.add_argument("--ttt-target-at", type=float, default=0.75,
                        help="the target: the single node's smoothed loss at this fraction of its steps")


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


def started_at(run: dict[str, Any]) -> float:
    """The wall time step 1 of a time-to-target run started at. An older result file does not record it; a run
    of its that reached its target gives it back from its time and step to that target."""
    if "started_at" in run:
        return float(run["started_at"])
    if run.get("steps_to_target") is None:
        raise EdgetrainError(f"{run['mode']}, seed {run['seed']}: no start time (a recorded run that never reached "
                             "its target)")
    return float(run["wall_times"][run["steps_to_target"] - 1] - run["time_to_target_s"])


def averaged_loss(losses: list[float], every: int, window: int) -> float | None:
    """With periodic averaging, the mean loss of the last ``window`` steps that began on just-averaged weights
    (steps ``k·every + 1``): the averaged model's loss on a fresh batch, where the other steps' losses are the
    nodes' drifted local models'. None for exact steps."""
    after = losses[every::every]
    return statistics.mean(after[-window:]) if every > 1 and after else None


def final_versus_single(runs: list[dict[str, Any]], single: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """Seed by seed, a mode's final loss (the last ``--ttt-window`` steps' mean) over the single node's minus 1,
    and whether they are within ±``margin`` (:func:`~edgetrain.bench.stats.equivalence`)."""
    differences = [run["final_loss"] / reference["final_loss"] - 1 for run, reference in zip(runs, single, strict=True)]
    return {**equivalence(differences, margin), "differences": differences}


def seed_targets(runs: list[dict[str, Any]], steps: int, window: int, target_at: float) -> list[dict[str, Any]]:
    """One seed's runs (the single node's first) with the seed's target (the single node's ``window``-step mean
    loss at ``target_at`` of its ``steps``), each run's time and steps to it and its efficiency T(1 node) / (nodes x
    T(nodes)); the runs are copied, not changed."""
    runs = [dict(run) for run in runs]
    target_step = max(1, round(steps * target_at))  # the others get the rest of the steps as slack
    target = _smoothed(runs[0]["losses"], window)[target_step - 1]
    for run in runs:
        run["started_at"] = started_at(run)
        run["target_loss"] = target
        run["time_to_target_s"], run["steps_to_target"] = _time_to(run, target, window)
    reference = runs[0]["time_to_target_s"]
    for run in runs:
        t = run["time_to_target_s"]
        run["efficiency"] = None if t is None or reference is None else reference / (run["nodes"] * t)
    return runs


def ttt_run(args: argparse.Namespace, scratch: Path, row: Mode, seed: int) -> dict[str, Any]:
    """One time-to-target run and what the table reads of it."""
    batch, window = args.ttt_batch, args.ttt_window
    # weak scaling: each node keeps the single node's batch (and BatchNorm groups), the rate grows with the
    # global batch (the linear scaling rule, Goyal et al. 2017, without warm-up)
    scale = row.nodes if args.ttt_weak else 1
    config = run_config(scratch / run_name("ttt", row, seed), args.model, batch * scale, args.ttt_steps, args.image)
    config = replace(config, seed=seed, lr=config.learning_rate() * scale)
    load = load_average()
    options = row.options(preset=args.ttt_preset, cpus_per_node=ttt_quota(args),
                          local_batch_norm=args.local_batch_norm)
    trained, report = run_nodes(config, row.nodes, options)
    log.info("time to target: %s, seed %d, %d steps, restarts %d", row.label, seed, len(trained), report["restarts"])
    return {"mode": row.label, "nodes": row.nodes, "seed": seed, "batch": batch * scale,
            "cpus_per_node": ttt_quota(args), "steps": len(trained),
            "final_loss": _smoothed([r["loss"] for r in trained], window)[-1],
            "averaged_loss": averaged_loss([r["loss"] for r in trained], row.every, window),
            **step_medians(trained), "restarts": report["restarts"], "load_before": load,
            "losses": [r["loss"] for r in trained], "wall_times": [r["wall_time"] for r in trained],
            "started_at": trained[0]["wall_time"] - trained[0]["time_s"], "emulation": report["emulation"]}


def ttt_quota(args: argparse.Namespace) -> float:
    """Every time-to-target node's CPU quota, the single one's too: the machine's cores shared by ``--ttt-nodes``."""
    return (os.cpu_count() or 1) / args.ttt_nodes


def ttt_row(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode over the seeds: time to target and efficiency over the seeds that reached it, step and sync time
    (each run's median) over all seeds."""
    first = runs[0]
    return {"mode": first["mode"], "nodes": first["nodes"], "preset": args.ttt_preset, "batch": first["batch"],
            "weak": args.ttt_weak, "cpus_per_node": first["cpus_per_node"], "window": args.ttt_window,
            "target_at": args.ttt_target_at, "seeds": [r["seed"] for r in runs],
            "target_losses": [r["target_loss"] for r in runs], "reached": sum(r["time_to_target_s"] is not None
                                                                              for r in runs),
            "time_to_target_s": spread_of([r["time_to_target_s"] for r in runs]),
            "efficiency": spread_of([r["efficiency"] for r in runs]),
            "steps_to_target": [r["steps_to_target"] for r in runs],
            "step_s": spread_of([r["step_s"] for r in runs]), "sync_s": spread_of([r["sync_s"] for r in runs]),
            "mean_step_s": spread_of([r["mean_step_s"] for r in runs]),
            "final_loss": statistics.mean(r["final_loss"] for r in runs), "steps": first["steps"],
            "averaged_loss": None if first["averaged_loss"] is None else statistics.mean(r["averaged_loss"]
                                                                                        for r in runs),
            "restarts": sum(r["restarts"] for r in runs), "load_before": [r["load_before"] for r in runs],
            "runs": runs, "emulation": first["emulation"]}


def _equivalence_text(value: dict[str, Any] | None) -> str:
    """'mean ± SE (each seed), low .. high: verdict', '-' for none."""
    if value is None:
        return "-"
    each = ", ".join(f"{d:+.2%}" for d in value["differences"])
    if value["se"] is None:
        return f"{value['mean']:+.2%} ({each}): {value['verdict']}"
    low, high = value["ci"]
    return f"{value['mean']:+.2%} ± {value['se']:.2%} ({each}), {low:+.2%} .. {high:+.2%}: {value['verdict']}"


def render(result: dict[str, Any]) -> list[str]:
    """The time-to-target table's markdown lines (none when ``result`` has no time-to-target table)."""
    if "ttt" not in result:
        return []
    first = result["ttt"][0]
    targets = ", ".join(f"{t:.4f}" for t in first["target_losses"])
    return ["", f"Time to a training loss of the single node's mean of {first['window']} steps at "
            f"{first['target_at']:.0%} of its run (seeds {per_run(first['seeds'])}: {targets}), every node "
            f"{first['cpus_per_node']:.2f} core, {first['preset']}"
            f", global batch {first['batch']}{' x nodes, learning rate x nodes' if first['weak'] else ''}; "
            "efficiency = T(1 node) / (nodes x T(nodes)), seed by seed; times over the seeds that reached the "
            "target, step and sync s: each run's median, then over the seeds:", "",
            "| mode | nodes | reached / seeds | time to target s (median, IQR, CoV) | steps to target | efficiency "
            "| step s | mean step s (averaging steps in) | sync s | final loss (last " + str(first["window"]) +
            ", mean of seeds) | final loss vs single: mean ± SE (each seed), 90% interval, within ±"
            f"{result['margin']:.1%}? | loss on averaged weights (last " + str(first["window"]) + " such steps) | "
            "steps | restarts | load before |",
            "| --- |" + " ---: |" * 9 + " --- |" + " ---: |" * 3 + " --- |"] + [
        f"| {r['mode']} | {r['nodes']} | {r['reached']} / {len(r['seeds'])} | "
        f"{spread_text(r['time_to_target_s'])} | {per_run(r['steps_to_target'])} | "
        f"{spread_text(r['efficiency'], '{:.2f}')} | {spread_text(r['step_s'])} | "
        f"{spread_text(r.get('mean_step_s'))} | {spread_text(r['sync_s'])} | "
        f"{r['final_loss']:.4f} | {_equivalence_text(r.get('final_vs_single'))} | "
        f"{cell(r.get('averaged_loss'), '.4f')} | {r['steps']} | {r['restarts']} | "
        f"{'; '.join(r['load_before'])} |"
        for r in result["ttt"]]
