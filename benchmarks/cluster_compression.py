"""What compressing the all-reduces, or averaging less often, does to the held-out loss, against one node.

Single-node training (the reference), then exact data parallelism on 2 nodes (gradients summed every step: the same
maths, so its distance from the reference is the noise floor), then PowerSGD rank 2 with error feedback (NOTE
[ PowerSGD on plain all-reduces ]) and periodic weight averaging every 4 steps (NOTE [ Periodic averaging ]), on a
100 Mbit/s link: the held-out loss after every epoch and the final one against the reference's and the exact run's,
seed by seed (mean, standard error, largest), numbers sent per step, training loss of the last steps, and crashes
over the runs. ResNet-18 with the CIFAR stem at 32 px, global batch 8; spares off (no failure is expected).

For the final loss over enough seeds to decide a ±0.5% margin, see ``python -m benchmarks run final_loss``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks._cluster import compression, cpu_note, footer, quota, settings

TITLE = "Cluster: held-out loss of compressed and periodically averaged training"
FULL = {"compress_steps": 8, "compress_epochs": 2, "compress_modes": ["powersgd", "average", "diloco"], "repeats": 3}
QUICK = {"compress_steps": 3, "compress_epochs": 1, "compress_modes": ["powersgd"], "repeats": 1}


def run(quick: bool) -> dict[str, Any]:
    """The compression table at :data:`QUICK` or :data:`FULL` settings."""
    args = settings(**(QUICK if quick else FULL))
    cpus = quota(args)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-compression-") as scratch:
        rows = compression.compression(args, Path(scratch), cpus)
    return {"cpu_note": cpu_note(args, cpus), "local_batch_norm": args.local_batch_norm, "compression": rows}


def render(result: dict[str, Any]) -> str:
    """The compression table and how its nodes were emulated."""
    out = [result["cpu_note"], *compression.render(result), *footer(result["compression"], result["local_batch_norm"])]
    return "\n".join(out) + "\n"
