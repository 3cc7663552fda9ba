"""Whether compressed training crashes, counted over many runs: through the cluster step, and through whole nodes.

* **crashes**: runs of 2 local processes training a tiny CNN with PowerSGD rank 2 through the cluster step (a
  crash: any exception, or the nodes' weights differing).
* **node crashes**: whole-node runs of ``cluster local`` per number of exact steps before PowerSGD (the supervisor, 4
  node processes, cross-node BatchNorm, PowerSGD rank 2), seeds 0 .. N-1; a crash: a node killed by a signal, any
  restart or exception, or the nodes' final weights differing (each node logs its weights' digest). The model,
  ResNet-18 with ImageNet's stem at 32 px, has the CIFAR ResNet-18's layers and so its collectives (the same BatchNorm
  layers, the same PowerSGD matrices but the stem's), at a fraction of the compute. Plain local processes, one torch
  thread each; spares off (no restart is allowed).

A crashed run's node logs are copied to ``edgetrain-cluster-crash-logs/crash-logs/`` in the temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._cluster import crashes, settings

TITLE = "Cluster: crashes of compressed training over many runs"
FULL = {"crash_runs": 100, "crash_steps": 5, "node_crash_runs": 50, "node_crash_after": [0, 2], "presets": ["none"]}
QUICK = {"crash_runs": 10, "crash_steps": 3, "node_crash_runs": 2, "node_crash_after": [2], "presets": ["none"]}


@contextlib.contextmanager
def _one_thread_nodes() -> Iterator[None]:
    """Node processes started inside at one intra-op thread; the environment restored after."""
    given = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if given is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = given


def run(quick: bool) -> dict[str, Any]:
    """The crash table, then the node-crash table, at :data:`QUICK` or :data:`FULL` settings."""
    args = settings(**(QUICK if quick else FULL))
    with _one_thread_nodes(), tempfile.TemporaryDirectory(prefix="bench-cluster-crashes-") as scratch:
        result = {"crashes": crashes.crashes(args, Path(scratch), 1.0)}
        result["node-crashes"] = crashes.node_crashes(args, Path(scratch), 1.0)
    return result


def headline(result: dict[str, Any]) -> str:
    """Crashed runs over all runs of each table."""
    node = result["node-crashes"]
    return (f"{sum(r['crashed_runs'] for r in node)} of {sum(r['runs'] for r in node)} whole-node runs crashed, "
            f"{sum(r['crashed_runs'] for r in result['crashes'])} of {sum(r['runs'] for r in result['crashes'])} "
            "runs through the cluster step")


def render(result: dict[str, Any]) -> str:
    """Both tables' lines."""
    return "\n".join([f"**{headline(result)}.**", *crashes.render(result)]) + "\n"
