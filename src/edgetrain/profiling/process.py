"""What the kernel charges the training process: resident memory, its high-water mark, the cgroup.

The planner counts tensor bytes; a 2 GiB node's kernel counts the process: the Python
interpreter, PyTorch's libraries and operator tables, thread pools, allocator slack, the data
pipeline and the tensors. This module reads the kernel's own figures, so that a budget can
bound the process (NOTE [ Process budget ] in ``train/budget.py``) and a run can report what the
kernel saw.

* ``/proc/self/status``: ``VmRSS`` (resident now) and ``VmHWM`` (its peak). Writing ``5`` to
  ``/proc/self/clear_refs`` resets ``VmHWM`` to the current RSS (Linux >= 4.0), so the peak of
  training can be read apart from start-up.
* The memory cgroup the process is in (v1 ``memory.usage_in_bytes``/``max_usage_in_bytes``/
  ``limit_in_bytes``, v2 ``memory.current``/``memory.peak``/``memory.max``): what the OOM killer
  acts on, page cache of files read included.

NOTE [ Returning freed memory ]
glibc serves allocations below its mmap threshold from heaps it rarely gives back, and raises
that threshold (up to 32 MiB) each time a larger block is freed, so after a few training steps
the activations of one step stay resident as free heap and RSS sits far above the live tensor
bytes. :func:`configure_allocator` pins the threshold (``mallopt(M_MMAP_THRESHOLD)``, which
also stops the dynamic raise): every tensor of at least that size is its own mapping and goes
back to the kernel when freed. :func:`return_freed_memory` (``malloc_trim(0)``) gives back free
heap after start-up work such as profiling.

The threshold is 256 KiB. At 1 MiB the tensors between 256 KiB and 1 MiB (a MobileNetV2's
deep activations, most weights' gradients and momentum) share the heap with long-lived small
objects; under recomputation they are freed and re-made in a new order every step and the free
holes between live blocks grow step after step. ``python -m benchmarks run heap_slack``
(docs/results/heap_slack.md; MobileNetV2, batch 16, 128 px, 15 steps, each threshold under its least
process budget): at 1 MiB the heap's free part at each step's peak grew from 28 to 91 MiB and the
process peaked at 602.0 MiB, over its 557 MiB budget; at 256 KiB it stayed at 7-11 MiB and the
peak at 527.2 MiB, within its 550 MiB.

Every mapping costs page faults (and zeroed pages) each time a tensor is made, where glibc's
default reuses freed heap. PyTorch's ``THP_MEM_ALLOC_ENABLE=1`` aligns tensors of at least 2 MiB
to 2 MiB and asks for transparent huge pages (``madvise``): one fault per 2 MiB. ``python -m
benchmarks run mmap_threshold`` (docs/results/mmap_threshold.md; MobileNetV2, batch 16, 128 px, plain
training, one thread, 5 rounds): step time relative to glibc's default in the same round 2.18x at
256 KiB, 2.32x at 256 KiB with huge pages, 2.27x at 1 MiB, 1.00x for the default with huge pages
(medians over the rounds, on a machine shared with other work: the quartiles of the last span
0.67-1.15); peak RSS 733-745 MiB pinned against 867-871 MiB by default. So the
threshold is pinned only where a process budget must hold (``edgetrain train --memory`` or
``--device``), a trade of step time for a bounded process, and huge pages are always asked for.
PyTorch reads the variable once, at its first allocation, so ``edgetrain``'s command line sets
it before importing torch (``cli.main``); a library user sets it in the environment. Where the
kernel has no transparent huge pages the advice is ignored.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessMemory", "read_process_memory", "reset_peak", "cgroup_memory_limit", "configure_allocator",
           "return_freed_memory", "MMAP_THRESHOLD_BYTES"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 256 * 2**10
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_UNLIMITED = 2**62  # cgroup v1 reports "no limit" as a page-rounded LONG_MAX


@dataclass(frozen=True)
class ProcessMemory:
    """The kernel's figures for this process, in bytes; cgroup figures None outside a memory cgroup.

    The cgroup's figures are the whole group's (children, other processes placed in it, page
    cache it was charged for); ``peak_rss_bytes`` is this process's alone.
    """

    rss_bytes: int
    peak_rss_bytes: int
    cgroup_usage_bytes: int | None = None
    cgroup_peak_bytes: int | None = None
    cgroup_limit_bytes: int | None = None


def read_process_memory() -> ProcessMemory:
    """The current figures; RSS from ``/proc/self/status``, cgroup figures where readable."""
    status = _status_fields()
    group = _memory_cgroup()
    usage = peak = limit = None
    if group is not None:
        directory, version = group
        names = ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes") if version == 1 \
            else ("memory.current", "memory.peak", "memory.max")
        usage, peak, limit = (_read_int(directory / name) for name in names)
        if limit is not None and limit >= _UNLIMITED:
            limit = None
    return ProcessMemory(rss_bytes=status["VmRSS"], peak_rss_bytes=status["VmHWM"], cgroup_usage_bytes=usage,
                         cgroup_peak_bytes=peak, cgroup_limit_bytes=limit)


def reset_peak() -> bool:
    """Reset the high-water marks to the current use; False where the kernel does not allow it.

    ``VmHWM`` is reset through ``/proc/self/clear_refs``; a cgroup v1 peak by writing 0 to
    ``memory.max_usage_in_bytes`` and a v2 one by writing to ``memory.peak`` (Linux >= 6.12),
    where permitted. The cgroup is shared with the process's children; reset it only when
    nothing else of the group is running.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        log.info("cannot reset VmHWM: %s", exc)
        return False
    group = _memory_cgroup()
    if group is not None:
        directory, version = group
        try:
            (directory / ("memory.max_usage_in_bytes" if version == 1 else "memory.peak")).write_text("0")
        except OSError as exc:
            log.info("cannot reset the cgroup's peak: %s", exc)
    return True


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup in bytes; None when unlimited or not in one."""
    return read_process_memory().cgroup_limit_bytes


def configure_allocator(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve allocations of at least ``mmap_threshold_bytes`` from their own mappings (NOTE [ Returning freed
    memory ]); False where the C library is not glibc."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold_bytes)) == 1)


def return_freed_memory() -> bool:
    """Give free heap memory back to the kernel (``malloc_trim(0)``); False where unavailable."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - probing: musl and others lack mallopt/malloc_trim
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def _status_fields() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def _memory_cgroup() -> tuple[Path, int] | None:
    """The directory of this process's memory cgroup and its version (1 or 2), if mounted here."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if directory.is_dir():
                return directory, 1
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            directory = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (directory / "memory.current").exists():
                return directory, 2
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None
