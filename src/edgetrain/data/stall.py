"""Data-stall analysis: how much of a training step waits on fetching and pre-processing data.

NOTE [ The three-run differential ]
This follows DS-Analyzer (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN
Training", VLDB 2021, §3). A training step pipelines three stages -- fetch bytes from
storage, pre-process them on the CPU, compute on the model -- and the slowest exposed stage
sets the pace. Timing each stage alone would miss the overlap, so DS-Analyzer times the whole
step three times, removing one stage's cost each time, and takes differences:

1. *synthetic*: the step runs on a batch already in memory, so the per-batch time is pure
   compute (``compute_s``);
2. *cold*: the loader reads from storage with nothing cached (``cold_s`` = fetch + pre-process
   + compute, minus what the workers overlap);
3. *warm*: the loader reads the same samples from memory (``warm_s`` = pre-process + compute,
   minus overlap).

Then the pre-processing stall is ``warm_s - compute_s`` and the fetch stall ``cold_s - warm_s``.
With ``workers=0`` nothing overlaps, so the shares of ``cold_s`` are the true fetch /
pre-process / compute shares; with workers they are the *exposed* (stalling) shares.

Edge devices need no root for this: the cold run drops the sampled files from the page cache
with ``posix_fadvise(POSIX_FADV_DONTNEED)`` (after ``fdatasync``, since dirty pages cannot be
dropped) and, given ``read_bps`` (e.g. a device profile's ``storage_read_bps``), reads through
a :class:`~edgetrain.data.cache.ThrottledReader` that sleeps like a slow SD card. The warm run
reads from an in-memory :class:`~edgetrain.data.cache.MinIOCache` filled before timing.
Per-batch times are medians over ``batches`` steps after ``warmup_batches`` (worker start-up,
allocator warm-up), which keeps the figures stable on a loaded machine.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ..sysutil.processes import worker_dies_with_parent
from .cache import CachingReader, FileReader, MinIOCache, ThrottledReader
from .errors import DataError
from .folder import FileDataset, collate_skip_corrupt

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["StallReport", "StallRow", "analyze_stalls", "drop_page_cache", "make_step_fn", "stall_table"]

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
StepFn = Callable[[Batch], object]


@dataclass(frozen=True)
class StallRow:
    """Median per-batch times of the three runs for one worker count, and the shares derived from them.

    The derived figures clamp so that ``compute_s <= warm <= cold`` (measurement noise can make
    a difference slightly negative); the three shares then sum to 1.
    """

    workers: int
    batch_size: int
    compute_s: float
    warm_s: float
    cold_s: float
    warm_times_s: tuple[float, ...] = field(default=(), repr=False)
    cold_times_s: tuple[float, ...] = field(default=(), repr=False)

    @property
    def _warm_s(self) -> float:
        return max(self.warm_s, self.compute_s)

    @property
    def _cold_s(self) -> float:
        return max(self.cold_s, self._warm_s)

    @property
    def fetch_stall_s(self) -> float:
        """Per-batch time the step waits on storage: cold minus warm."""
        return self._cold_s - self._warm_s

    @property
    def prep_stall_s(self) -> float:
        """Per-batch time the step waits on decoding and transforms: warm minus compute."""
        return self._warm_s - self.compute_s

    @property
    def fetch_share(self) -> float:
        return self.fetch_stall_s / self._cold_s if self._cold_s > 0 else 0.0

    @property
    def prep_share(self) -> float:
        return self.prep_stall_s / self._cold_s if self._cold_s > 0 else 0.0

    @property
    def compute_share(self) -> float:
        return self.compute_s / self._cold_s if self._cold_s > 0 else 1.0

    @property
    def stall_share(self) -> float:
        """Share of the cold per-batch time the model waits for data (fetch + pre-process)."""
        return self.fetch_share + self.prep_share

    @property
    def samples_per_s(self) -> float:
        """Training throughput from cold storage."""
        return self.batch_size / self._cold_s if self._cold_s > 0 else float("inf")

    def predict_batch_time_s(self, cache_fraction: float) -> float:
        """Per-batch time if a MinIO cache held ``cache_fraction`` of the dataset (DS-Analyzer's what-if).

        Under MinIO every epoch hits exactly that fraction, so only the misses pay the fetch stall.
        """
        if not 0.0 <= cache_fraction <= 1.0:
            raise ValueError(f"cache_fraction must be in [0, 1], got {cache_fraction!r}")
        return self._warm_s + (1.0 - cache_fraction) * self.fetch_stall_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers, "batch_size": self.batch_size,
            "compute_s": self.compute_s, "warm_s": self.warm_s, "cold_s": self.cold_s,
            "fetch_stall_s": self.fetch_stall_s, "prep_stall_s": self.prep_stall_s,
            "fetch_share": self.fetch_share, "prep_share": self.prep_share, "compute_share": self.compute_share,
            "stall_share": self.stall_share, "samples_per_s": self.samples_per_s,
            "warm_times_s": list(self.warm_times_s), "cold_times_s": list(self.cold_times_s),
        }


@dataclass(frozen=True)
class StallReport:
    """The differential analysis for every worker count tried, and the worker count to use."""

    rows: tuple[StallRow, ...]
    batch_size: int
    batches: int
    read_bps: float | None
    cold_method: str
    stall_threshold: float
    recommended_workers: int
    compute_times_s: tuple[float, ...] = field(default=(), repr=False)

    def row(self, workers: int) -> StallRow:
        for row in self.rows:
            if row.workers == workers:
                return row
        raise KeyError(f"no measurement for {workers} workers; have {[r.workers for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size, "batches": self.batches, "read_bps": self.read_bps,
            "cold_method": self.cold_method, "stall_threshold": self.stall_threshold,
            "recommended_workers": self.recommended_workers, "compute_times_s": list(self.compute_times_s),
            "rows": [row.to_dict() for row in self.rows],
        }


def recommend_workers(rows: Sequence[StallRow], stall_threshold: float) -> int:
    """The fewest workers whose stall share is at most ``stall_threshold``; else the fastest count.

    Fewest, because each worker costs a process's memory, which a small device cannot spare.
    """
    acceptable = [row.workers for row in rows if row.stall_share <= stall_threshold]
    if acceptable:
        return min(acceptable)
    return min(rows, key=lambda row: row.cold_s).workers


def drop_page_cache(paths: Iterable[Path]) -> bool:
    """Ask the kernel to forget the cached pages of ``paths`` (no root needed); False if it cannot.

    ``posix_fadvise(DONTNEED)`` only drops clean pages, so each file is ``fdatasync``-ed first
    (freshly generated files are still dirty). The kernel may ignore the advice for pages
    another process maps; on systems without ``posix_fadvise`` (macOS) nothing is dropped.
    """
    if not hasattr(os, "posix_fadvise"):
        logger.warning("posix_fadvise is not available here; the cold run may read from the page cache")
        return False
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    except OSError as exc:
        logger.warning("could not drop %s from the page cache: %s", getattr(exc, "filename", "a file"), exc)
        return False
    return True


def _median_after_warmup(times_s: Sequence[float], warmup_batches: int) -> float:
    return statistics.median(times_s[warmup_batches:])


def _time_steps(batches: Iterable[Batch | None], step_fn: StepFn, n_steps: int) -> list[float]:
    """Wall time of each of ``n_steps`` iterations of: get the next batch, run the step on it."""
    iterator = iter(batches)
    times_s = []
    for _ in range(n_steps):
        start_s = time.perf_counter()
        batch = next(iterator)
        if batch is not None:  # every sample of the batch was corrupt and skipped
            step_fn(batch)
        times_s.append(time.perf_counter() - start_s)
    del iterator  # shuts DataLoader workers down now, not at garbage collection
    return times_s


def _synthetic_batches(sample: torch.Tensor, batch_size: int, num_classes: int) -> Iterable[Batch]:
    """The same in-memory batch forever (run 1): what the step would see if data were free.

    Float inputs (pixels) are drawn at random; integer ones (token ids) repeat the ``sample``'s,
    which are valid ids of the model's vocabulary.
    """
    if sample.is_floating_point():
        inputs = torch.randn(batch_size, *sample.shape)  # (B, C, H, W)
    else:
        inputs = sample.expand(batch_size, *sample.shape).clone()  # (B, L)
    labels = torch.randint(0, max(num_classes, 1), (batch_size,))
    while True:
        yield inputs, labels


def _loader(dataset: FileDataset, indices: list[int], batch_size: int, workers: int) -> DataLoader[Any]:
    return DataLoader(dataset, batch_size=batch_size, sampler=indices, num_workers=workers,
                      collate_fn=collate_skip_corrupt, worker_init_fn=worker_dies_with_parent)


def _sample_indices(dataset: FileDataset, n_needed: int, seed: int) -> list[int]:
    """A seeded random subset of ``n_needed`` samples (repeating the dataset if it is too small)."""
    if len(dataset) == 0:
        raise DataError("cannot analyse stalls of an empty dataset")
    rng = np.random.default_rng(seed)
    if len(dataset) < n_needed:
        logger.warning("dataset has %d samples, fewer than the %d the runs need; samples repeat, so the "
                       "cold run may read some from the page cache", len(dataset), n_needed)
    repeats = -(-n_needed // len(dataset))
    return np.concatenate([rng.permutation(len(dataset)) for _ in range(repeats)])[:n_needed].tolist()


def _warm_dataset(dataset: FileDataset, indices: Sequence[int]) -> FileDataset:
    """The dataset reading from memory: a cache large enough for the sampled bytes, filled now."""
    reader = CachingReader(MinIOCache(capacity_bytes=2**62), FileReader())
    for index in dict.fromkeys(indices):
        where = dataset.source(index)
        reader.read(where.path, where.offset, where.size)
    logger.debug("warm cache holds %d bytes of %d samples", reader.cache.used_bytes, len(reader.cache))
    return dataset.with_reader(reader)


def _cold_dataset(dataset: FileDataset, read_bps: float | None, read_latency_s: float) -> FileDataset:
    if read_bps is None:
        return dataset.with_reader(FileReader())
    return dataset.with_reader(ThrottledReader(read_bps, latency_s=read_latency_s))


def _cold_method(read_bps: float | None, drop: bool) -> str:
    parts = []
    if drop:
        parts.append("page cache dropped (posix_fadvise DONTNEED)")
    if read_bps is not None:
        parts.append(f"reads throttled to {read_bps:.4g} B/s")
    return "; ".join(parts) if parts else "as found (page cache not dropped, no throttle)"


def analyze_stalls(step_fn: StepFn, dataset: FileDataset, batch_size: int, workers: Sequence[int] = (0, 1, 2),
                   batches: int = 20, read_bps: float | None = None, *, read_latency_s: float = 0.0,
                   warmup_batches: int = 1, stall_threshold: float = 0.1, drop_cache: bool = True,
                   seed: int = 0) -> StallReport:
    """Measure fetch, pre-process and compute shares of a training step for each worker count.

    See NOTE [ The three-run differential ]. Each run times ``warmup_batches + batches`` steps
    over the same seeded sample of the dataset and keeps the median of the last ``batches``.

    Args:
        step_fn: one training step on a batch ``(pixels (B,C,H,W) or token ids (B,L), labels (B,))``;
            e.g. from :func:`make_step_fn`.
        dataset: an edgetrain dataset (ImageFolder, CifarBinary, TokenRecords, or a subset of one).
        batch_size: samples per batch.
        workers: the DataLoader worker counts to try.
        batches: timed batches per run (more gives steadier medians).
        read_bps: emulate storage of this read bandwidth (bytes/s) in the cold run; None reads
            the real storage.
        read_latency_s: extra emulated time per read (an SD card's access latency).
        warmup_batches: untimed batches at the start of every run.
        stall_threshold: the stall share the recommended worker count must stay within.
        drop_cache: drop the sampled files from the page cache before every cold run.
        seed: which samples are used.

    Returns:
        A :class:`StallReport` with one :class:`StallRow` per worker count.

    Example:
        >>> report = analyze_stalls(make_step_fn(model), train, batch_size=32,
        ...                         read_bps=get_device("rpi4").storage_read_bps)  # doctest: +SKIP
        >>> report.recommended_workers, report.row(0).fetch_share                  # doctest: +SKIP
    """
    if batch_size < 1 or batches < 1 or warmup_batches < 0:
        raise ValueError("batch_size and batches must be positive and warmup_batches not negative")
    if not isinstance(dataset, FileDataset):
        raise DataError(f"analyze_stalls needs an edgetrain.data dataset (ImageFolder, CifarBinary or a subset "
                        f"of one), whose byte reader it can swap; got {type(dataset).__name__}")
    if not workers or min(workers) < 0:
        raise ValueError(f"workers must be a non-empty list of counts >= 0, got {workers!r}")
    n_steps = warmup_batches + batches
    indices = _sample_indices(dataset, n_steps * batch_size, seed)
    files = sorted({dataset.source(i).path for i in indices})
    example = dataset[indices[0]]
    if example is None:
        raise DataError("the first sampled sample is corrupt; cannot size the synthetic batch")

    compute_times_s = _time_steps(_synthetic_batches(example[0], batch_size, dataset.num_classes), step_fn, n_steps)
    compute_s = _median_after_warmup(compute_times_s, warmup_batches)
    warm = _warm_dataset(dataset, indices)
    cold = _cold_dataset(dataset, read_bps, read_latency_s)
    dropped = False
    rows = []
    for count in workers:
        warm_times_s = _time_steps(_loader(warm, indices, batch_size, count), step_fn, n_steps)
        dropped = drop_page_cache(files) if drop_cache else False
        cold_times_s = _time_steps(_loader(cold, indices, batch_size, count), step_fn, n_steps)
        row = StallRow(workers=count, batch_size=batch_size, compute_s=compute_s,
                       warm_s=_median_after_warmup(warm_times_s, warmup_batches),
                       cold_s=_median_after_warmup(cold_times_s, warmup_batches),
                       warm_times_s=tuple(warm_times_s), cold_times_s=tuple(cold_times_s))
        logger.info("workers=%d: compute %.2f ms, warm %.2f ms, cold %.2f ms per batch; stall %.0f%%",
                    count, 1e3 * row.compute_s, 1e3 * row.warm_s, 1e3 * row.cold_s, 100 * row.stall_share)
        rows.append(row)
    recommended = recommend_workers(rows, stall_threshold)
    return StallReport(rows=tuple(rows), batch_size=batch_size, batches=batches, read_bps=read_bps,
                       cold_method=_cold_method(read_bps, dropped), stall_threshold=stall_threshold,
                       recommended_workers=recommended, compute_times_s=tuple(compute_times_s))


def make_step_fn(model: nn.Module, *, optimizer: str = "sgd", lr: float | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> StepFn:
    """A plain training step (zero_grad, forward, loss, backward, optimizer step) for :func:`analyze_stalls`."""
    from ..core.optim import make_optimizer
    from ..profiling.measure import train_step

    criterion = loss_fn if loss_fn is not None else nn.functional.cross_entropy
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()

    def step(batch: Batch) -> float:
        pixels, labels = batch
        return train_step(model, pixels, labels, opt, criterion)

    return step


def stall_table(report: StallReport) -> Table:
    """A rich table of the report: per-batch times, shares and throughput per worker count."""
    from rich.table import Table

    table = Table(title=f"Data stalls (batch {report.batch_size}, median of {report.batches} batches)",
                  caption=f"cold: {report.cold_method}. Recommended workers: {report.recommended_workers} "
                          f"(fewest with stall <= {report.stall_threshold:.0%}, else the fastest).")
    for header in ("workers", "compute ms", "warm ms", "cold ms", "fetch", "pre-process", "compute",
                   "stall", "samples/s"):
        table.add_column(header, justify="right")
    for row in report.rows:
        mark = " *" if row.workers == report.recommended_workers else ""
        table.add_row(f"{row.workers}{mark}", f"{1e3 * row.compute_s:.1f}", f"{1e3 * row.warm_s:.1f}",
                      f"{1e3 * row.cold_s:.1f}", f"{row.fetch_share:.0%}", f"{row.prep_share:.0%}",
                      f"{row.compute_share:.0%}", f"{row.stall_share:.0%}", f"{row.samples_per_s:.0f}")
    return table
