"""The **compression** table: what compressing the all-reduces, or averaging less often, does to the loss.

Single-node training (the reference), then exact data parallelism (gradients summed every step: the same maths, so
its distance from the reference is the noise floor), then ``--compress-modes``: PowerSGD rank R with error feedback
after A exact steps (NOTE [ PowerSGD on plain all-reduces ]), periodic weight averaging every K steps
(NOTE [ Periodic averaging ]) and DiLoCo, on the slowest link: the held-out loss after every epoch and the final one
against the reference's and the exact run's, seed by seed (mean, standard error, largest), numbers sent per step,
training loss of the last steps, and crashes over the runs (one seed each). Spares are off (no failure is expected).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgetrain.distributed.compress import PowerSGD
from edgetrain.models import get_model_spec

from .common import (
    MODE_NAMES,
    Mode,
    cell,
    keep_logs,
    load_average,
    log,
    metric_records,
    mode,
    name_list,
    run_config,
    run_name,
    run_nodes,
    spread_of,
    spread_text,
    step_medians,
)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The compression table's own options (:func:`.common.add_options` has its modes' settings)."""
    parser.add_argument("--compress-steps", type=int, default=8)
    parser.add_argument("--compress-epochs", type=int, default=1,
                        help="compression table: epochs of --compress-steps steps, held-out loss after each")
    parser.add_argument("--compress-seed", type=int, default=0, help="compression table: the first seed")
    parser.add_argument("--lr-schedule", default="constant", help="compression table: the rate's schedule, constant "
                        "or cosine (down to 0 at the last step: the final loss the run's, not SGD noise's)")
    parser.add_argument("--compress-modes", type=name_list, default=["powersgd", "average"],
                        help=f"compression table: rows after the single node and the exact all-reduce, any of "
                        f"{MODE_NAMES} (powersgd:8:10: rank 8 after 10 exact steps)")


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
    config = replace(run_config(scratch / run_name("compress", row, seed), args.model, args.batches[0],
                                args.compress_steps, args.image, args.compress_epochs),
                     seed=seed, lr_schedule=args.lr_schedule)
    load = load_average()
    try:
        steps, report = run_nodes(config, row.nodes, row.options(preset=None if preset == "none" else preset,
                                                                 cpus_per_node=cpus, max_restarts=0,
                                                                 local_batch_norm=args.local_batch_norm))
    except Exception as exc:  # noqa: BLE001 -- a crash of any kind is what is counted here
        kept = keep_logs(config.run_dir, args.out.parent / "crash-logs" / config.run_dir.name)
        log.warning("compression run crashed: %s (node logs: %s)", exc, kept)
        return None
    evaluations = metric_records(config.run_dir, "val_loss")
    log.info("compression %s, seed %d: held-out loss after each epoch %s", row.label, seed,
             [round(r["val_loss"], 4) for r in evaluations])
    return {**step_medians(steps), "restarts": report["restarts"], "load_before": load, "load_after": load_average(),
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
            "step_spread_s": spread_of([r["step_s"] for r in done]),
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


def _versus(value: dict[str, Any] | None) -> str:
    """'mean ± SE (largest)' of a :func:`_relative` comparison; '-' for none."""
    if value is None:
        return "-"
    error = "" if value["se"] is None else f" ± {value['se']:.2%}"
    return f"{value['mean']:+.2%}{error} ({value['largest']:+.2%})"


def render(result: dict[str, Any]) -> list[str]:
    """The compression table's markdown lines (none when ``result`` has no compression table)."""
    if "compression" not in result:
        return []
    first = result["compression"][0]
    return ["", f"Held-out loss: rank 0's evaluation of the seed's validation split after every epoch "
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
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"] + [
        f"| {r['mode']} | {r['nodes']} | {r['steps']} | {r['runs']} | {r['numbers_per_step'] / 1e6:.3g} | "
        f"{cell(r['val_loss'], '.4f')} | {_versus(r['val_vs_single'])} | {_versus(r['val_vs_exact'])} | "
        f"{', '.join(f'{v:.3f}' for v in r['val_curve'])} | {cell(r['final_loss'], '.4f')} | "
        f"{r['crashes']} / {r['runs']} | {r['restarts']} | {spread_text(r.get('step_spread_s'))} |"
        for r in result["compression"]]
