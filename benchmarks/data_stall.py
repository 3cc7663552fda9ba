"""docs/guide/data.md's data-stall table, with its spread over repeated analyses.

The setup of the docs' example: a two-conv CNN, 2000 synthetic JPEG images of 32 px (1600 in the
train split), batches of 32, an emulated Raspberry Pi 4 microSD card (the device catalog's
``storage_read_bps``) with 1 ms per read, loader workers 0, 1, 2. Runs
:func:`edgetrain.data.analyze_stalls` several times (each is the three-run differential over a
number of batches for every worker count, keeping medians of per-batch times) and gives, per
worker count, the median over the repeats of every column of the table with its IQR and CoV
(:func:`edgetrain.bench.stats.spread`). On a loaded machine one analysis does not tell the
worker counts apart; the repeats do.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from edgetrain.bench.stats import Spread, spread
from edgetrain.data import StallReport, analyze_stalls, make_step_fn, open_dataset
from edgetrain.devices import get_device

TITLE = "Where a small CNN's training step waits for its data"

WORKERS = (0, 1, 2)
COLUMNS = ("compute_s", "warm_s", "cold_s", "fetch_share", "prep_share", "compute_share", "stall_share",
           "samples_per_s")
SAMPLES, IMAGE, BATCH, READ_LATENCY_S, DEVICE = 2000, 32, 32, 0.001, "rpi4"


def two_conv_cnn(classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, classes))


def summarise(reports: Sequence[StallReport]) -> list[dict[str, Any]]:
    """Per worker count: each column's spread over the repeats, and how often it was recommended."""
    rows = []
    for workers in WORKERS:
        values = [report.row(workers).to_dict() for report in reports]
        rows.append({"workers": workers,
                     "recommended": sum(report.recommended_workers == workers for report in reports),
                     **{column: spread([v[column] for v in values]).to_dict() for column in COLUMNS}})
    return rows


def run(quick: bool) -> dict[str, Any]:
    """``repeats`` whole analyses on freshly generated data; the spread of each column is over them."""
    repeats, batches = (2, 5) if quick else (5, 10)
    read_bps = get_device(DEVICE).storage_read_bps
    with tempfile.TemporaryDirectory(prefix="edgetrain-data-stall-") as root:
        train, _, classes = open_dataset("synthetic", image_size=IMAGE, samples=SAMPLES, image_format="jpeg",
                                         root=root)
        torch.manual_seed(0)
        step = make_step_fn(two_conv_cnn(classes))
        reports = [analyze_stalls(step, train, batch_size=BATCH, workers=WORKERS, batches=batches,
                                  read_bps=read_bps, read_latency_s=READ_LATENCY_S) for _ in range(repeats)]
    return {"repeats": repeats, "batches": batches, "read_bps": read_bps, "samples": SAMPLES, "image": IMAGE,
            "batch": BATCH, "read_latency_s": READ_LATENCY_S, "train_samples": len(train),
            "rows": summarise(reports), "per_repeat": [report.to_dict() for report in reports]}


def _pct(value: dict[str, Any]) -> str:
    s = Spread.from_dict(value)
    return f"{100 * s.median:.0f}% ({100 * s.q1:.0f}-{100 * s.q3:.0f}%)"


def render(result: dict[str, Any]) -> str:
    """The table of docs/guide/data.md: per worker count, medians over the repeats with their IQR."""
    rows = []
    for row in result["rows"]:
        cold, rate = Spread.from_dict(row["cold_s"]), Spread.from_dict(row["samples_per_s"])
        rows.append(f"| {row['workers']} | {Spread.from_dict(row['compute_s']).median * 1e3:.1f} | "
                    f"{Spread.from_dict(row['warm_s']).median * 1e3:.1f} | {cold.median * 1e3:.1f} "
                    f"(CoV {cold.cov_text}) | {_pct(row['fetch_share'])} | {_pct(row['prep_share'])} | "
                    f"{_pct(row['stall_share'])} | {rate.median:.0f} ({rate.q1:.0f}-{rate.q3:.0f}) | "
                    f"{row['recommended']} of {result['repeats']} |")
    return (f"A two-conv CNN on {result['samples']} synthetic JPEG images of {result['image']} px "
            f"({result['train_samples']} in the train split), batches of {result['batch']}, read from an emulated "
            f"Raspberry Pi 4 microSD card ({result['read_bps'] / 1e6:.1f} MB/s, "
            f"{result['read_latency_s'] * 1e3:.0f} ms a read). Each analysis is the three-run differential "
            "(compute alone, warm data, cold data) over "
            f"{result['batches']} batches per run for each worker count; the figures are medians over "
            f"{result['repeats']} analyses, with the quartiles in brackets.\n\n"
            "| workers | compute (ms/batch) | warm (ms/batch) | cold (ms/batch) | fetch | pre-process | stall | "
            "samples/s | recommended |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            "The pre-process share includes the pipeline's own decoding, normalising and collating, which a real "
            "pre-processing stage pays too.")
