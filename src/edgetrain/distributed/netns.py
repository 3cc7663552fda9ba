"""A network of edge nodes on one machine: a namespace, a shaped link and a CPU/memory cgroup per node.

NOTE [ What the emulation is ]
Each node runs in its own network namespace, joined to a bridge in the host by a veth pair;
``tc tbf`` shapes both directions of every link to the preset's rate (so all traffic, including
the all-reduce ring, crosses shaped links) and ``GLOO_SOCKET_IFNAME`` makes gloo use that link.
Each node is also in its own cgroup v1: ``cpu.cfs_quota_us`` gives it a share of the cores
(on this 2-core machine four nodes get half a core each) and ``memory.limit_in_bytes`` its budget.

Not emulated here: *latency* and *loss*. This kernel has no ``netem``, no ``iptables`` binary
and no ``gact`` action for ``tc``, and a user-space delaying proxy does not fit gloo's full
mesh of direct connections; so the Wi-Fi preset's 20 Mbit/s is its bandwidth only. A *cut
link* is the node's veth taken down (``ip link set ... down``), which drops every packet both
ways. Without root, nodes run as plain local processes: no shaping, no cgroups, and the
caller is told so.

Everything created is recorded as it is made and removed in reverse order on exit, on
SIGTERM/SIGINT, and at interpreter exit, also when creating a later piece failed; that includes
the ``/run/netns`` bind mount ``ip netns add`` makes, when this run made it and no namespace is
left in it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from ..cgroups import remove_cgroup
from .group import ClusterError

__all__ = ["PRESETS", "LinkPreset", "NetworkEmulation", "can_emulate", "NOT_EMULATED"]

log = logging.getLogger(__name__)

NOT_EMULATED = "latency and loss are not emulated (no netem, iptables or tc gact on this kernel)"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_RUN_DIR = "/run/netns"
_CFS_PERIOD_US = 100_000
# How long a packet may wait in a link's tbf queue before it is dropped. Short queues (50 ms)
# drop the small heartbeat packets behind an all-reduce's burst, and TCP's retransmission
# back-off then delays a beat by seconds: a healthy node looked hung. 400 ms holds the burst.
TBF_QUEUE = "400ms"


@dataclass(frozen=True)
class LinkPreset:
    """A link's bandwidth (``rate_bps``, bits/s) and, for the record, the latency it would have (not emulated)."""

    name: str
    rate_bps: int
    latency_s: float
    source: str


PRESETS: dict[str, LinkPreset] = {
    "gigabit": LinkPreset("gigabit", 1_000_000_000, 0.0002, "the Raspberry Pi 4 cluster's switched Gigabit "
                          "Ethernet (seed 004)"),
    "100mbit": LinkPreset("100mbit", 100_000_000, 0.0005, "Fast Ethernet, the issue's slow-link case"),
    "wifi20": LinkPreset("wifi20", 20_000_000, 0.005, "20 Mbit/s Wi-Fi (latency not emulated)"),
}


def can_emulate() -> str | None:
    """None when this process can build the emulation, else why not (the fallback's reason)."""
    if os.geteuid() != 0:
        return "not root: nodes run as plain local processes, without namespaces, shaping or cgroups"
    for controller in ("cpu", "memory"):
        if not (CGROUP_ROOT / controller / "tasks").exists():
            return f"no cgroup v1 {controller} controller at {CGROUP_ROOT / controller}"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "the ip command cannot manage network namespaces here"
    return None


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(command)}: {done.stderr.strip() or f'exit {done.returncode}'}")


class NetworkEmulation:
    """The namespaces, bridge, veths, qdiscs and cgroups of ``nodes`` emulated nodes (NOTE [ What the emulation is ]).

    Args:
        nodes: how many nodes.
        preset: a :data:`PRESETS` name.
        cpus_per_node: each node's CPU quota in cores (default: this machine's cores / nodes).
        memory_bytes: each node's memory limit (None: not limited), one per node.

    Example:
        >>> with NetworkEmulation(4, "100mbit") as net:   # doctest: +SKIP
        ...     command = net.wrap(0, ["python", "-m", "edgetrain.distributed.worker", "spec.json"])
    """

    def __init__(self, nodes: int, preset: str, *, cpus_per_node: float | None = None,
                 memory_bytes: list[int | None] | None = None) -> None:
        if preset not in PRESETS:
            raise ClusterError(f"unknown network preset {preset!r}; valid: {', '.join(PRESETS)}")
        self.nodes, self.preset = nodes, PRESETS[preset]
        self.cpus_per_node = cpus_per_node if cpus_per_node is not None else (os.cpu_count() or 1) / nodes
        self.memory_bytes = memory_bytes or [None] * nodes
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"etb{tag}"
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() // 50 % 250}"
        self.names = [f"et{tag}n{i}" for i in range(nodes)]
        self._undo: list[Callable[[], None]] = []
        self._previous: dict[int, object] = {}

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node + 2}"

    @property
    def interface(self) -> str:
        """The name of every node's link inside its namespace (GLOO_SOCKET_IFNAME)."""
        return "eth0"

    def cgroup(self, controller: str, node: int) -> Path:
        return CGROUP_ROOT / controller / f"edgetrain-cluster-{self.names[node]}"

    def describe(self) -> str:
        """One line saying what each node gets, for every output that shows a figure."""
        memory = ", ".join("unlimited" if m is None else f"{m / 2**20:.0f} MiB" for m in self.memory_bytes)
        return (f"{self.nodes} nodes in network namespaces on one {os.cpu_count()}-core machine, each with "
                f"{self.cpus_per_node:.2f} core(s) (cgroup cpu quota), memory {memory}; links {self.preset.name} "
                f"({self.preset.rate_bps / 1e6:g} Mbit/s, tc tbf each way); {NOT_EMULATED}")

    def __enter__(self) -> NetworkEmulation:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds through every finally, then __exit__ removes the network

    def _made(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def _build(self) -> None:
        if not _mounted(NETNS_RUN_DIR):  # `ip netns add` bind-mounts it: ours to undo, once unused
            self._made(_unmount_netns_dir_if_unused)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made(functools.partial(_run, "ip", "link", "del", self.bridge))
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        rate = f"{self.preset.rate_bps}bit"
        burst = f"{max(32_000, self.preset.rate_bps // 8 // 250)}b"  # at least one tick's worth at 250 Hz
        for node, name in enumerate(self.names):
            _run("ip", "netns", "add", name)
            self._made(functools.partial(_run, "ip", "netns", "del", name))
            host_end = f"{name}h"
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", self.interface, "netns", name)
            self._made(functools.partial(_run, "ip", "link", "del", host_end))
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            _run("ip", "-n", name, "addr", "add", f"{self.address(node)}/24", "dev", self.interface)
            _run("ip", "-n", name, "link", "set", self.interface, "up")
            _run("ip", "-n", name, "link", "set", "lo", "up")
            _run("tc", "qdisc", "add", "dev", host_end, "root", "tbf", "rate", rate, "burst", burst, "latency",
                 TBF_QUEUE)
            _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", self.interface, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", TBF_QUEUE)
            self._make_cgroups(node)

    def _make_cgroups(self, node: int) -> None:
        cpu, memory = self.cgroup("cpu", node), self.cgroup("memory", node)
        for path in (cpu, memory):
            path.mkdir()
            self._made(functools.partial(remove_cgroup, path))
        (cpu / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(self.cpus_per_node * _CFS_PERIOD_US)))
        limit = self.memory_bytes[node]
        if limit is not None:
            (memory / "memory.limit_in_bytes").write_text(str(limit))

    def wrap(self, node: int, command: list[str], *, memory: bool = True) -> list[str]:
        """``command`` run in node ``node``'s cgroups and namespace; outside its memory cgroup with
        ``memory=False`` (a warm spare, moved in by :meth:`admit` when it takes the node's place)."""
        join = " ".join(f"echo $$ > {self.cgroup(c, node)}/tasks;" for c in ("cpu", "memory")[:2 if memory else 1])
        return ["sh", "-c", f'{join} exec ip netns exec {self.names[node]} "$@"', "sh", *command]

    def admit(self, node: int, pid: int) -> None:
        """Move process ``pid`` into node ``node``'s memory cgroup (its pages resident so far stay charged where
        they were: this kernel has no ``memory.move_charge_at_immigrate``)."""
        (self.cgroup("memory", node) / "tasks").write_text(str(pid))

    def env(self, node: int) -> dict[str, str]:
        """What a node's process needs in its environment to use its link."""
        return {"GLOO_SOCKET_IFNAME": self.interface}

    def cut(self, node: int) -> None:
        """Cut node ``node``'s link (every packet dropped both ways) until :meth:`mend`."""
        _run("ip", "link", "set", f"{self.names[node]}h", "down")

    def mend(self, node: int) -> None:
        _run("ip", "link", "set", f"{self.names[node]}h", "up")

    def close(self) -> None:
        """Remove everything made, newest first; a piece already gone is skipped."""
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except (ClusterError, OSError) as exc:
                log.warning("cleaning up the emulated network: %s", exc)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
        atexit.unregister(self.close)


def _unmount_netns_dir_if_unused() -> None:
    """Unmount the ``/run/netns`` bind mount ``ip netns add`` made, unless a namespace (another run's) still uses it."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip()
    if not names and _mounted(NETNS_RUN_DIR):
        _run("umount", NETNS_RUN_DIR)


def _mounted(path: str) -> bool:
    """Whether ``path`` is a mount point (a bind mount of the same file system too, which ``ismount`` misses)."""
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4] == path for line in mounts)

