"""The **scaling** table: throughput of data-parallel training per number of nodes x network preset x global batch.

ResNet-18 with the CIFAR stem on CIFAR-10-shaped synthetic data (32 px, 10 classes), with the share of each step
spent in the all-reduces (``sync_s / time_s``, which includes waiting for the slowest node). Every node gets the same
CPU quota whatever the node count (``cores / max nodes``), so a node is a fixed-size board and N nodes have N times
the compute. Each run gives its median step (the warm-up left out); the table gives the spread of those over the
runs. Spares are off (no failure is expected).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from edgetrain.distributed.supervisor import LocalOptions

from .common import WARM_UP_STEPS, cell, load_average, log, run_config, run_nodes, spread_of, spread_text, step_medians


def add_options(parser: argparse.ArgumentParser) -> None:
    """The scaling table's own option (:func:`.common.add_options` has the points' nodes, presets and batches)."""
    parser.add_argument("--steps", type=int, default=4, help="steps per scaling run (the first is not timed)")


def scaling(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """Per point (preset x batch x nodes), ``--repeats`` runs, each giving its median step time and sync share;
    the row holds their spread over the runs. The repeats are rounds over all points, so a change of the machine's
    load during the benchmark spreads over every point instead of biasing some."""
    points = [(preset, batch, nodes) for preset in args.presets for batch in args.batches for nodes in args.nodes]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {point: [] for point in points}
    for repeat in range(args.repeats):
        for preset, batch, nodes in points:
            config = run_config(scratch / f"scale-{preset}-{batch}-{nodes}-{repeat}", args.model, batch, args.steps,
                                args.image)
            steps, report = run_nodes(config, nodes, LocalOptions(preset=preset, cpus_per_node=cpus, spares=False,
                                                                  local_batch_norm=args.local_batch_norm))
            runs[(preset, batch, nodes)].append({**step_medians(steps), "restarts": report["restarts"],
                                                 "steps_timed": len(steps) - WARM_UP_STEPS, "load": load_average(),
                                                 "emulation": report["emulation"]})
            log.info("scaling %s %s %s round %d: %s", preset, batch, nodes, repeat, runs[(preset, batch, nodes)][-1])
    rows = [scaling_row(preset, batch, nodes, runs[(preset, batch, nodes)]) for preset, batch, nodes in points]
    for row in rows:
        single = next((r for r in rows if r["nodes"] == 1 and r["preset"] == row["preset"]
                       and r["batch"] == row["batch"]), None)
        row["speedup"] = None if single is None else row["samples_per_s"] / single["samples_per_s"]
        row["efficiency"] = None if row["speedup"] is None else row["speedup"] / row["nodes"]
    return rows


def scaling_row(preset: str, batch: int, nodes: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One scaling point from its runs: throughput from the median over the runs of their median step."""
    step = spread_of([r["step_s"] for r in runs])
    assert step is not None
    return {"nodes": nodes, "preset": preset, "batch": batch, "step_s": step["median"], "step_spread_s": step,
            "samples_per_s": batch / step["median"], "sync_share": statistics.median(r["sync_share"] for r in runs),
            "sync_share_spread": spread_of([r["sync_share"] for r in runs]),
            "restarts": sum(r["restarts"] for r in runs), "steps_timed": runs[0]["steps_timed"], "repeats": len(runs),
            "runs": runs, "emulation": runs[0]["emulation"]}


def render(result: dict[str, Any]) -> list[str]:
    """The scaling table's markdown lines (none when ``result`` has no scaling table)."""
    if "scaling" not in result:
        return []
    return ["| nodes | preset | batch | runs | step s (median of runs' medians, IQR, CoV) | samples/s | speedup | "
            "efficiency | sync share (median, IQR, CoV) | restarts |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"] + [
        f"| {r['nodes']} | {r['preset']} | {r['batch']} | {r['repeats']} | {spread_text(r['step_spread_s'])} | "
        f"{cell(r['samples_per_s'])} | {cell(r['speedup'])} | {cell(r['efficiency'])} | "
        f"{spread_text(r['sync_share_spread'], '{:.2f}')} | {r['restarts']} |"
        for r in result["scaling"]]
