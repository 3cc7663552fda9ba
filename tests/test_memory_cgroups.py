"""A memory cgroup around a child process: the kernel enforces its limit, counts its peak, and the group is removed.

Skips with the reason where no memory cgroup can be made (not root, no memory controller).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgetrain.sysutil.memory_cgroups import memory_cgroup, memory_cgroup_unavailable

pytestmark = pytest.mark.skipif(memory_cgroup_unavailable() is not None, reason=str(memory_cgroup_unavailable()))

MiB = 2**20


def _touch(nbytes: int) -> list[str]:
    """A child that allocates ``nbytes`` and writes every page of it, so all of it is resident."""
    return [sys.executable, "-c", f"b = bytearray({nbytes}); b[::4096] = b'x' * len(b[::4096])"]


def test_a_child_above_the_limit_is_killed_and_counted_and_one_below_is_metered() -> None:
    with memory_cgroup(64 * MiB, prefix="edgetrain-test") as group:
        over = subprocess.run(_touch(200 * MiB), preexec_fn=group.enter, capture_output=True, timeout=120)
        assert over.returncode == -9
        assert group.oom_kills() == 1
        assert group.peak_bytes() == 64 * MiB   # the charge reached the limit and stayed there
    with memory_cgroup(None, prefix="edgetrain-test") as meter:
        under = subprocess.run(_touch(50 * MiB), preexec_fn=meter.enter, capture_output=True, timeout=120)
        assert under.returncode == 0
        peak = meter.peak_bytes()
        assert peak is not None and 50 * MiB < peak < 200 * MiB   # the buffer and the interpreter, as charged
        assert meter.oom_kills() == 0
    assert not group.path.exists() and not meter.path.exists()


def test_the_group_is_removed_on_an_exception_with_its_process_killed() -> None:
    with pytest.raises(RuntimeError, match="boom"), memory_cgroup(None, prefix="edgetrain-test") as group:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=group.enter)
        assert group.pids() == [child.pid]
        raise RuntimeError("boom")
    assert child.wait(timeout=30) == -9
    assert not group.path.exists()
