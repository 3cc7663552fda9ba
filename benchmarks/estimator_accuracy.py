"""Estimated (meta device) vs measured (real CPU step) peak of plain training steps, as JSON.

Run: .venv/bin/python benchmarks/estimator_accuracy.py [--out out/estimator_accuracy.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from edgetrain import estimate_memory, measure_training_step
from edgetrain.models import get_model_spec

CASES = [("resnet18", 2, 64), ("resnet18", 4, 96), ("resnet18", 8, 224), ("resnet50", 1, 64), ("resnet50", 3, 64),
         ("resnet50", 8, 128), ("mobilenet_v2", 2, 64), ("mobilenet_v2", 5, 48), ("mobilenet_v2", 16, 224),
         ("transformer_small", 4, 32), ("transformer_small", 8, 64), ("transformer", 2, 128)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out/estimator_accuracy.json"))
    args = parser.parse_args()
    rows = []
    for name, batch, size in CASES:
        for optimizer in ("sgd", "adam"):
            spec = get_model_spec(name)
            torch.manual_seed(0)
            measured = measure_training_step(spec.build(), spec.example_input(batch, size), spec.example_target(batch),
                                             optimizer=optimizer).peak_bytes
            estimated = estimate_memory(name, batch, size, optimizer=optimizer).total_bytes
            rows.append({"model": name, "batch": batch, "size": size, "optimizer": optimizer,
                         "estimated_bytes": estimated, "measured_bytes": measured,
                         "ratio": round(estimated / measured, 5)})
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(json.dumps({"cases": len(rows), "worst_relative_error": round(worst, 5)}))


if __name__ == "__main__":
    main()
