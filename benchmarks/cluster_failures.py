"""What a failed node costs a data-parallel cluster, and what the saves that keep that cost small cost.

Three ``cluster local`` nodes of the small token model, one failure each on node 1 at step 4 or later, once the warm
spares are ready (NOTE [ Warm spares ]): a node killed (SIGKILL), stopped (SIGSTOP: a hung node) and, as root, cut
off (its link taken down) on gigabit veth links and on ``wifi20`` links through the delaying switch. Per failure:
detection time (fault to the supervisor seeing it), restarts, steps lost and repeated, the stall (the last step
logged before the failure to the first one after it), and the longest heartbeat gap of a healthy node (the margin of
the heartbeat timeout against a false alarm). The rounds go over the failures (each once, then again), so a change
in the machine's load spreads over all of them. Each run has enough samples that the idle-priority spares are ready
before its fault (the cut on gigabit links more: its steps are the fastest, and spares in network namespaces under a
CPU quota take longer); a run that ends first injects no fault, and the table counts the runs that did.

Beside it, the **save** row: durable saves of a ResNet-18 training state with momentum, what rank 0 pays every
``save_every`` steps so that a restart loses no step.

Without root (no network namespaces) the cuts are skipped and the table says why.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._cluster import failures as family
from benchmarks._cluster.common import load_average, log, node_environment
from benchmarks._cluster.failures import failure_row, failure_run, state_save_row
from edgetrain.bench.stats import Spread
from edgetrain.distributed.netns import can_emulate

TITLE = "Cluster: a node killed, hung or cut off"

# (label, fault, network preset or None for plain processes, samples): batch 6, 80% for training.
CASES = (("kill", "kill", None, 2400), ("stop", "stop", None, 2400), ("cut (gigabit)", "cut", "gigabit", 4800),
         ("cut (wifi20)", "cut", "wifi20", 480))
QUICK_CASES = (("kill", "kill", None, 1200), ("stop", "stop", None, 1200), ("cut (gigabit)", "cut", "gigabit", 1200))
REPEATS, QUICK_REPEATS = 3, 1
CPUS_PER_NODE = 1.0   # each emulated node's CPU quota in cores: 3 nodes on a 2-core machine overcommit it
SAVE_MODEL = "resnet18_cifar"
SAVES, QUICK_SAVES = 10, 3


def run(quick: bool) -> dict[str, Any]:
    """Every case ``REPEATS`` times, in rounds over the cases, then the saves; one intra-op thread in each node."""
    cases = QUICK_CASES if quick else CASES
    repeats = QUICK_REPEATS if quick else REPEATS
    reason = can_emulate()
    skipped = {label: f"needs the network emulation: {reason}" for label, _, preset, _ in cases
               if preset is not None and reason is not None}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in cases if label not in skipped}
    load_before = load_average()
    with node_environment(), tempfile.TemporaryDirectory(prefix="bench-cluster-failures-") as scratch:
        for repeat in range(repeats):
            for label, kind, preset, samples in cases:
                if label in skipped:
                    continue
                folder = Path(scratch) / f"{re.sub(r'[^a-z0-9]+', '-', label)}{repeat}"
                runs[label].append(failure_run(folder, kind, CPUS_PER_NODE, samples, preset))
                log.info("failure %s round %d: %s", label, repeat, runs[label][-1])
        save = state_save_row(SAVE_MODEL, QUICK_SAVES if quick else SAVES, Path(scratch) / "saves")
    rows = []
    for label, kind, preset, samples in cases:
        row = {"kind": label, "skipped": skipped[label]} if label in skipped else failure_row(label, runs[label])
        rows.append({**row, "fault": kind, "preset": preset, "samples": samples})
    return {"failures": rows, "save": [save], "repeats": repeats, "cpus_per_node": CPUS_PER_NODE,
            "cores": os.cpu_count(), "load_before": load_before, "load_after": load_average()}




def _medians(result: dict[str, Any], key: str) -> list[float]:
    return [Spread.from_dict(r[key]).median for r in result["failures"] if r.get(key)]


def headline(result: dict[str, Any]) -> str:
    """The README's figure: the slowest failure's median detection and stall, and the steps lost over every run."""
    rows = [r for r in result["failures"] if "skipped" not in r]
    lost = sum(n for r in rows for n in r["steps_lost"] if n is not None)
    injected = sum(r["injected"] for r in rows)
    if not injected:
        return "no fault was injected (the runs ended before their spares were ready)"
    return (f"detected in at most {max(_medians(result, 'detection_s')):.2f} s, at most "
            f"{max(_medians(result, 'stall_s')):.2f} s of stall (medians), "
            + ("no step lost" if lost == 0 else f"{lost} steps lost") + f" in {injected} runs")


def render(result: dict[str, Any]) -> str:
    """The setup, the headline, the failure table and the save row, and how the nodes were emulated."""
    rows = [r for r in result["failures"] if "skipped" not in r]
    cases = ", ".join(f"{r['kind']}: {r['samples']} samples" + (f", {r['preset']} links" if r["preset"] else
                                                                ", plain processes") for r in result["failures"])
    walls = [run["wall_s"] for r in rows for run in r["runs"]]
    lines = [f"3 nodes, each {result['cpus_per_node']:g} core (cgroup quota where emulated) of {result['cores']}; "
             f"{result['repeats']} runs per failure, in rounds. Cases: {cases}. A run took "
             f"{statistics.median(walls):.0f} s (median)." if walls else "", "",
             f"**{headline(result)}.**"]
    lines += family.render(result)
    emulations = sorted({r["emulation"] for r in rows if r.get("emulation")})
    lines += ["", "Emulation: " + " / ".join(emulations)] if emulations else []
    return "\n".join(lines) + "\n"

