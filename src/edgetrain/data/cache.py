"""How a sample's bytes reach a dataset: from disk, through an emulated slow card, or from a cache.

NOTE [ Readers and the MinIO cache ]
Every dataset in :mod:`edgetrain.data` asks a *reader* for the raw bytes of a sample
(``reader.read(path, offset, size)``) and decodes them itself. Splitting *fetch* (the reader)
from *pre-process* (decode, resize, normalise, augment) is what lets the stall profiler swap the
byte source while keeping the rest of the pipeline the same:

* :class:`FileReader` reads the file; the OS page cache decides whether that touches storage;
* :class:`ThrottledReader` wraps a reader and sleeps ``len(data) / read_bps`` seconds after each
  read, to emulate a slow SD card without root (sleeping, not spinning: I/O does not use a CPU);
* :class:`CachingReader` serves bytes from a :class:`MinIOCache` or :class:`LRUCache`.

The caches follow Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training"
(VLDB 2021), §4 "MinIO": a DNN epoch reads every item exactly once in a random order, so
no recency or frequency signal exists and an LRU page cache thrashes (an item evicted before
its next use is the common case). MinIO instead keeps the first items it inserts and never
evicts; every later epoch then hits exactly ``capacity / dataset`` of its reads, the best any
policy can do under a uniform random order. The budget is in bytes because on an edge device
the cache shares one memory with training: the caller passes what the memory planner leaves.

A cache lives in one process. With ``DataLoader`` workers every worker holds its own copy
(filled independently), so give each ``capacity_bytes / workers`` or keep ``workers=0``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = [
    "ByteReader",
    "CacheStats",
    "CachingReader",
    "FileReader",
    "LRUCache",
    "MinIOCache",
    "ThrottledReader",
    "replay_epochs",
]

logger = logging.getLogger(__name__)


class ByteReader(Protocol):
    """Anything that returns ``size`` bytes of ``path`` from ``offset`` (all of it when ``size`` is None)."""

    def read(self, path: Path, offset: int = 0, size: int | None = None) -> bytes: ...


class FileReader:
    """Read bytes straight from the file system (the page cache may serve them)."""

    def read(self, path: Path, offset: int = 0, size: int | None = None) -> bytes:
        with open(path, "rb") as handle:
            if offset:
                handle.seek(offset)
            return handle.read() if size is None else handle.read(size)


class ThrottledReader:
    """Emulate slow storage: after each read, sleep as long as ``read_bps`` needs for those bytes.

    ``latency_s`` adds a fixed cost per read (an SD card's access time). Use a device profile's
    ``storage_read_bps`` (e.g. 45.5e6 for a Raspberry Pi 4 microSD card) to see a device's stalls
    on a development machine. Sleeping models I/O wait: it holds no CPU, so DataLoader workers
    overlap it, as they would overlap real reads.
    """

    def __init__(self, read_bps: float, *, latency_s: float = 0.0, inner: ByteReader | None = None) -> None:
        if not read_bps > 0:
            raise ValueError(f"read_bps must be positive, got {read_bps!r}")
        if latency_s < 0:
            raise ValueError(f"latency_s cannot be negative, got {latency_s!r}")
        self.read_bps = float(read_bps)
        self.latency_s = float(latency_s)
        self.inner: ByteReader = inner if inner is not None else FileReader()

    def read(self, path: Path, offset: int = 0, size: int | None = None) -> bytes:
        start_s = time.perf_counter()
        data = self.inner.read(path, offset, size)
        target_s = self.latency_s + len(data) / self.read_bps
        remaining_s = target_s - (time.perf_counter() - start_s)
        if remaining_s > 0:
            time.sleep(remaining_s)
        return data


@dataclass
class CacheStats:
    """Counters of one cache since the last :meth:`reset`; ``hit_rate`` is hits / lookups."""

    hits: int = 0
    misses: int = 0
    inserted: int = 0
    evicted: int = 0
    rejected: int = 0  # items that did not fit (MinIO when full, or larger than the whole cache)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def reset(self) -> None:
        self.hits = self.misses = self.inserted = self.evicted = self.rejected = 0


class _ByteBudgetCache:
    """Shared bookkeeping: a byte budget, the bytes in use and the counters."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes cannot be negative, got {capacity_bytes!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.stats = CacheStats()
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable) -> object | None:
        """The cached value, or None (a miss); counts the lookup."""
        entry = self._items.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._touch(key)
        return entry[0]

    def put(self, key: Hashable, value: object, size_bytes: int) -> bool:
        """Offer ``value`` (``size_bytes`` of payload) to the cache; True when it was kept."""
        if key in self._items:
            return True
        if size_bytes > self.capacity_bytes or not self._make_room(size_bytes):
            self.stats.rejected += 1
            return False
        self._items[key] = (value, size_bytes)
        self.used_bytes += size_bytes
        self.stats.inserted += 1
        return True

    def _touch(self, key: Hashable) -> None:
        """Record a use of ``key`` (only LRU cares)."""

    def _make_room(self, size_bytes: int) -> bool:
        raise NotImplementedError


class MinIOCache(_ByteBudgetCache):
    """Keep the first items that fit in ``capacity_bytes``; never evict (Mohan et al. 2021, §4).

    Under a fresh random order every epoch, each epoch after the first hits exactly the cached
    fraction of the items, because the cached set never changes.

    Example:
        >>> cache = MinIOCache(capacity_bytes=10)
        >>> cache.put("a", b"12345", 5), cache.put("b", b"12345", 5), cache.put("c", b"1", 1)
        (True, True, False)
    """

    def _make_room(self, size_bytes: int) -> bool:
        return self.used_bytes + size_bytes <= self.capacity_bytes


class LRUCache(_ByteBudgetCache):
    """Evict the least recently used items until a new one fits: the page cache's policy, for comparison."""

    def _touch(self, key: Hashable) -> None:
        self._items.move_to_end(key)

    def _make_room(self, size_bytes: int) -> bool:
        while self.used_bytes + size_bytes > self.capacity_bytes:
            _, (_, old_bytes) = self._items.popitem(last=False)
            self.used_bytes -= old_bytes
            self.stats.evicted += 1
        return True


class CachingReader:
    """Serve reads from ``cache`` and fill it from ``inner`` on a miss (keys: path, offset, size)."""

    def __init__(self, cache: MinIOCache | LRUCache, inner: ByteReader | None = None) -> None:
        self.cache = cache
        self.inner: ByteReader = inner if inner is not None else FileReader()

    def read(self, path: Path, offset: int = 0, size: int | None = None) -> bytes:
        key = (str(path), offset, size)
        data = self.cache.get(key)
        if data is None:
            data = self.inner.read(path, offset, size)
            self.cache.put(key, data, len(data))
        assert isinstance(data, bytes)
        return data


def replay_epochs(cache: MinIOCache | LRUCache, item_bytes: Sequence[int], *, epochs: int,
                  seed: int = 0) -> list[float]:
    """Hit rate of each epoch when every item is read once per epoch in a fresh random order.

    This is the access pattern of shuffled training; it needs no files, so it shows what a
    cache policy and budget would give before any data is read.

    Args:
        cache: an empty cache (its stats are reset every epoch).
        item_bytes: the size of item ``i`` in bytes.
        epochs: how many shuffled passes to replay.
        seed: the seed of the shuffles.

    Returns:
        One hit rate per epoch; the first is 0 for an empty cache.

    Example:
        >>> replay_epochs(MinIOCache(capacity_bytes=500), [10] * 100, epochs=3)
        [0.0, 0.5, 0.5]
    """
    rng = np.random.default_rng(seed)
    rates = []
    for _ in range(epochs):
        cache.stats.reset()
        for index in rng.permutation(len(item_bytes)).tolist():
            if cache.get(index) is None:
                cache.put(index, index, int(item_bytes[index]))
        rates.append(cache.stats.hit_rate)
    logger.debug("%s hit rates per epoch: %s", type(cache).__name__, rates)
    return rates
