"""The **link** table: what an emulated link delivers between two nodes.

One-byte TCP round trips (spread over every ping of every probe) and bulk TCP throughput (spread over the probes),
the switch's counters: the links the other tables' runs train over, measured rather than taken from their presets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from edgetrain.distributed.netns import PRESETS, LinkPreset, NetworkEmulation

from .common import log, name_list, spread_of, spread_text


def add_options(parser: argparse.ArgumentParser) -> None:
    """The link table's own options."""
    parser.add_argument("--links", type=name_list,
                        default=["wifi20", "wifi20-lossy", "100mbit", "100mbit@5", "gigabit@5"],
                        help="links of the link table (NAME@MS: NAME's rate through the switch, MS ms one way)")
    parser.add_argument("--pings", type=int, default=50)


# The link probe: node 1 echoes single bytes (round trips), then counts a bulk transfer's bytes; node 0 times both.
_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5001)); s.listen()
print("up", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)) != b"x":
    c.sendall(b)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
"""
_PROBE = """
import json, socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); s.sendall(b"p"); s.recv(1); rtts.append(time.perf_counter() - t)
s.sendall(b"x"); s.close()
s, chunk, n = socket.create_connection((sys.argv[1], 5001)), bytes(1 << 16), int(sys.argv[2]) >> 16
t = time.perf_counter()
for _ in range(n):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1)  # returns when node 1 has read everything and closed
print(json.dumps({"rtts_s": rtts, "bulk_bytes": n << 16, "bulk_s": time.perf_counter() - t}))
"""


def _link_presets(names: list[str]) -> list[LinkPreset]:
    """Presets by name; ``NAME@DELAY_MS`` is NAME's rate through the switch with that one-way delay (the
    forwarder's ceiling at a given rate)."""
    out = []
    for name in names:
        base, _, delay_ms = name.partition("@")
        preset = PRESETS[base]
        out.append(preset if not delay_ms else LinkPreset(name, preset.rate_bps, float(delay_ms) / 1e3, preset.loss,
                                                          f"{base} through the delaying switch"))
    return out


def link(args: argparse.Namespace, scratch: Path, cpus: float) -> list[dict[str, Any]]:
    """What the emulated link delivers between two nodes, ``--repeats`` probes per link in one emulation: TCP round
    trips of one byte (``--pings`` per probe, their spread pooled over the probes, and the minimum), bulk TCP
    throughput over about 2 s of the preset's rate (its spread over the probes), the switch's counters (summed) and
    its CPU seconds per probe."""
    rows = []
    for preset in _link_presets(args.links):
        with NetworkEmulation(2, preset, cpus_per_node=cpus) as net:
            probes = [_link_probe(net, preset, args.pings) for _ in range(args.repeats)]
        rtts_s = [t for p in probes for t in p["rtts_s"]]
        counts = [p["switch"] for p in probes if p["switch"]]
        rows.append({"link": preset.name, "rate_bps": preset.rate_bps, "delay_s": preset.delay_s, "loss": preset.loss,
                     "switched": preset.switched, "repeats": args.repeats, "rtt_s": spread_of(rtts_s),
                     "rtt_min_s": min(rtts_s), "throughput_bps": spread_of([p["throughput_bps"] for p in probes]),
                     "switch": {k: sum(c[k] for c in counts) for k in counts[0] if k != "cpu_s"} if counts else {},
                     "switch_cpu_s": spread_of([c["cpu_s"] for c in counts if "cpu_s" in c]),
                     "probes": probes, "emulation": net.describe()})
        log.info("link %s", rows[-1])
    return rows


def _link_probe(net: NetworkEmulation, preset: LinkPreset, pings: int) -> dict[str, Any]:
    """One probe: node 1 echoes, node 0 times ``pings`` round trips and one bulk transfer."""
    import sys

    echo = subprocess.Popen(net.wrap(1, [sys.executable, "-c", _ECHO, net.address(1)]), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert echo.stdout is not None
        echo.stdout.readline()
        before = net.switch_counts() if preset.switched else {}
        bulk_bytes = max(1 << 20, int(preset.rate_bps * 2 / 8))
        probe = subprocess.run(net.wrap(0, [sys.executable, "-c", _PROBE, net.address(1), str(bulk_bytes),
                                            str(pings)]), capture_output=True, text=True, check=True)
        after = net.switch_counts() if preset.switched else {}
    finally:
        echo.kill()
        echo.wait()
    measured = json.loads(probe.stdout)
    return {"rtts_s": measured["rtts_s"], "throughput_bps": measured["bulk_bytes"] * 8 / measured["bulk_s"],
            "switch": {k: after[k] - before[k] for k in after}}


def _scaled(value: dict[str, Any] | None, factor: float) -> dict[str, Any] | None:
    """A :func:`spread_of` dict in other units (the CoV is unchanged)."""
    if value is None:
        return None
    return {**value, **{k: value[k] * factor for k in ("median", "q1", "q3", "iqr")}}


def render(result: dict[str, Any]) -> list[str]:
    """The link table's markdown lines (none when ``result`` has no link table)."""
    out: list[str] = []
    if "link" in result:
        out += ["| link | rate Mbit/s | one-way delay ms | frame loss | probes | TCP round trip ms, all pings "
                "(median, IQR, CoV) | min ms | bulk TCP Mbit/s over probes | switch: forwarded, lost, queue full | "
                "switch CPU s per probe |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result.get("link", []):
        sw = r["switch"]
        counts = f"{sw['forwarded']:.0f}, {sw['lost']:.0f}, {sw['queue_full']:.0f}" if sw else "- (veth + tc tbf)"
        out.append(f"| {r['link']} | {r['rate_bps'] / 1e6:g} | {r['delay_s'] * 1e3:g} | {r['loss']:.1%} | "
                   f"{r['repeats']} | {spread_text(_scaled(r['rtt_s'], 1e3))} | "
                   f"{r['rtt_min_s'] * 1e3:.2f} | "
                   f"{spread_text(_scaled(r['throughput_bps'], 1e-6), '{:.1f}')} | {counts} | "
                   f"{spread_text(r['switch_cpu_s'], '{:.2f}')} |")
    return out
