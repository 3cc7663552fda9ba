"""The emulated network of ``cluster local --netns`` (issue #14): what it builds, and that nothing is left after it,
however it ends. Needs root (namespaces, tc, cgroups); skipped otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.distributed.netns import NetworkEmulation, can_emulate

pytestmark = pytest.mark.skipif(can_emulate() is not None, reason=f"network emulation unavailable: {can_emulate()}")


def _leftovers(net: NetworkEmulation) -> list[str]:
    """Every namespace, link and cgroup of ``net`` that still exists."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left = [name for name in net.names if name in namespaces or f"{name}h" in links]
    left += [net.bridge] if f" {net.bridge}:" in links else []
    left += [str(net.cgroup(c, n)) for c in ("cpu", "memory") for n in range(net.nodes) if net.cgroup(c, n).exists()]
    return left


def _netns_dir_mounted() -> bool:
    return any(line.split()[4] == "/run/netns" for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_each_node_gets_a_shaped_link_a_cpu_quota_and_a_memory_limit_and_nothing_is_left() -> None:
    mounted_before = _netns_dir_mounted()
    with NetworkEmulation(2, "wifi20", cpus_per_node=0.5, memory_bytes=[256 * 2**20, None]) as net:
        qdisc = subprocess.run(["tc", "qdisc", "show", "dev", f"{net.names[1]}h"], capture_output=True, text=True)
        assert "tbf" in qdisc.stdout and "rate 20Mbit" in qdisc.stdout
        assert (net.cgroup("cpu", 0) / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert int((net.cgroup("memory", 0) / "memory.limit_in_bytes").read_text()) == 256 * 2**20
        # A process run through wrap() is in node 1's namespace and cgroups.
        seen = subprocess.run(net.wrap(1, ["sh", "-c", "ip -o addr show eth0; cat /proc/self/cgroup"]),
                              capture_output=True, text=True, check=True).stdout
        assert net.address(1) in seen and f"edgetrain-cluster-{net.names[1]}" in seen
        assert len(_leftovers(net)) == 2 + 1 + 4  # the check sees them: namespaces, bridge, cgroups
    assert _leftovers(net) == []
    assert _netns_dir_mounted() == mounted_before  # ip's /run/netns bind mount too (unless another run holds it)


def test_sigterm_removes_the_network(tmp_path: Path) -> None:
    # Prepare: a process that builds a 2-node network, says where, and waits.
    script = ("import sys, time\nfrom edgetrain.distributed.netns import NetworkEmulation\n"
              "with NetworkEmulation(2, 'gigabit') as net:\n"
              "    print(net.bridge, *net.names, flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    bridge, *names = proc.stdout.readline().split()
    assert names and bridge in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    # Execute
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    # Assert
    time.sleep(0.1)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert bridge not in links and not any(name in namespaces for name in names)
    assert not any(p.name.startswith(f"edgetrain-cluster-{names[0][:-1]}") for c in ("cpu", "memory")
                   for p in Path(f"/sys/fs/cgroup/{c}").iterdir())
