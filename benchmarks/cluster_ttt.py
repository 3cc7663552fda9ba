"""Time to a target training loss on emulated edge nodes, 4 nodes against 1, and the final loss against one node's.

Every node, the single one too, at the same CPU quota (the machine's cores over the 4 nodes; a cgroup quota in a
network namespace as root) on 100 Mbit/s links. Each seed's target is its own single-node run's loss (the mean of 5
steps) at 3/4 of its steps; a mode's time to target runs from the start of its step 1 to the end of the first step
whose 5-step mean is at most the target, and its efficiency is T(1 node) / (4 x T(4 nodes)), seed by seed. Each
mode's final loss (the mean of its last 5 steps) is held to the single node's seed by seed, within ±0.5% by TOST at
90% (``python -m benchmarks run final_loss`` has the same question with more seeds). Spares are off (no failure is
expected). Two tables: whole gradients summed in float16 on the wire, overlapped with the backward, at global batch
256; PowerSGD ranks 8 and 32 at batch 128.

A full table's runs take hours (a single-node run at batch 256 about 25 minutes of this machine), so they are
recorded: each run is one JSON line of its table's runs record under ``benchmarks/results/cluster_ttt/`` (its
settings, mode, seed, every step's loss and end time, the start of step 1, step and sync times, the load before it;
CPU and torch where they were recorded). The full run reads every recorded run whose settings are the table's, runs
only the (mode, seed) pairs missing, appending each to the record as it ends, and builds the tables from them all;
deleting a record reruns its table. The quick run trains a small configuration from scratch into a temporary
record.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from benchmarks._cluster import ttt as family
from benchmarks._cluster.common import load_average, log, mode, node_environment
from edgetrain.bench.stats import Spread
from edgetrain.errors import EdgetrainError
from edgetrain.profiling.host import cpu_model
from edgetrain.sysutil.fileio import read_jsonl

TITLE = "Cluster: time to a target loss, 4 nodes against 1"
ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "results" / "cluster_ttt"
# the runs records beside the results file (the results index lists them)
KEPT_FILES = {
    "cluster_ttt/b256_float16_runs.jsonl": "every time-to-target run at batch 256, float16 on the wire, one line each "
                                           "(settings, mode, seed, losses, step end times), read back by the full run",
    "cluster_ttt/b128_powersgd_runs.jsonl": "the same at batch 128 with PowerSGD",
}
MARGIN = 0.005   # the final loss's equivalence margin against the single node: ±0.5%
# What every table shares; a table sets the batch and steps. The mode settings are those its mode names stand for
# (benchmarks/_cluster/common.py, ``mode``).
COMMON = {"model": "resnet18_cifar", "image": 32, "nodes": 4, "preset": "100mbit", "local_batch_norm": False,
          "weak": False, "average_every": 4, "outer_lr": 0.7, "outer_momentum": 0.9, "compress_rank": 2,
          "compress_after": 0}
WINDOW, TARGET_AT = 5, 0.75   # the loss is the mean of 5 steps; the target the single node's at 3/4 of its run


class Table(NamedTuple):
    """One table: its name, its modes (``single`` first: it sets each seed's target), global batch, steps of every
    run, seeds and its runs record's file name."""

    name: str
    modes: tuple[str, ...]
    batch: int
    steps: int
    seeds: tuple[int, ...]
    record: str
    window: int = WINDOW


TABLES = (Table("float16 on the wire, batch 256", ("single", "fp16"), 256, 30, tuple(range(5)),
                "b256_float16_runs.jsonl"),
          Table("PowerSGD, batch 128", ("single", "powersgd:8:0", "powersgd:32:0"), 128, 40, (0, 1),
                "b128_powersgd_runs.jsonl"))
QUICK_TABLES = (Table("quick", ("single", "fp16", "powersgd:8:0"), 8, 4, (0,), "quick_runs.jsonl", 2),)
HEADLINE = (0, "fp16")   # the table and mode the README quotes


def settings(table: Table) -> dict[str, Any]:
    """What a recorded run must share to count for ``table``: the model, sizes, link, quota and mode settings."""
    return {**COMMON, "batch": table.batch, "steps": table.steps, "cpus_per_node": (os.cpu_count() or 1) / 4}


def _args(table: Table) -> SimpleNamespace:
    """The settings under the names the time-to-target runs read (benchmarks/_cluster/ttt.py)."""
    s = settings(table)
    return SimpleNamespace(model=s["model"], image=s["image"], ttt_nodes=s["nodes"], ttt_preset=s["preset"],
                           ttt_batch=s["batch"], ttt_steps=s["steps"], ttt_window=table.window, ttt_weak=s["weak"],
                           ttt_target_at=TARGET_AT, local_batch_norm=s["local_batch_norm"],
                           average_every=s["average_every"], outer_lr=s["outer_lr"], outer_momentum=s["outer_momentum"],
                           compress_rank=s["compress_rank"], compress_after=s["compress_after"], margin=MARGIN)


def read_record(path: Path, wanted: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs of a runs record (JSON lines; a missing file has none) whose settings are ``wanted``, by mode name and
    seed; a run recorded twice counts once, as first recorded. Each line: ``settings``, ``mode`` (its name, as
    :data:`TABLES` gives it), ``label`` (the row's), ``seed``, provenance (``cpu``, ``torch``, ``load_before``,
    ``load_after``, ``finished_utc``; None where not recorded) and the run's readings."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for line in read_jsonl(path):
        if line["settings"] == wanted:
            runs.setdefault((line["mode"], line["seed"]), line)
    return runs




def run(quick: bool) -> dict[str, Any]:
    """Every table: its recorded runs read, the missing ones run (each appended to the record as it ends), then the
    rows; the quick tables into a temporary record."""
    with node_environment(), tempfile.TemporaryDirectory(prefix="bench-cluster-ttt-") as scratch:
        records = Path(scratch) / "records" if quick else RECORDS
        tables = [build_table(t, records, Path(scratch) / f"runs-{i}") for i, t in enumerate(QUICK_TABLES if quick
                                                                                        else TABLES)]
    return {"tables": tables, "margin": MARGIN}


def build_table(table: Table, records: Path, scratch: Path) -> dict[str, Any]:
    """One table's rows over its runs: those of its record under ``records`` with its settings, and those missing,
    run now in ``scratch`` and appended to the record as each ends."""
    if table.modes[0] != "single":
        raise EdgetrainError(f"{table.name}: modes 'single' first (it sets the targets)")
    args, wanted, record = _args(table), settings(table), records / table.record
    done = read_record(record, wanted)
    read = sum((name, seed) in done for name in table.modes for seed in table.seeds)
    seeds = []
    for seed in table.seeds:
        runs = []
        for name in table.modes:
            if (name, seed) not in done:
                done[name, seed] = _record_run(args, scratch, name, seed, wanted, record)
            runs.append({**done[name, seed], "mode": done[name, seed]["label"]})
        seeds.append(family.seed_targets(runs, table.steps, table.window, TARGET_AT))
    rows = [family.ttt_row(args, [runs[i] for runs in seeds]) for i in range(len(table.modes))]
    for row in rows[1:]:
        row["final_vs_single"] = family.final_versus_single(row["runs"], rows[0]["runs"], MARGIN)
    for row, name in zip(rows, table.modes, strict=True):
        row["name"] = name
        for each in row["runs"]:   # every step's loss and time is in the record; the page reads none of them
            del each["losses"], each["wall_times"]
    shown = str(record.relative_to(ROOT)) if record.is_relative_to(ROOT) else record.name
    return {"name": table.name, "settings": {**wanted, "window": table.window, "target_at": TARGET_AT}, "ttt": rows,
            "margin": MARGIN, "record": shown, "read": read, "ran": len(table.modes) * len(table.seeds) - read}


def _record_run(args: SimpleNamespace, scratch: Path, name: str, seed: int, wanted: dict[str, Any],
                record: Path) -> dict[str, Any]:
    """One run of mode ``name``, appended to ``record`` with its settings and provenance as it ends."""
    load = load_average()
    done = family.ttt_run(args, scratch, mode(name, args, args.ttt_nodes), seed)
    line = {"settings": wanted, "mode": name, "label": done["mode"], "seed": seed, "cpu": cpu_model(),
            "torch": torch.__version__, "load_before": load, "load_after": load_average(),
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            **{k: v for k, v in done.items() if k not in ("mode", "seed", "load_before")}}
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as out:
        out.write(json.dumps(line) + "\n")
    log.info("time to target: %s seed %d recorded in %s", name, seed, record)
    return line


def _row(result: dict[str, Any], table: int, name: str) -> dict[str, Any]:
    return next(r for r in result["tables"][table]["ttt"] if r["name"] == name)


def headline(result: dict[str, Any]) -> str:
    """The README's figure: the float16 row's median efficiency, its range over the seeds, and how many seeds."""
    row = _row(result, *HEADLINE)
    efficiency = [r["efficiency"] for r in row["runs"] if r["efficiency"] is not None]
    return (f"time-to-target efficiency {Spread.from_dict(row['efficiency']).median:.2f} "
            f"({min(efficiency):.2f}-{max(efficiency):.2f}, {len(efficiency)} seeds)")


def render(result: dict[str, Any]) -> str:
    """The headline, then each table with where its runs came from."""
    out = [f"**{result['tables'][HEADLINE[0]]['name']}, {HEADLINE[1]}: {headline(result)}.**"]
    for table in result["tables"]:
        out += ["", f"## {table['name']}", "", f"{table['read']} runs read from `{table['record']}`, "
                f"{table['ran']} run now."]
        out += family.render(table)
        emulations = sorted({r["emulation"] for r in table["ttt"] if r.get("emulation")})
        out += ["", "Emulation: " + " / ".join(emulations)] if emulations else []
    out += ["", "BatchNorm: over the global batch (NOTE [ Cross-node BatchNorm ])."]
    return "\n".join(out) + "\n"
