"""Final loss against single-node training, the cluster simulated in one process: enough seeds for the 0.5% goal.

Each table trains one configuration once per seed in every mode and compares each mode's final loss with the single
node's, seed by seed (NOTE [ The compressed cluster in one process ] and NOTE [ Two readings of the final loss ] in
``edgetrain/distributed/simulation.py``): per reading, the relative difference's mean, standard error, 90% confidence
interval (Student's t), and the equivalence verdict (TOST at 5% each side: within ±0.5% when the whole interval lies
inside, outside when it lies wholly beyond, else undecided, with the seeds a decision would need).

Modes: ``single`` (the reference), ``reordered`` (the noise floor: the same maths in another float order), ``exact``
(whole gradients, BatchNorm over each node's slice), ``powersgd:RANK`` (simulated in one process), ``cluster:WIRE``
(a real ``cluster local`` of plain local processes summing whole gradients in WIRE: NOTE [ A real cluster beside the
simulation ]).

A full table's runs take hours (a batch-256 single-node run about 7 minutes of this machine, a PowerSGD run at batch
128 over an hour), so they are recorded: each run is one JSON line of its table's runs record under
``benchmarks/results/final_loss/`` (its settings, mode, seed, CPU, torch, load and finish time with its readings).
The full run reads every recorded run whose settings are the table's, runs only the (mode, seed) pairs missing,
appending each to the record as it ends, and builds the tables from them all; deleting a record reruns its table.
The quick run trains a small configuration from scratch into a temporary record.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from edgetrain.distributed.simulation import (
    READINGS,
    cluster_of_one,
    cluster_run,
    exact_steps_config,
    one_process_run,
    read_runs,
    sim_mode,
    summarise_final_losses,
)
from edgetrain.errors import EdgetrainError
from edgetrain.profiling.host import cpu_model

log = logging.getLogger("final_loss")

TITLE = "Cluster: final loss against single-node training"
ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "results" / "final_loss"
# the runs records beside the results file (the results index lists them)
KEPT_FILES = {
    "final_loss/b256_float16_runs.jsonl": "every final-loss run at batch 256, float16 on the wire, one line each, "
                                          "read back by the full run",
    "final_loss/b128_runs.jsonl": "the same at batch 128 with PowerSGD",
}
MARGIN = 0.005   # the equivalence margin: ±0.5%


class Table(NamedTuple):
    """One table: its name, the runs' settings (model, image, global batch, nodes, steps per epoch, epochs, rate
    schedule, BatchNorm per node), each mode's seeds (``single`` first: the reference), the training reading's window
    (the last epoch's last ``window`` steps; 0: all of them), and its runs record's file name."""

    name: str
    settings: dict[str, Any]
    seeds: dict[str, tuple[int, ...]]
    window: int
    record: str


def _settings(model: str, image: int, batch: int, nodes: int, steps: int, epochs: int, lr_schedule: str,
              local_batch_norm: bool) -> dict[str, Any]:
    return {"model": model, "image": image, "batch": batch, "nodes": nodes, "steps": steps, "epochs": epochs,
            "lr_schedule": lr_schedule, "local_batch_norm": local_batch_norm}


FLOAT16_SEEDS = (0, *range(5, 18))   # the seeds recorded: 14
B128_GLOBAL = _settings("resnet18", 32, 128, 4, 40, 4, "cosine", False)
TABLES = (
    # the time-to-target runs' configuration (benchmarks/cluster_ttt.py), float16 on the wire; window 5 as there
    Table("float16 on the wire, batch 256", _settings("resnet18_cifar", 32, 256, 4, 30, 1, "constant", False),
          {"single": FLOAT16_SEEDS, "cluster:float16": FLOAT16_SEEDS}, 5, "b256_float16_runs.jsonl"),
    Table("PowerSGD, batch 128", B128_GLOBAL,
          {"single": tuple(range(6)), "powersgd:8": tuple(range(4)), "powersgd:32": tuple(range(6))}, 0,
          "b128_runs.jsonl"),
    Table("PowerSGD, batch 128, BatchNorm over each node's slice", {**B128_GLOBAL, "local_batch_norm": True},
          {"single": tuple(range(4)), "exact": tuple(range(4)), "powersgd:8": tuple(range(4))}, 0,
          "b128_runs.jsonl"),
)
QUICK_TABLES = (
    Table("quick", _settings("resnet18_cifar", 32, 8, 2, 3, 2, "cosine", False),
          {"single": (0, 1), "reordered": (0, 1), "powersgd:2": (0, 1), "cluster:float16": (0, 1)}, 2,
          "quick_runs.jsonl"),
)
HEADLINE = (0, "cluster:float16", "training")   # the table, mode and reading the README quotes


def run(quick: bool) -> dict[str, Any]:
    """Every table: its recorded runs read, the missing ones run (appended to the record as each ends), then the
    summary; the quick tables into a temporary record. One torch thread (the cluster's nodes one each)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if quick:
            with tempfile.TemporaryDirectory(prefix="final-loss-record-") as folder:
                return {"tables": [build_table(t, Path(folder)) for t in QUICK_TABLES]}
        return {"tables": [build_table(t, RECORDS) for t in TABLES]}
    finally:
        torch.set_num_threads(threads)


def build_table(table: Table, folder: Path) -> dict[str, Any]:
    """One table's summary over its runs: those of its record in ``folder`` with its settings, and the missing ones,
    run now seed by seed and appended to the record as each ends."""
    settings, record = table.settings, folder / table.record
    modes = list(table.seeds)
    if modes[0] != "single" or settings["batch"] % settings["nodes"]:
        raise EdgetrainError(f"{table.name}: modes 'single' first (the reference), the batch a multiple of the nodes")
    read = {(r["mode"], r["seed"]) for r in read_runs([record], settings)}
    wanted = [(m, s) for m, seeds in table.seeds.items() for s in seeds]
    missing = [pair for pair in wanted if pair not in read]
    for seed in sorted({s for _, s in missing}):
        _run_seed(table, seed, [m for m, s in missing if s == seed], record)
    runs = [r for r in read_runs([record], settings) if r["seed"] in table.seeds.get(r["mode"], ())]
    loads = [float(r["load_before"].split()[0]) for r in runs]
    shown = str(record.relative_to(ROOT)) if record.is_relative_to(ROOT) else record.name
    return {"name": table.name, "settings": settings, "margin": MARGIN, "window": table.window, "record": shown,
            "read": len(wanted) - len(missing), "ran": len(missing),
            "loads": [min(loads), max(loads)], "cpus": sorted({r.get("cpu", "") for r in runs}),
            "rows": summarise_final_losses(runs, modes, MARGIN, settings["steps"], table.window)}


def _run_seed(table: Table, seed: int, modes: list[str], record: Path) -> None:
    """The seed's runs in ``modes`` on one copy of its data, each appended to ``record`` as it ends."""
    from benchmarks._cluster.common import load_average

    s = table.settings
    record.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="final-loss-") as scratch, cluster_of_one():
        config = replace(exact_steps_config(Path(scratch), s["model"], s["batch"], s["steps"], s["image"],
                                            s["epochs"]), seed=seed, lr_schedule=s["lr_schedule"])
        for name in modes:
            mode = sim_mode(name, s["nodes"], s["local_batch_norm"])
            load = load_average()
            if mode.wire is None:
                run = one_process_run(config, mode)
            else:
                run = cluster_run(replace(config, run_dir=config.run_dir / name.replace(":", "-")), mode,
                                  s["local_batch_norm"])
            line = {"settings": s, "mode": name, "seed": seed, "cpu": cpu_model(), "torch": torch.__version__,
                    "load_before": load, "load_after": load_average(),
                    "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), **run}
            with record.open("a") as runs_file:
                runs_file.write(json.dumps(line) + "\n")
            log.info("%s: %s seed %d: held-out %.4f (%.0f s)", table.name, name, seed, run["val_loss"], run["wall_s"])


def _versus(table: dict[str, Any], mode: str, reading: str) -> dict[str, Any]:
    row = next(r for r in table["rows"] if r["mode"] == mode)
    return dict(row[reading]["vs_single"])


def headline(result: dict[str, Any]) -> str:
    """The README's figure: the float16 cluster's final training loss against the single node's over its seeds."""
    index, mode, reading = HEADLINE
    versus = _versus(result["tables"][index], mode, reading)
    return f"final loss {versus['mean']:+.2%} ± {versus['se']:.2%} ({versus['n']} seeds)"


def _mean_se(difference: dict[str, Any]) -> str:
    """A relative difference's mean, with its standard error where there is one: ``+1.20% ± 0.50%``."""
    return f"{difference['mean']:+.2%}" + ("" if difference["se"] is None else f" ± {difference['se']:.2%}")


def _row(row: dict[str, Any], reading: str) -> str:
    v = row[reading].get("vs_single")
    versus = "-" if v is None else _mean_se(v)
    interval = "-" if v is None or v["ci"] is None else f"{v['ci'][0]:+.2%} .. {v['ci'][1]:+.2%}"
    loss = "-" if row[reading]["loss"] is None else f"{row[reading]['loss']:.4f}"
    return (f"| {row['mode']} | {row[reading]['seeds']} | {loss} | {versus} | "
            f"{'-' if v is None or v['sd'] is None else format(v['sd'], '.2%')} | {interval} | "
            f"{'-' if v is None else v['verdict']} | "
            f"{'-' if v is None or v['seeds_needed'] is None else v['seeds_needed']} | "
            f"{'-' if v is None or v['seeds_if_equal'] is None else v['seeds_if_equal']} | {row['run_s']:.0f} |")


def table_markdown(table: dict[str, Any]) -> list[str]:
    """One table's lines: its configuration, a table per reading of the final loss, and each mode against the single
    node after every epoch."""
    s, window = table["settings"], table["window"]
    out = [f"## {table['name']}", "",
           f"{s['model']} at {s['image']} px, global batch {s['batch']} over {s['nodes']} nodes "
           f"(simulated; cluster:* rows a real cluster of local processes; BatchNorm "
           f"{'over each node' if s['local_batch_norm'] else 'over the global batch'}), {s['epochs']} epochs of "
           f"{s['steps']} steps, {s['lr_schedule']} rate; each mode's final loss against the single node's, seed by "
           f"seed; 90% interval (Student's t); within ±{table['margin']:.1%}: the whole interval inside (TOST). "
           f"{table['read']} runs read from `{table['record']}`, {table['ran']} run now. Load average (1 min) at the "
           f"runs' starts: {table['loads'][0]:.2f} to {table['loads'][1]:.2f}."]
    for reading, title in READINGS.items():
        if reading == "training" and window:
            title = f"the last epoch's last {window} steps' training loss (mean of their logged losses)"
        out += ["", f"Final loss: {title}.", "",
                "| mode | seeds | loss (mean) | vs single: mean ± SE | sd per seed | 90% interval | verdict | "
                "seeds a decision needs (at this mean) | seeds were the true difference 0 | "
                "s per run (median; CPU time, wall where none) |",
                "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
        out += [_row(row, reading) for row in table["rows"]]
    compared = [row for row in table["rows"] if "by_epoch" in row["held_out"]]
    if compared:
        epochs = len(compared[0]["held_out"]["by_epoch"])
        out += ["", "Each mode against the single node after every epoch, in each reading (mean ± SE over the paired "
                "seeds; - where the reading was not taken):", "",
                "| mode | reading | " + " | ".join(f"epoch {e + 1}" for e in range(epochs)) + " |",
                "| --- | --- |" + " ---: |" * epochs]
        out += [f"| {row['mode']} | {reading.replace('_', ' ')} | " + " | ".join(
            "-" if d is None else _mean_se(d) for d in row[reading]["by_epoch"]) + " |"
            for row in compared for reading in READINGS if "by_epoch" in row[reading]]
    return out


def render(result: dict[str, Any]) -> str:
    """The headline, then every table."""
    index, mode, _ = HEADLINE
    table = result["tables"][index]
    shown = any(r["mode"] == mode for r in table["rows"])
    out = [f"**{table['name']}, {mode} against the single node, training loss of the last epoch's last "
           f"{table['window']} steps: {headline(result)}.**" if shown else ""]
    for table in result["tables"]:
        out += ["", *table_markdown(table)]
    return "\n".join(out) + "\n"
