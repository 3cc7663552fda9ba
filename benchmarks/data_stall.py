"""docs/guide/data.md's data-stall table, rebuilt with its spread over repeated analyses.

The setup of the docs' example: a two-conv CNN, 2000 synthetic JPEG images of 32 px (1600 in the
train split), batches of 32, an emulated Raspberry Pi 4 microSD card (the device catalog's
``storage_read_bps``) with 1 ms per read, loader workers 0, 1, 2. Runs
:func:`edgetrain.data.analyze_stalls` ``--repeats`` times (each is the three-run differential
over ``--batches`` batches for every worker count, keeping medians of per-batch times) and prints,
per worker count, the median over the repeats of every column of the table with its IQR and CoV
(:func:`edgetrain.bench.stats.spread`), as JSON with the software setup.

Usage::

    python benchmarks/data_stall.py [--repeats 5] [--batches 10] [--threads N] [--data-root out/data]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgetrain.bench.stats import software_setup, spread
from edgetrain.data import StallReport, analyze_stalls, make_step_fn, open_dataset
from edgetrain.devices import get_device

WORKERS = (0, 1, 2)
COLUMNS = ("compute_s", "warm_s", "cold_s", "fetch_share", "prep_share", "compute_share", "stall_share",
           "samples_per_s")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Whole analyses (the spread is over these).")
    parser.add_argument("--batches", type=int, default=10, help="Timed batches per run (their median is kept).")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own).")
    parser.add_argument("--data-root", type=Path, default=Path("out/data"), help="Where the synthetic data goes.")
    args = parser.parse_args()
    if args.repeats < 1 or args.batches < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--repeats, --batches and --threads must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    train, _, classes = open_dataset("synthetic", image_size=32, samples=2000, image_format="jpeg",
                                     root=args.data_root)
    torch.manual_seed(0)
    step = make_step_fn(two_conv_cnn(classes))
    read_bps = get_device("rpi4").storage_read_bps
    reports = [analyze_stalls(step, train, batch_size=32, workers=WORKERS, batches=args.batches, read_bps=read_bps,
                              read_latency_s=0.001) for _ in range(args.repeats)]
    print(json.dumps({"repeats": args.repeats, "batches": args.batches, "read_bps": read_bps,
                      "per_repeat": [r.to_dict() for r in reports],
                      "rows": summarise(reports), "setup": software_setup()}, indent=1))


if __name__ == "__main__":
    main()
