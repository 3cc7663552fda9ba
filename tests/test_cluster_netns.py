"""The emulated network of ``cluster local --netns``: what it builds, and that nothing is left after it,
however it ends. Needs root (namespaces, tc, cgroups); skipped otherwise."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.distributed.netns import LinkPreset, NetworkEmulation, can_emulate

pytestmark = pytest.mark.skipif(can_emulate() is not None, reason=f"network emulation unavailable: {can_emulate()}")


def _leftovers(net: NetworkEmulation) -> list[str]:
    """Every namespace, link and cgroup of ``net`` that still exists."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left = [name for name in net.names if name in namespaces or f"{name}h" in links]
    left += [net.bridge] if f" {net.bridge}:" in links else []
    left += [f"{name}t" for name in net.names if f" {name}t:" in links]  # the switch's TUN devices
    left += [str(net.cgroup(c, n)) for c in ("cpu", "memory") for n in range(net.nodes) if net.cgroup(c, n).exists()]
    return left


def _switches(node_name: str) -> list[str]:
    """The command lines of running delaying switches that serve ``node_name``."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # the process ended while listed
            continue
        lines += [line] if "tunswitch.py" in line and node_name in line else []
    return lines


def _netns_dir_mounted() -> bool:
    return any(line.split()[4] == "/run/netns" for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _netns_dir_as_before(mounted_before: bool) -> bool:
    """ip's /run/netns bind mount is as it was before, unless another run (a test beside this one) still holds it."""
    others = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip()
    return _netns_dir_mounted() == mounted_before or bool(others)


def test_each_node_gets_a_shaped_link_a_cpu_quota_and_a_memory_limit_and_nothing_is_left() -> None:
    mounted_before = _netns_dir_mounted()
    with NetworkEmulation(2, "100mbit", cpus_per_node=0.5, memory_bytes=[256 * 2**20, None]) as net:
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", f"{net.names[1]}h"], capture_output=True, text=True)
        assert "tbf" in qdisc.stdout and "rate 100Mbit" in qdisc.stdout
        assert (net.cgroup("cpu", 0) / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert net.env(0)["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")  # one thread per half core
        assert int((net.cgroup("memory", 0) / "memory.limit_in_bytes").read_text()) == 256 * 2**20
        # A process run through wrap() is in node 1's namespace and cgroups.
        seen = subprocess.run(net.wrap(1, ["sh", "-c", "ip -o addr show eth0; cat /proc/self/cgroup"]),
                              capture_output=True, text=True, check=True).stdout
        assert net.address(1) in seen and f"edgetrain-cluster-{net.names[1]}" in seen
        assert len(_leftovers(net)) == 2 + 1 + 4  # the check sees them: namespaces, bridge, cgroups
    assert _leftovers(net) == []
    assert _netns_dir_as_before(mounted_before)


_HOLD_AN_EMULATION = ("import sys\nfrom edgetrain.distributed.netns import NetworkEmulation\n"
                      "with NetworkEmulation(1, 'gigabit', cpus_per_node=0.5):\n"
                      "    print('up', flush=True); sys.stdin.readline()\n")


def test_the_netns_mount_is_undone_by_the_run_that_ends_last_when_the_first_made_it() -> None:
    """Two runs side by side (as two test workers): the first makes ip's /run/netns mount and ends first, while
    the second still uses it; the second, ending last, removes it."""
    mounted_before = _netns_dir_mounted()
    first = subprocess.Popen([sys.executable, "-c", _HOLD_AN_EMULATION], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "up"
        with NetworkEmulation(1, "gigabit", cpus_per_node=0.5):
            first.communicate("\n", timeout=60)
            assert first.returncode == 0
            assert _netns_dir_mounted()   # this run's namespace still lives in it
    finally:
        first.kill()
        first.wait()
    assert _netns_dir_as_before(mounted_before)


# Node 1 echoes bytes; node 0 times ROUNDS round trips of one byte, then connects again while its link is cut.
_ECHO = ("import socket, sys\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind((sys.argv[1], 5001)); s.listen(); print('up', flush=True); c, _ = s.accept()\n"
         "while (b := c.recv(1)):\n    c.sendall(b)\n")
_ROUND_TRIPS = ("import socket, sys, time\ns = socket.create_connection((sys.argv[1], 5001), timeout=2)\n"
                "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); rtts = []\nfor _ in range(5):\n"
                "    t = time.perf_counter(); s.sendall(b'p'); s.recv(1); rtts.append(time.perf_counter() - t)\n"
                "print(min(rtts))\n")


def _rtt_s(net: NetworkEmulation) -> float:
    echo = subprocess.Popen(net.wrap(1, [sys.executable, "-c", _ECHO, net.address(1)]), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "up"
        done = subprocess.run(net.wrap(0, [sys.executable, "-c", _ROUND_TRIPS, net.address(1)]), capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return float(done.stdout)
    finally:
        echo.kill()
        echo.wait()


def test_the_switch_delays_every_packet_and_a_cut_drops_them_all() -> None:
    link = LinkPreset("slow", 20_000_000, 0.02, 0.0, "a test link: 20 ms one way")
    with NetworkEmulation(2, link, cpus_per_node=1.0) as net:
        kinds = subprocess.run(["ip", "-n", net.names[0], "-d", "link", "show", "eth0"], capture_output=True,
                               text=True).stdout
        assert "tun" in kinds and "mtu 65000" in kinds
        # Every round trip crosses the switch twice: it cannot come back sooner than the two one-way delays.
        assert _rtt_s(net) >= 2 * link.delay_s
        assert net.switch_counts()["forwarded"] >= 2 * 5
        net.cut(1)
        blocked = subprocess.run(net.wrap(0, [sys.executable, "-c", _ROUND_TRIPS, net.address(1)]),
                                 capture_output=True, text=True, timeout=30)
        assert blocked.returncode != 0 and "timed out" in blocked.stderr
        assert net.switch_counts()["cut"] > 0
        net.mend(1)
        assert _rtt_s(net) >= 2 * link.delay_s
    assert _leftovers(net) == []


@pytest.mark.parametrize("preset", ["gigabit", "wifi20"])
def test_sigterm_removes_the_network(preset: str) -> None:
    # Prepare: a process that builds a 2-node network (veths and a bridge, or the TUN switch), says where, and waits.
    script = ("import sys, time\nfrom edgetrain.distributed.netns import NetworkEmulation\n"
              f"with NetworkEmulation(2, {preset!r}) as net:\n"
              "    print(net.bridge, *net.names, flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    bridge, *names = proc.stdout.readline().split()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert names and all(name in namespaces for name in names)
    assert bool(_switches(names[0])) == (preset == "wifi20")
    # Execute
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    # Assert
    time.sleep(0.1)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert bridge not in links and not any(name in namespaces or f"{name}t" in links for name in names)
    assert not _switches(names[0])  # the switch ended with its parent
    assert not any(p.name.startswith(f"edgetrain-cluster-{names[0][:-1]}") for c in ("cpu", "memory")
                   for p in Path(f"/sys/fs/cgroup/{c}").iterdir())


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_next_emulation_removes_the_network_of_a_supervisor_that_is_gone() -> None:
    # Prepare: what a supervisor killed by SIGKILL leaves (a namespace, a bridge, its two cgroups), and the same
    # pieces of a supervisor that is still alive (a sleeping process stands in for it)
    mounted_before = _netns_dir_mounted()
    alive = subprocess.Popen(["sleep", "60"])
    owners = {"gone": _dead_pid(), "alive": alive.pid}
    made: dict[str, list[str]] = {}
    try:
        for who, pid in owners.items():
            subprocess.run(["ip", "netns", "add", f"et{pid}n0"], check=True)
            subprocess.run(["ip", "link", "add", f"etb{pid}", "type", "bridge"], check=True)
            cgroups = [Path(f"/sys/fs/cgroup/{c}/edgetrain-cluster-et{pid}n0") for c in ("cpu", "memory")]
            for path in cgroups:
                path.mkdir()
            made[who] = [f"et{pid}n0", f"etb{pid}", *map(str, cgroups)]
        # Execute: the next run's emulation starts and ends
        with NetworkEmulation(1, "gigabit") as net:
            during = _leftovers(net)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        still = {who: [p for p in pieces if (p in namespaces.split() or f" {p}:" in links or Path(p).exists())]
                 for who, pieces in made.items()}
    finally:
        alive.kill()
        alive.wait()
        for pid in owners.values():
            subprocess.run(["ip", "netns", "del", f"et{pid}n0"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"etb{pid}"], capture_output=True)
            for controller in ("cpu", "memory"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"/sys/fs/cgroup/{controller}/edgetrain-cluster-et{pid}n0").rmdir()
        if not mounted_before and _netns_dir_mounted() and not subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
            subprocess.run(["umount", "/run/netns"], capture_output=True)

    # Assert: the gone supervisor's pieces were removed, the live one's kept, the new run's own built and then removed
    assert len(during) == 1 + 1 + 2  # its namespace (with its veth), bridge and two cgroups
    assert still == {"gone": [], "alive": made["alive"]}
    assert _leftovers(net) == []
