"""A network of edge nodes on one machine: a namespace, a shaped link and a CPU/memory cgroup per node.

NOTE [ What the emulation is ]
Each node runs in its own network namespace, joined to a bridge in the host by a veth pair;
``tc tbf`` shapes both directions of every link to the preset's rate (so all traffic, including
the all-reduce ring, crosses shaped links) and ``GLOO_SOCKET_IFNAME`` makes gloo use that link.
Each node is also in its own cgroup v1: ``cpu.cfs_quota_us`` gives it a share of the cores
(on this 2-core machine four nodes get half a core each) and ``memory.limit_in_bytes`` its budget.

A preset with a one-way *delay* or a *loss* rate (``wifi20``) is built differently: each
namespace's ``eth0`` is a TUN device whose other end a user-space switch in the host holds
(NOTE [ The delaying switch ] in ``tunswitch.py``): it forwards every IPv4 packet to the
destination node's TUN after the link's serialisation at the preset's rate (both ways, the
same 400 ms queue limit) and its one-way delay, and drops packets at the preset's loss rate
(seeded). This kernel has no ``netem``, no ``iptables`` binary and no ``gact`` action for ``tc``;
a per-connection proxy would not fit gloo's full mesh of direct connections, a switch under
every connection does. The presets without a delay (``gigabit``, ``100mbit``) keep the veths and
``tc tbf``: their sub-millisecond latency is not emulated. A *cut link* is the node's veth taken
down (``ip link set ... down``), or with the switch every packet to and from the node dropped.
Without root, nodes run as plain local processes: no shaping, no cgroups, and the caller is
told so.

Everything created is recorded as it is made and removed in reverse order on exit, on
SIGTERM/SIGINT, and at interpreter exit, also when creating a later piece failed; that includes
the ``/run/netns`` bind mount ``ip netns add`` makes, when this run or another edgetrain run
still using it made it (two runs side by side: the one that made it may end first), once no
namespace is left in it. A run killed outright (SIGKILL, a power cut) cannot remove its own: every name
carries its supervisor's pid, and the next emulation to start removes the pieces of every supervisor
that is gone (:func:`remove_stale_networks`), as ``cluster local`` does with its scratch folders.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, TracebackType

from ..sysutil.cgroups import remove_cgroup
from ..sysutil.processes import dies_with_this_process, pid_running
from .group import ClusterError
from .tunswitch import TUN_MTU_BYTES, SwitchSpec

__all__ = ["PRESETS", "LinkPreset", "NetworkEmulation", "can_emulate", "remove_stale_networks", "NOT_EMULATED"]

log = logging.getLogger(__name__)

NOT_EMULATED = "latency and loss are not emulated"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_RUN_DIR = "/run/netns"
# NetworkEmulation's names, each with its supervisor's pid: namespaces, their cgroups, the bridge
EDGETRAIN_NAMESPACE = re.compile(r"et(\d+)n\d+")
_EDGETRAIN_CGROUP = re.compile(r"edgetrain-cluster-et(\d+)n\d+")
_EDGETRAIN_BRIDGE = re.compile(r"etb(\d+)")
_CFS_PERIOD_US = 100_000
# How long a packet may wait in a link's tbf queue before it is dropped. Short queues (50 ms)
# drop the small heartbeat packets behind an all-reduce's burst, and TCP's retransmission
# back-off then delays a beat by seconds: a healthy node looked hung. 400 ms holds the burst.
TBF_QUEUE = "400ms"
QUEUE_S = 0.4  # the same limit in the delaying switch


@dataclass(frozen=True)
class LinkPreset:
    """A link: its bandwidth (``rate_bps``, bits/s), one-way delay (``delay_s``) and loss per 1500-byte frame.

    A delay or a loss puts the nodes behind the delaying switch (NOTE [ What the emulation is ]).
    """

    name: str
    rate_bps: int
    delay_s: float
    loss: float
    source: str

    @property
    def switched(self) -> bool:
        return self.delay_s > 0 or self.loss > 0


PRESETS: dict[str, LinkPreset] = {
    "gigabit": LinkPreset("gigabit", 1_000_000_000, 0.0, 0.0, "the Raspberry Pi 4 cluster's switched Gigabit "
                          "Ethernet (Mwase et al., AAAI 2024); its ~0.1 ms latency is not emulated"),
    "100mbit": LinkPreset("100mbit", 100_000_000, 0.0, 0.0, "Fast Ethernet, the slow wired link; "
                          "latency not emulated"),
    "wifi20": LinkPreset("wifi20", 20_000_000, 0.005, 0.0, "20 Mbit/s Wi-Fi; 5 ms one way (10 ms round trip) is "
                         "assumed, the order of a lightly loaded 802.11n/ac hop to the access point, not measured"),
    "wifi20-lossy": LinkPreset("wifi20-lossy", 20_000_000, 0.005, 0.01, "wifi20 with 1% of 1500-byte frames lost "
                               "(assumed, a poor Wi-Fi link after retries)"),
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


def exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """A handler for SIGTERM/SIGINT that raises SystemExit, so the signal unwinds through every ``finally``
    (and context manager exit) that removes a network or kills nodes, instead of ending the process at once."""
    raise SystemExit(128 + signum)


class NetworkEmulation:
    """The namespaces, bridge, veths, qdiscs and cgroups of ``nodes`` emulated nodes (NOTE [ What the emulation is ]).

    Args:
        nodes: how many nodes.
        preset: a :data:`PRESETS` name, or a link of your own.
        cpus_per_node: each node's CPU quota in cores (default: this machine's cores / nodes).
        memory_bytes: each node's memory limit (None: not limited), one per node.
        seed: the delaying switch's loss draws.

    Example:
        >>> with NetworkEmulation(4, "100mbit") as net:   # doctest: +SKIP
        ...     command = net.wrap(0, ["python", "-m", "edgetrain.distributed.worker", "spec.json"])
    """

    def __init__(self, nodes: int, preset: str | LinkPreset, *, cpus_per_node: float | None = None,
                 memory_bytes: list[int | None] | None = None, seed: int = 0) -> None:
        if isinstance(preset, str) and preset not in PRESETS:
            raise ClusterError(f"unknown network preset {preset!r}; valid: {', '.join(PRESETS)}")
        self.nodes, self.preset = nodes, PRESETS[preset] if isinstance(preset, str) else preset
        self.seed = seed
        self.cpus_per_node = cpus_per_node if cpus_per_node is not None else (os.cpu_count() or 1) / nodes
        self.memory_bytes = memory_bytes or [None] * nodes
        tag = str(os.getpid())  # interface names stay within 15 characters: et<7 digits>n<node>h
        self.bridge = f"etb{tag}"
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() // 50 % 250}"
        self.names = [f"et{tag}n{i}" for i in range(nodes)]
        self._undo: list[Callable[[], None]] = []
        self._switch: subprocess.Popen[str] | None = None
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
        link = self.preset
        how = (f"{link.delay_s * 1e3:g} ms one way, {link.loss:.2%} of frames lost, through a user-space TUN "
               f"switch" if link.switched else f"tc tbf each way; {NOT_EMULATED}")
        return (f"{self.nodes} nodes in network namespaces on one {os.cpu_count()}-core machine, each with "
                f"{self.cpus_per_node:.2f} core(s) (cgroup cpu quota), memory {memory}; links {link.name} "
                f"({link.rate_bps / 1e6:g} Mbit/s, {how})")

    def __enter__(self) -> NetworkEmulation:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, exit_on_signal)
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

    def _made(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def _build(self) -> None:
        made_by_edgetrain = _netns_dir_made_by_edgetrain()  # `ip netns add` bind-mounts it: ours to undo, once unused
        remove_stale_networks()
        if made_by_edgetrain:
            self._made(_unmount_netns_dir_if_unused)
        if self.preset.switched:
            self._build_switched()
        else:
            self._build_bridged()
        for node in range(self.nodes):
            self._make_cgroups(node)

    def _add_namespace(self, node: int) -> None:
        _run("ip", "netns", "add", self.names[node])
        self._made(functools.partial(_run, "ip", "netns", "del", self.names[node]))

    def _configure(self, node: int) -> None:
        name = self.names[node]
        _run("ip", "-n", name, "addr", "add", f"{self.address(node)}/24", "dev", self.interface)
        _run("ip", "-n", name, "link", "set", self.interface, "up")
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _build_bridged(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made(functools.partial(_run, "ip", "link", "del", self.bridge))
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        rate = f"{self.preset.rate_bps}bit"
        burst = f"{max(32_000, self.preset.rate_bps // 8 // 250)}b"  # at least one tick's worth at 250 Hz
        for node, name in enumerate(self.names):
            self._add_namespace(node)
            host_end = f"{name}h"
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", self.interface, "netns", name)
            self._made(functools.partial(_run, "ip", "link", "del", host_end))
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            self._configure(node)
            _run("tc", "qdisc", "add", "dev", host_end, "root", "tbf", "rate", rate, "burst", burst, "latency",
                 TBF_QUEUE)
            _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", self.interface, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", TBF_QUEUE)

    def _build_switched(self) -> None:
        """The switch makes a TUN device per node in the host; each is moved into its node's namespace as eth0."""
        if not os.path.exists("/dev/net/tun"):
            raise ClusterError(f"the {self.preset.name} links need TUN devices: no /dev/net/tun (modprobe tun)")
        devices = [f"{name}t" for name in self.names]
        spec = SwitchSpec(devices, [self.address(n) for n in range(self.nodes)], self.preset.rate_bps,
                          self.preset.delay_s, self.preset.loss, self.seed, QUEUE_S)
        script = Path(__file__).with_name("tunswitch.py")
        self._switch = subprocess.Popen([sys.executable, str(script), json.dumps(asdict(spec))], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        preexec_fn=dies_with_this_process())  # NOTE [ Children die with their parent ]
        self._made(self._stop_switch)
        assert self._switch.stdout is not None
        if self._switch.stdout.readline().strip() != "ready":
            raise ClusterError(f"the delaying switch did not start (exit {self._switch.wait()})")
        for node, name in enumerate(self.names):
            self._add_namespace(node)
            _run("ip", "link", "set", devices[node], "netns", name)
            _run("ip", "-n", name, "link", "set", devices[node], "name", self.interface)
            _run("ip", "-n", name, "link", "set", self.interface, "mtu", str(TUN_MTU_BYTES))
            self._configure(node)

    def _stop_switch(self) -> None:
        """End the switch (end of its stdin, then SIGKILL after 5 s); its TUN devices go with it."""
        switch, self._switch = self._switch, None
        if switch is None:
            return
        assert switch.stdin is not None
        with contextlib.suppress(OSError):
            switch.stdin.close()
        try:
            switch.wait(timeout=5)
        except subprocess.TimeoutExpired:
            switch.kill()
            switch.wait()

    def switch_counts(self) -> dict[str, float]:
        """The delaying switch's packet counters (forwarded, lost, queue_full, cut, unknown), its CPU time (cpu_s)."""
        if self._switch is None or self._switch.stdin is None or self._switch.stdout is None:
            raise ClusterError(f"the {self.preset.name} links have no delaying switch")
        self._switch.stdin.write("stats\n")
        self._switch.stdin.flush()
        counts: dict[str, float] = json.loads(self._switch.stdout.readline())
        return counts

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
        """What a node's process needs in its environment: its link, and as many torch threads as its CPU quota
        has cores, rounded up (``OMP_NUM_THREADS``, unless set already).

        Two threads under a half-core quota burn the period's quota in half the time and then wait, throttled:
        a ResNet-18 step of batch 32 took 5.8 s with 2 threads and 3.1 s with 1 (``cluster local --nodes 1
        --netns --cpus-per-node 0.5`` on 2 busy cores).
        """
        threads = os.environ.get("OMP_NUM_THREADS", str(max(1, math.ceil(self.cpus_per_node))))
        return {"GLOO_SOCKET_IFNAME": self.interface, "OMP_NUM_THREADS": threads}

    def cut(self, node: int) -> None:
        """Cut node ``node``'s link (every packet dropped both ways) until :meth:`mend`."""
        self._set_link(node, up=False)

    def mend(self, node: int) -> None:
        self._set_link(node, up=True)

    def _set_link(self, node: int, *, up: bool) -> None:
        if self._switch is not None:
            assert self._switch.stdin is not None
            self._switch.stdin.write(f"{'mend' if up else 'cut'} {node}\n")
            self._switch.stdin.flush()
        else:
            _run("ip", "link", "set", f"{self.names[node]}h", "up" if up else "down")

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


def remove_stale_networks() -> list[str]:
    """Remove the namespaces, bridges and cgroups of emulations whose supervisor is gone (killed outright, it could
    not remove them); returns what was removed. A supervisor's pid reused by a live process keeps its pieces: they
    are left, never another run's removed. This process's own pid counts as gone, since it has built nothing yet."""
    def gone(owner: str) -> bool:
        return int(owner) == os.getpid() or not pid_running(int(owner))

    removed = []
    for name in _namespaces():
        match = EDGETRAIN_NAMESPACE.fullmatch(name)
        if match and gone(match.group(1)):
            _remove_quietly("ip", "netns", "del", name)  # its veth ends (or TUN device) go with it
            removed.append(name)
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for bridge in re.findall(r"^\d+: (etb\d+)[:@]", links, flags=re.MULTILINE):
        match = _EDGETRAIN_BRIDGE.fullmatch(bridge)
        if match and gone(match.group(1)):
            _remove_quietly("ip", "link", "del", bridge)
            removed.append(bridge)
    for controller in ("cpu", "memory"):
        for path in sorted((CGROUP_ROOT / controller).glob("edgetrain-cluster-et*")):
            match = _EDGETRAIN_CGROUP.fullmatch(path.name)
            if match and gone(match.group(1)):
                remove_cgroup(path)
                removed.append(str(path))
    if removed:
        log.info("removed the emulated network of supervisors that are gone: %s", ", ".join(removed))
    return removed


def _remove_quietly(*command: str) -> None:
    """Run a removal; a piece another cleaner removed first is not an error."""
    subprocess.run(command, capture_output=True)


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip()]


def _unmount_netns_dir_if_unused() -> None:
    """Unmount the ``/run/netns`` bind mount ``ip netns add`` made, unless a namespace (another run's) still uses it."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip()
    if not names and _mounted(NETNS_RUN_DIR):
        _run("umount", NETNS_RUN_DIR)


def _netns_dir_made_by_edgetrain() -> bool:
    """Whether ``/run/netns`` is not mounted yet, or is and holds only edgetrain's namespaces (an edgetrain
    run beside this one made the mount; it may end first and leave the unmounting to this run)."""
    if not _mounted(NETNS_RUN_DIR):
        return True
    listed = _namespaces()
    return bool(listed) and all(EDGETRAIN_NAMESPACE.fullmatch(name) for name in listed)


def _mounted(path: str) -> bool:
    """Whether ``path`` is a mount point (a bind mount of the same file system too, which ``ismount`` misses)."""
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4] == path for line in mounts)

