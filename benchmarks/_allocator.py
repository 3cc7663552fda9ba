"""What the benchmarks share: keeping freed memory in the process so step times do not depend on order."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

MiB = 2**20


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory in the process instead of returning it to the OS.

    By default glibc trims the heap top and unmaps large blocks when they are freed, so a
    step that follows a step with a smaller footprint page-faults its memory back in: a plain
    BERT-base step measured 3.2 s CPU after a plain step and 4.3 s after a
    ``checkpoint_sequential(14)`` step. Interleaving configurations would then charge each one
    for its predecessor. With trimming off and a fixed mmap threshold (32 MiB, glibc's
    largest), a step costs what it costs when it follows itself, as in a training loop (the
    plain step then measured 3.3 s after either). Blocks above 32 MiB are still mapped and
    unmapped every step, by every configuration alike.

    Returns whether the settings were applied (False off glibc).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.warning("not glibc: step times may depend on the footprint of the step before")
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3   # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, 32 * MiB)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
