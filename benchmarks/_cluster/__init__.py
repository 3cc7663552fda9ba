"""What the cluster benchmarks (``benchmarks/cluster_*.py``) share: one module per family of tables, and what they
share (:mod:`.common`).

Each family module gives its tables' builders (``builder(args, scratch, cpus)``: the table's rows), the settings its
tables read with their defaults (``add_options``) and its tables' markdown lines (``render``); a ``cluster_*``
benchmark picks its settings (:func:`settings`), runs the builders and renders the lines into its page.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from edgetrain.distributed.netns import can_emulate
from edgetrain.errors import EdgetrainError

# Where a crashed run's node logs are copied (the runs' own folders are temporary).
CRASH_LOGS = Path(tempfile.gettempdir()) / "edgetrain-cluster-crash-logs"


def settings(**given: Any) -> argparse.Namespace:
    """Every table's settings at the defaults the families declare (``add_options``), ``given`` in place of some (an
    unknown name raises); ``out`` is a file in :data:`CRASH_LOGS`: crashed runs' node logs go to its ``crash-logs``."""
    from . import common, compression, crashes, failures, link, scaling, ttt

    parser = argparse.ArgumentParser(add_help=False)
    for family in (common, compression, crashes, failures, link, scaling, ttt):
        family.add_options(parser)
    args = parser.parse_args([])
    unknown = set(given) - set(vars(args))
    if unknown:
        raise EdgetrainError(f"unknown cluster benchmark settings: {', '.join(sorted(unknown))}")
    vars(args).update(given)
    args.out = CRASH_LOGS / "result.json"
    return args


def quota(args: argparse.Namespace) -> float:
    """Each emulated node's CPU quota in cores: the machine's cores over the largest of ``nodes``, the same at every
    node count (a node is a fixed-size board)."""
    return (os.cpu_count() or 1) / max(args.nodes)


def cpu_note(args: argparse.Namespace, cpus: float) -> str:
    """How the nodes got their CPU: each emulated node's quota, or the machine shared by plain processes."""
    reason = can_emulate()
    if reason is None and args.presets != ["none"]:
        return (f"Each emulated node: {cpus:.2f} of this machine's {os.cpu_count()} cores (cgroup quota, the same "
                "at every node count).")
    return f"Not emulated ({reason or 'preset none'}): nodes share the machine's {os.cpu_count()} cores."


def footer(rows: list[dict[str, Any]], local_batch_norm: bool | None = None) -> list[str]:
    """The lines under a table: how its nodes were emulated and, for training tables (``local_batch_norm`` given),
    where BatchNorm normalised."""
    emulations = sorted({r["emulation"] for r in rows if r.get("emulation")})
    out = ["", "Emulation: " + " / ".join(emulations)] if emulations else []
    if local_batch_norm is not None:
        out += ["", "BatchNorm: " + ("each node over its own slice" if local_batch_norm
                                     else "over the global batch (NOTE [ Cross-node BatchNorm ]; periodic averaging: "
                                     "each node over its own slice)")]
    return out
