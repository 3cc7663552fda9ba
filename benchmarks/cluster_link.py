"""What an emulated link delivers between two nodes: round trips, throughput and the switch's counters.

Two nodes in network namespaces joined by each link (a preset, or ``NAME@MS``: NAME's rate through the user-space
delaying switch with MS ms one way): one-byte TCP round trips (the spread over every ping of every probe, and the
minimum), bulk TCP throughput over about 2 s of the link's rate (the spread over the probes), and the switch's
counters (frames forwarded, lost, dropped at a full queue) with its CPU seconds per probe. These are the links the
other cluster benchmarks train over, measured rather than taken from their presets.

Needs root (network namespaces); without it the page says why nothing was measured.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks._cluster import link, quota, settings
from edgetrain.distributed.netns import can_emulate

TITLE = "Cluster: what the emulated links deliver"
FULL = {"links": ["wifi20", "wifi20-lossy", "100mbit", "100mbit@5", "gigabit@5"], "pings": 50, "repeats": 3}
QUICK = {"links": ["wifi20", "100mbit@5"], "pings": 20, "repeats": 1}


def run(quick: bool) -> dict[str, Any]:
    """Every link of :data:`QUICK` or :data:`FULL`, its probes in one emulation each."""
    args = settings(**(QUICK if quick else FULL))
    reason = can_emulate()
    if reason is not None:
        return {"skipped": f"needs the network emulation: {reason}", "link": []}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-link-") as scratch:
        rows = link.link(args, Path(scratch), quota(args))
    return {"pings": args.pings, "link": rows}


def headline(result: dict[str, Any]) -> str:
    """Each link's median round trip and bulk throughput."""
    if result.get("skipped"):
        return result["skipped"]
    return "; ".join(f"{r['link']}: round trip {r['rtt_s']['median'] * 1e3:.3g} ms, "
                     f"{r['throughput_bps']['median'] / 1e6:.1f} of {r['rate_bps'] / 1e6:g} Mbit/s"
                     for r in result["link"])


def render(result: dict[str, Any]) -> str:
    """The link table and how each link was emulated."""
    if result.get("skipped"):
        return f"Not measured: {result['skipped']}.\n"
    out = [f"{result['pings']} one-byte round trips per probe. **{headline(result)}.**", "", *link.render(result)]
    out += ["", "Emulation: " + " / ".join(sorted({r["emulation"] for r in result["link"]}))]
    return "\n".join(out) + "\n"
