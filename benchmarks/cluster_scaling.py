"""Data-parallel scaling across emulated edge nodes: throughput per number of nodes x network preset x global batch.

ResNet-18 with the CIFAR stem on CIFAR-10-shaped synthetic data (32 px, 10 classes), with the share of each step
spent in the all-reduces (``sync_s / time_s``, which includes waiting for the slowest node). Every node gets the same
CPU quota whatever the node count (the machine's cores over the largest node count), so a node is a fixed-size board
and N nodes have N times the compute. Each run gives its median step (the warm-up step left out); the table gives the
spread of those over the runs. The repeats go in rounds over the points (all points once, then again), so a change in
the machine's load spreads over every point. BatchNorm over each node's slice; spares off (no failure is expected).

As root, nodes run in network namespaces with tc-shaped links and cgroup CPU quotas (NOTE [ What the emulation is ]);
otherwise as plain processes, which the page says.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks._cluster import cpu_note, footer, quota, scaling, settings

TITLE = "Cluster: data-parallel throughput per node count, link and batch"
# 1, 2 and 4 half-core nodes on gigabit, 100 Mbit/s and 20 Mbit/s Wi-Fi, batch 32, 3 rounds.
FULL = {"nodes": [1, 2, 4], "presets": ["gigabit", "100mbit", "wifi20"], "batches": [32], "steps": 4, "repeats": 3,
        "local_batch_norm": True}
QUICK = {"nodes": [1, 2], "presets": ["100mbit"], "batches": [8], "steps": 3, "repeats": 1, "local_batch_norm": True}


def run(quick: bool) -> dict[str, Any]:
    """The scaling table at :data:`QUICK` or :data:`FULL` settings, every node at the same quota."""
    args = settings(**(QUICK if quick else FULL))
    cpus = quota(args)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-scaling-") as scratch:
        rows = scaling.scaling(args, Path(scratch), cpus)
    return {"settings": {key: getattr(args, key) for key in (*FULL, "model", "image")}, "cpus_per_node": cpus,
            "cpu_note": cpu_note(args, cpus), "scaling": rows}


def render(result: dict[str, Any]) -> str:
    """Per point the spread of the runs' median steps, throughput, speedup and efficiency against one node, and the
    share of the step in the all-reduces."""
    s = result["settings"]
    out = [f"{s['model']} at {s['image']} px, {s['steps']} steps a run (the first not timed). {result['cpu_note']} "
           "Speedup: samples/s over one node's at the same link and batch; efficiency: speedup / nodes.", ""]
    out += scaling.render(result) + footer(result["scaling"], s["local_batch_norm"])
    return "\n".join(out) + "\n"
