"""Our predicted step time against published, measured ones on catalog devices.

Reads the figures of ``benchmarks/time_validation.toml`` (each with its source), converts each to
seconds per step (``published_total_s / published_steps``), asks ``edgetrain plan --json`` for the
same model, batch, input size, classes, optimizer and device (field ``predicted_time_s``: the one
time model of NOTE [ One time model ]), and prints the markdown table of docs/results/time_validation.md with the
error ``ours / published - 1``.

Run: .venv/bin/python benchmarks/time_model_validation.py [--figures F] [--out docs/results/time_validation.md]

A figure whose ``role`` is a calibration set a catalog rate (the RPi 4's ``compute_flops_per_s`` is
the published ResNet-18 step's FLOPs over its time), so its error is 0 by construction; the worst
error is stated over the held-out figures. The table says which training rate each device used.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.devices.catalog import tomllib  # tomllib, or tomli on Python 3.10

FIGURES = Path(__file__).with_name("time_validation.toml")
OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "time_validation.md"


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
        raise SystemExit(f"edgetrain {' '.join(args)} failed: {result.output.strip()}")
    report: dict[str, Any] = json.loads(result.output.strip().splitlines()[-1])
    return report


def table(figures: list[dict[str, Any]]) -> tuple[str, list[float]]:
    """The markdown table and the errors (ours / published - 1) of the held-out rows that have our time.

    The "implied rate" column is the device's training rate the published time implies under our
    FLOP count: the step's FLOPs (our time x our rate) over the published time.
    """
    lines = ["| # | device | source | model, batch x input | role | published step time | ours | error "
             "| implied rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    errors: list[float] = []
    rates: set[str] = set()
    for number, figure in enumerate(figures, start=1):
        published = published_step_s(figure)
        report = our_plan(figure)
        ours = report["predicted_time_s"]
        setting = f"{figure['model']}, {figure['batch']} x {figure['image']} px, {figure['classes']} classes"
        conversion = f"{figure['published_total_s']:.6g} s / {figure['published_steps']} steps = {published:.4g} s"
        held_out = figure["role"] == "held out"
        role = "held out" if held_out else "calibration"
        row = f"| {number} | {figure['device']} | {figure['cite']} | {setting} | {role} | {conversion} |"
        notes.append(f"{number}. {figure['published_model']}; {figure['framework']}; {figure['where']}; "
                     f"{figure['conditions']}" + ("." if held_out else f"; {figure['role']}."))
        if ours is None:
            lines.append(f"{row} unknown | - | - |")
            continue
        rate_flops_per_s = report["training_flops_per_s"]
        error = ours / published - 1
        if held_out:
            errors.append(error)
        rates.add(f"{figure['device']}: {rate_flops_per_s / 1e9:.4g} GFLOP/s ({report['time_source']})")
        lines.append(f"{row} {ours:.4g} s | {error:+.0%} | "
                     f"{ours * rate_flops_per_s / published / 1e9:.3g} GFLOP/s |")
    sources = sorted({figure["source"] for figure in figures})
    lines += ["", *notes, "", *(f"Source: {s}." for s in sources), "",
              *(f"Our training rate, {r}." for r in sorted(rates))]
    return "\n".join(lines), errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("--out", type=Path, default=OUT, help="Also write the markdown here (default: %(default)s).")
    args = parser.parse_args()
    figures: list[dict[str, Any]] = tomllib.loads(args.figures.read_text())["figure"]
    text, errors = table(figures)
    if errors:
        worst = max(errors, key=abs)
        mean_ratio = math.exp(sum(math.log1p(e) for e in errors) / len(errors))
        text += (f"\n\nWorst error {worst:+.0%} over {len(errors)} held-out figures; geometric mean of ours / "
                 f"published {mean_ratio:.3f}.")
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
