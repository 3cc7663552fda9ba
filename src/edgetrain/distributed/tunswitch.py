"""A user-space layer-3 switch between the emulated nodes' TUN devices: each link's rate, one-way delay and loss.

NOTE [ The delaying switch ]
This kernel has no ``netem``, so a link's latency cannot be a qdisc. Instead each node's
namespace gets a TUN device as its ``eth0`` (no veth, no bridge) and this process, in the host
namespace, holds the other end of every TUN: it reads each IPv4 packet a node sends, looks up
the node the destination address belongs to, and writes the packet into that node's TUN once
it is due. Every protocol, gloo's full mesh of direct TCP connections included, crosses it, so
every connection sees the delay; no proxy has to know the connections.

A packet of ``n`` bytes from node ``a`` to node ``b`` read at time ``t`` (store and forward, the
switched Ethernet the presets stand for):

* it is dropped with probability ``1 - (1 - loss)^f``, ``f`` the 1500-byte Ethernet frames it
  would take (``loss`` is per frame, as on the real link, though the TUN carries 64 KB packets;
  one draw per packet from a seeded generator);
* it leaves ``a``'s up-link at ``up_a = max(t, up_free_a) + 8 n / rate`` and then crosses ``b``'s
  down-link: ``down_b = max(up_a, down_free_b) + 8 n / rate``; a packet that would wait longer
  than ``queue_s`` for either link is dropped (the queue limit ``tc tbf`` has on the veths);
* it is written into ``b``'s TUN at ``down_b + delay_s``.

Each destination's due times only grow, so packets between two nodes are never reordered. The
TUN devices have a 64 KB MTU, so a bulk transfer is ~200 packets/s per 100 Mbit/s: the Python
loop's cost stays small, but it is real CPU on the machine the nodes share, and a packet waits
for the loop when the loop waits for a core (the switch runs at nice -10 as root to keep that
short). ``cut N`` / ``mend N`` on stdin drop every packet to and from node ``N`` (a partition),
``stats`` prints the counters and the CPU seconds used as a JSON line; end of stdin (the parent gone) ends the switch,
and with it every TUN device (they are not persistent).

Run as a script by path (``python tunswitch.py SPEC_JSON``), so that it imports only the
standard library; it prints ``ready`` once every TUN device exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import json
import os
import random
import select
import struct
import sys
import time
from dataclasses import dataclass, field

__all__ = ["ETHERNET_FRAME_BYTES", "SwitchSpec", "Switch", "TUN_MTU_BYTES", "open_tun"]

TUN_MTU_BYTES = 65_000
ETHERNET_FRAME_BYTES = 1500  # the unit ``loss`` is given per: a 64 KB packet is lost if any of its frames would be
_READS_PER_TURN = 64
_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000


@dataclass(frozen=True)
class SwitchSpec:
    """What the switch joins: ``devices[i]`` is node ``i``'s TUN name, ``addresses[i]`` its IPv4 address."""

    devices: list[str]
    addresses: list[str]
    rate_bps: float
    delay_s: float
    loss: float
    seed: int
    queue_s: float


def open_tun(name: str) -> int:
    """A new (non-persistent) TUN device ``name``, raw IP packets, non-blocking; it exists while the fd is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Switch:
    """The forwarding state (NOTE [ The delaying switch ]); :meth:`receive` and :meth:`due` are pure of I/O."""

    spec: SwitchSpec
    up_free_s: list[float] = field(default_factory=list)
    down_free_s: list[float] = field(default_factory=list)
    cut: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("forwarded", "lost", "queue_full", "cut", "unknown"), 0))

    def __post_init__(self) -> None:
        nodes = len(self.spec.devices)
        self.up_free_s, self.down_free_s = [0.0] * nodes, [0.0] * nodes
        self._node_of = {bytes(int(x) for x in a.split(".")): i for i, a in enumerate(self.spec.addresses)}
        self._rng = random.Random(self.spec.seed)
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._sequence = 0

    def receive(self, source: int, packet: bytes, now_s: float) -> None:
        """Queue ``packet``, read from node ``source`` at ``now_s``, or count why it is dropped."""
        target = self._node_of.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
        if target is None:
            self.counts["unknown"] += 1
            return
        if source in self.cut or target in self.cut:
            self.counts["cut"] += 1
            return
        frames = -(-len(packet) // ETHERNET_FRAME_BYTES)
        if self.spec.loss > 0 and self._rng.random() >= (1 - self.spec.loss) ** frames:
            self.counts["lost"] += 1
            return
        wire_s = 8 * len(packet) / self.spec.rate_bps
        up_start_s = max(now_s, self.up_free_s[source])
        down_start_s = max(up_start_s + wire_s, self.down_free_s[target])
        if up_start_s - now_s > self.spec.queue_s or down_start_s - (up_start_s + wire_s) > self.spec.queue_s:
            self.counts["queue_full"] += 1
            return
        self.up_free_s[source] = up_start_s + wire_s
        self.down_free_s[target] = down_start_s + wire_s
        self._sequence += 1
        heapq.heappush(self._heap, (down_start_s + wire_s + self.spec.delay_s, self._sequence, target, packet))

    def due(self, now_s: float) -> list[tuple[int, bytes]]:
        """The packets due by ``now_s`` as (target node, packet), in due order."""
        out = []
        while self._heap and self._heap[0][0] <= now_s:
            _, _, target, packet = heapq.heappop(self._heap)
            out.append((target, packet))
        self.counts["forwarded"] += len(out)
        return out

    def next_due_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None


def serve(spec: SwitchSpec) -> None:
    """Create the TUN devices, say ``ready``, forward until stdin ends (NOTE [ The delaying switch ])."""
    fds = [open_tun(name) for name in spec.devices]
    node_of_fd = {fd: i for i, fd in enumerate(fds)}
    live = list(fds)
    switch = Switch(spec)
    control, pending = sys.stdin.fileno(), b""
    print("ready", flush=True)
    while True:
        next_s = switch.next_due_s()
        wait_s = None if next_s is None else max(0.0, next_s - time.monotonic())
        readable, _, _ = select.select([control, *live], [], [], wait_s)
        for fd in readable:
            if fd == control:
                chunk = os.read(control, 4096)
                if not chunk:
                    return
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    _command(switch, line.decode())
                continue
            now_s = time.monotonic()
            try:  # at most a batch per device and turn, so one busy sender cannot starve the others
                for _ in range(_READS_PER_TURN):
                    if (packet := _read(fd)) is None:
                        break
                    switch.receive(node_of_fd[fd], packet, now_s)
            except OSError:  # the device went with its namespace (the emulation being removed)
                live.remove(fd)
        for target, packet in switch.due(time.monotonic()):
            try:
                os.write(fds[target], packet)
            except OSError:  # the node's device is down (its namespace going): the packet is lost
                switch.counts["unknown"] += 1


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, TUN_MTU_BYTES + 4096)
    except BlockingIOError:
        return None


def _command(switch: Switch, line: str) -> None:
    word, *rest = line.split() or [""]
    if word == "cut":
        switch.cut.add(int(rest[0]))
    elif word == "mend":
        switch.cut.discard(int(rest[0]))
    elif word == "stats":
        times = os.times()
        print(json.dumps({**switch.counts, "cpu_s": times.user + times.system}), flush=True)


def main() -> None:
    spec = SwitchSpec(**json.loads(sys.argv[1]))
    if os.geteuid() == 0:
        os.nice(-10)
    with contextlib.suppress(KeyboardInterrupt):
        serve(spec)


if __name__ == "__main__":
    main()
