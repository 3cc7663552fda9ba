"""The meta-device estimate of a plain training step's peak against the peak of the same step run for real on the CPU.

``estimate_memory`` counts the step on the meta device without running it; ``measure_training_step`` runs it and reads
the peak of its tensors. Each case is a zoo model at a batch and an input size, under SGD and under Adam.
"""

from __future__ import annotations

from typing import Any

import torch

from edgetrain import estimate_memory, measure_training_step
from edgetrain.models import get_model_spec

CASES = [("resnet18", 2, 64), ("resnet18", 4, 96), ("resnet18", 8, 224), ("resnet50", 1, 64), ("resnet50", 3, 64),
         ("resnet50", 8, 128), ("mobilenet_v2", 2, 64), ("mobilenet_v2", 5, 48), ("mobilenet_v2", 16, 224),
         ("transformer_small", 4, 32), ("transformer_small", 8, 64), ("transformer", 2, 128)]
# One case per model at its smaller sizes: the same code paths in a fraction of the time.
QUICK_CASES = [("resnet18", 2, 64), ("resnet50", 1, 64), ("mobilenet_v2", 5, 48), ("transformer_small", 4, 32)]

TITLE = "The memory estimator against a measured step"


def run(quick: bool) -> dict[str, Any]:
    """The estimated and measured peak of each case under each optimizer."""
    rows = []
    for name, batch, size in QUICK_CASES if quick else CASES:
        for optimizer in ("sgd", "adam"):
            spec = get_model_spec(name)
            torch.manual_seed(0)
            measured = measure_training_step(spec.build(), spec.example_input(batch, size), spec.example_target(batch),
                                             optimizer=optimizer).peak_bytes
            estimated = estimate_memory(name, batch, size, optimizer=optimizer).total_bytes
            rows.append({"model": name, "batch": batch, "size": size, "optimizer": optimizer,
                         "estimated_bytes": estimated, "measured_bytes": measured})
    return {"cases": rows}


def relative_error(case: dict[str, Any]) -> float:
    return float(case["estimated_bytes"] / case["measured_bytes"] - 1)


def render(result: dict[str, Any]) -> str:
    """The cases as a table, then the worst error over all of them and over the convolutional ones."""
    cases = result["cases"]
    rows = [f"| {c['model']} | {c['batch']} | {c['size']} | {c['optimizer']} | {c['estimated_bytes'] / 2**20:.2f} | "
            f"{c['measured_bytes'] / 2**20:.2f} | {relative_error(c):+.2%} |" for c in cases]
    worst = max(cases, key=lambda c: abs(relative_error(c)))
    convolutional = [c for c in cases if not c["model"].startswith("transformer")]
    worst_cnn = max(abs(relative_error(c)) for c in convolutional)
    return ("`edgetrain.estimate_memory` counts a plain training step (forward, loss, backward, optimizer step) on the "
            "meta device, without running it; `edgetrain.measure_training_step` runs the same step on the CPU and "
            "reads the peak of its tensors. Both include the weights, their gradients and the optimizer's state.\n\n"
            "| model | batch | input | optimizer | estimated (MiB) | measured (MiB) | error |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"Worst error {relative_error(worst):+.2%} over {len(cases)} cases ({worst['model']}, batch "
            f"{worst['batch']}, {worst['optimizer']}); the convolutional models within {worst_cnn:.2%}.")
