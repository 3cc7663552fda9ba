"""Our predicted step time against published, measured ones on catalog devices.

Reads the figures of ``benchmarks/time_validation.toml`` (each with its source), converts each to seconds per step
(``published_total_s / published_steps``) and asks ``edgetrain plan --json`` for the same model, batch, input size,
classes, optimizer and device (field ``predicted_time_s``: the one time model of NOTE [ One time model ]). The error is
``ours / published - 1``.

A figure whose ``role`` is a calibration set a catalog rate (the RPi 4's ``compute_flops_per_s`` is the published
ResNet-18 step's FLOPs over its time), so its error is 0 by construction; the worst error is stated over the held-out
figures. The result is FLOP counts and catalog rates only, the same on every machine, so ``quick`` changes nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.devices.catalog import tomllib  # tomllib, or tomli on Python 3.10
from edgetrain.errors import EdgetrainError

FIGURES = Path(__file__).with_name("time_validation.toml")

TITLE = "The time model against published steps"


def published_step_s(figure: dict[str, Any]) -> float:
    """The published time converted to seconds per training step."""
    return float(figure["published_total_s"]) / int(figure["published_steps"])


def our_plan(figure: dict[str, Any]) -> dict[str, Any]:
    """``edgetrain plan --json`` for the figure's setting on its device."""
    args = ["plan", "--model", figure["model"], "--batch", str(figure["batch"]), "--image", str(figure["image"]),
            "--classes", str(figure["classes"]), "--optimizer", figure["optimizer"], "--device", figure["device"],
            "--json"]
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise EdgetrainError(f"edgetrain {' '.join(args)} failed: {result.output.strip()}")
    report: dict[str, Any] = json.loads(result.output.strip().splitlines()[-1])
    return report


def run(quick: bool) -> dict[str, Any]:
    """Each figure beside our prediction for its setting and the training rate our prediction used."""
    figures: list[dict[str, Any]] = tomllib.loads(FIGURES.read_text())["figure"]
    rows = []
    for figure in figures:
        report = our_plan(figure)
        rows.append({**figure, "published_step_s": published_step_s(figure),
                     "predicted_time_s": report["predicted_time_s"],
                     "training_flops_per_s": report["training_flops_per_s"], "time_source": report["time_source"]})
    return {"figures": rows}


def render(result: dict[str, Any]) -> str:
    """The table, the notes on each figure, the sources, our rates, then the held-out figures' worst error.

    The "implied rate" column is the device's training rate the published time implies under our FLOP count: the
    step's FLOPs (our time x our rate) over the published time.
    """
    lines = ["| # | device | source | model, batch x input | role | published step time | ours | error "
             "| implied rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    errors: list[float] = []
    rates: set[str] = set()
    for number, figure in enumerate(result["figures"], start=1):
        published, ours = figure["published_step_s"], figure["predicted_time_s"]
        setting = f"{figure['model']}, {figure['batch']} x {figure['image']} px, {figure['classes']} classes"
        conversion = f"{figure['published_total_s']:.6g} s / {figure['published_steps']} steps = {published:.4g} s"
        held_out = figure["role"] == "held out"
        row = f"| {number} | {figure['device']} | {figure['cite']} | {setting} | " \
              f"{'held out' if held_out else 'calibration'} | {conversion} |"
        notes.append(f"{number}. {figure['published_model']}; {figure['framework']}; {figure['where']}; "
                     f"{figure['conditions']}" + ("." if held_out else f"; {figure['role']}."))
        if ours is None:
            lines.append(f"{row} unknown | - | - |")
            continue
        rate_flops_per_s = figure["training_flops_per_s"]
        error = ours / published - 1
        if held_out:
            errors.append(error)
        rates.add(f"{figure['device']}: {rate_flops_per_s / 1e9:.4g} GFLOP/s ({figure['time_source']})")
        lines.append(f"{row} {ours:.4g} s | {error:+.0%} | {ours * rate_flops_per_s / published / 1e9:.3g} GFLOP/s |")
    sources = sorted({figure["source"] for figure in result["figures"]})
    lines += ["", *notes, "", *(f"Source: {s}." for s in sources), "",
              *(f"Our training rate, {r}." for r in sorted(rates))]
    if errors:
        worst = max(errors, key=abs)
        mean_ratio = math.exp(sum(math.log1p(e) for e in errors) / len(errors))
        lines += ["", f"Worst error {worst:+.0%} over {len(errors)} held-out figures; geometric mean of ours / "
                      f"published {mean_ratio:.3f}."]
    return "\n".join(lines)
