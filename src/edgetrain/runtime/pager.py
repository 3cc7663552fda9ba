"""Paging activations to storage: the page store, its per-step session and their files.

NOTE [ How a page travels ]
``PageOut(k)`` hands ``x_k``'s whole storage to a background *writer* thread, which writes its
raw bytes to ``<step dir>/x<k>.page``; dtype, size, stride and offset stay in memory. The
executor has dropped every other reference, so once the write is *reaped* (the main thread
drops the writer's reference, see below) the storage is freed. ``PageIn(k)`` allocates the
bytes in the calling thread -- RAM is taken when the read is issued, as the simulator counts
it -- and a background *reader* thread fills them and deletes the file. The rebuilt tensor
has the old storage's bytes, so it is bitwise identical.

``PageOutRecord(i)`` pages the distinct storages behind a record's internals the same way, as
one page of several parts (``<step dir>/r<i>.<n>.page``, one file per storage, keyed by
:class:`RecordKey`); ``PageInRecord(i)`` reads each into its own new storage, so the internals
are freed one by one during the backward as plain autograd frees them.

Only the main thread ever drops the last reference to a paged storage: memory trackers (and
``weakref`` finalizers) then run where the step runs, never on a worker thread.

NOTE [ Page files and cleanup ]
Each step writes into its own directory ``edgetrain-pages-<pid>-<random>`` under the page
directory, removed when the step ends, on any error (the session is a context manager), and
by the next :class:`PageStore` on the same directory when the process that made it is gone
(a step killed by SIGKILL cannot clean up after itself). Files are scratch: no fsync.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import logging
import os
import queue
import re
import secrets
import shutil
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..core.schedule import Op, PageIn, PageInRecord, PageOut, PageOutRecord
from ..errors import PagingError
from ..sysutil.fileio import read_exactly
from ..sysutil.processes import pid_running

__all__ = ["PageStore", "PageSession", "PagingStats", "RecordKey", "PageKey", "page_key", "STEP_DIR_PREFIX"]

log = logging.getLogger(__name__)

STEP_DIR_PREFIX = "edgetrain-pages-"
_STEP_DIR = re.compile(re.escape(STEP_DIR_PREFIX) + r"(\d+)-[0-9a-f]+")
_POLL_S = 0.05          # how often a waiting step checks that the worker thread is still alive
_JOIN_S = 2.0           # how long closing a session waits for a running transfer before leaving it behind


# --- what a page is of -------------------------------------------------------------------------

@dataclass(frozen=True)
class RecordKey:
    """The page of record ``stage``'s internals: its saved tensors besides its stage's input and output."""

    stage: int

    def __str__(self) -> str:
        return f"the record of stage {self.stage}"


PageKey = int | RecordKey   # a value x_k, or a record's internals


def page_key(op: Op) -> PageKey | None:
    """What a paging op moves; None for an op that pages nothing."""
    if isinstance(op, (PageOut, PageIn)):
        return op.value
    if isinstance(op, (PageOutRecord, PageInRecord)):
        return RecordKey(op.stage)
    return None


def _name(key: PageKey) -> str:
    return f"x_{key}" if isinstance(key, int) else str(key)


def _paths(directory: Path, key: PageKey, parts: int) -> tuple[list[Path], str]:
    """The files of a page and how messages name them: ``x<k>.page`` for a value;
    ``r<i>.<n>.page``, one per storage, for a record."""
    if isinstance(key, int):
        path = directory / f"x{key}.page"
        return [path], str(path)
    return [directory / f"r{key.stage}.{n}.page" for n in range(parts)], str(directory / f"r{key.stage}.*.page")


# --- raw file writes (a module function: tests replace it to simulate a full or failing disk) -------

def _write_bytes(path: Path, data: memoryview) -> None:
    """Write ``data`` to a new file at ``path``, looping over short writes."""
    with open(path, "wb", buffering=0) as f:
        done = 0
        while done < len(data):
            done += f.write(data[done:])


def _byte_view(storage_holder: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``storage_holder`` (keeps the storage alive)."""
    return torch.empty(0, dtype=torch.uint8, device=storage_holder.device).set_(storage_holder.untyped_storage())


# --- statistics ---------------------------------------------------------------------------------

@dataclass
class PagingStats:
    """What paging did in one step.

    ``write_s`` / ``read_s`` are the worker threads' time on the files; ``wait_s`` is the time
    the step itself stood still waiting for them (what overlap did not hide).
    ``overlapped_writes`` counts writes released after their ``PageOut`` op returned;
    ``prefetched_reads`` reads issued before their ``PageIn`` op.
    """

    pageouts: int = 0
    pageins: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    write_s: float = 0.0
    read_s: float = 0.0
    wait_s: float = 0.0
    peak_disk_bytes: int = 0
    overlapped_writes: int = 0
    prefetched_reads: int = 0


# --- worker threads ------------------------------------------------------------------------------

class _Worker(threading.Thread):
    """One daemon thread running jobs in order; each job's outcome goes to its future."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._jobs: queue.SimpleQueue[tuple[Callable[[], float], cf.Future[float]] | None] = queue.SimpleQueue()

    def submit(self, fn: Callable[[], float]) -> cf.Future[float]:
        future: cf.Future[float] = cf.Future()
        self._jobs.put((fn, future))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            del job
            if not future.set_running_or_notify_cancel():
                continue
            # Drop the job (and the tensor bytes it holds) before the step can see the outcome:
            # the step's thread must be the one that frees them (NOTE [ How a page travels ]).
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - every failure belongs to the step
                del fn
                if exc.__traceback__ is not None:
                    traceback.clear_frames(exc.__traceback__)
                future.set_exception(exc)
            else:
                del fn
                future.set_result(result)
            del future


# --- pages of one step -------------------------------------------------------------------------

@dataclass(frozen=True)
class _View:
    """A value's dtype and geometry over its storage (kept in RAM while its bytes are paged)."""

    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _View:
        return cls(tensor.dtype, tensor.size(), tensor.stride(), int(tensor.storage_offset()))


@dataclass
class _Page:
    """One value or record on its way to, on, or back from storage: one file per storage."""

    key: PageKey
    paths: list[Path]
    where: str                              # the file, or the files' pattern, for messages
    sizes: list[int]                        # bytes of each storage
    device: torch.device
    view: _View | None                      # a value's geometry; None for a record's storages
    sources: list[torch.Tensor] | None = None   # the bytes being written: dropped when the write is reaped
    write: cf.Future[float] | None = None
    buffers: list[torch.Tensor] | None = None   # the bytes being read back
    read: cf.Future[float] | None = None
    prefetched: bool = False
    overlapped: bool = False

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


class PageSession:
    """The pages of one step, in their own directory, with a writer and a reader thread.

    Use as a context manager (or call :meth:`close`): the directory and every file in it are
    removed however the step ends. Every method is called from the step's thread.
    """

    def __init__(self, store: PageStore) -> None:
        self.store = store
        self.stats = PagingStats()
        self.path = store.directory / f"{STEP_DIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(self.path, 0o700)
        except OSError as exc:
            raise _os_error(f"cannot create the step's page directory {self.path}", exc) from exc
        self._pages: dict[PageKey, _Page] = {}
        self._disk_bytes = 0
        self._writer, self._reader = store._workers()
        self._closed = False

    def __enter__(self) -> PageSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def disk_bytes(self) -> int:
        """Bytes this step has on storage now (reserved when a write is issued)."""
        return self._disk_bytes

    def on_disk(self) -> list[PageKey]:
        """Keys of the values and records written out and not read back or discarded."""
        return [key for key, page in self._pages.items() if page.read is None]

    # -- writing --

    def write(self, key: int, tensor: torch.Tensor) -> None:
        """Start writing value ``x_key``'s storage; the caller must drop its own references to it.

        Raises:
            PagingError: the value is already paged, or the write would exceed the disk budget
                (raised before anything is written).
        """
        self._write(key, [tensor], _View.of(tensor))

    def write_storages(self, key: RecordKey, tensors: Sequence[torch.Tensor]) -> None:
        """Start writing the whole storage behind each of ``tensors`` (distinct storages), as one page.

        The caller must drop its own references; :meth:`finish_read_storages` gives the storages
        back in the same order. Raises as :meth:`write`.
        """
        self._write(key, tensors, None)

    def _write(self, key: PageKey, tensors: Sequence[torch.Tensor], view: _View | None) -> None:
        if key in self._pages:
            raise PagingError(f"{_name(key)} is already paged out")
        for tensor in tensors:
            if tensor.device.type != "cpu":
                raise PagingError(f"{_name(key)} is on {tensor.device}: paging writes CPU storage only")
        sources = [_byte_view(tensor) for tensor in tensors]
        sizes = [source.numel() for source in sources]
        nbytes, budget = sum(sizes), self.store.disk_budget_bytes
        if budget is not None and self._disk_bytes + nbytes > budget:
            raise PagingError(f"paging out {_name(key)} needs {nbytes} bytes on disk with {self._disk_bytes} "
                              f"already there, over the disk budget of {budget} bytes (page directory "
                              f"{self.store.directory})")
        device = tensors[0].device if tensors else torch.device("cpu")
        paths, where = _paths(self.path, key, len(sources))
        page = _Page(key, paths, where, sizes, device, view, sources=sources)
        del tensors
        arrays = [source.numpy() for source in sources]
        page.write = self._writer.submit(partial(_write_job, page.paths, arrays))
        self._pages[key] = page
        self._disk_bytes += nbytes
        self.stats.peak_disk_bytes = max(self.stats.peak_disk_bytes, self._disk_bytes)
        self.stats.pageouts += 1
        self.stats.bytes_written += nbytes

    def write_done(self, key: PageKey) -> bool:
        page = self._pages.get(key)
        return page is None or page.write is None or page.write.done()

    def wait_write(self, key: PageKey) -> None:
        """Block until the write of ``key`` ends, then drop its bytes from RAM; raise if it failed."""
        page = self._pages[key]
        if page.write is not None:
            self._wait(page.write, self._writer, f"writing {_name(key)} to {page.where}")
            self._release_write(page)

    def reap(self) -> None:
        """Drop the RAM of every finished write; raise :class:`PagingError` for a failed one."""
        for page in list(self._pages.values()):
            if page.write is not None and page.write.done():
                self._release_write(page, overlapped=True)
            if page.read is not None and page.read.done() and page.read.exception() is not None:
                self._wait(page.read, self._reader, f"reading {_name(page.key)} from {page.where}")

    def _release_write(self, page: _Page, overlapped: bool = False) -> None:
        assert page.write is not None
        future, page.write = page.write, None
        page.sources = None          # the storages die here, on the step's thread
        page.overlapped = overlapped
        self.stats.overlapped_writes += overlapped
        self._raise_failed(future, f"writing {_name(page.key)} ({page.nbytes} bytes) to {page.where}")
        self.stats.write_s += future.result()

    # -- reading --

    def start_read(self, key: PageKey, *, prefetch: bool = False) -> None:
        """Take the bytes of ``key`` in RAM now and have the reader fill them (its write must be done)."""
        page = self._pages[key]
        if page.read is not None:
            return
        self.wait_write(key)
        page.buffers = [torch.empty(n, dtype=torch.uint8, device=page.device) for n in page.sizes]
        page.read = self._reader.submit(partial(_read_job, page.paths, [b.numpy() for b in page.buffers]))
        page.prefetched = prefetch
        self.stats.prefetched_reads += prefetch

    def reading(self, key: PageKey) -> bool:
        page = self._pages.get(key)
        return page is not None and page.read is not None

    def finish_read(self, key: int) -> torch.Tensor:
        """Wait for ``x_key``'s read and return the value as it was written (same bytes and geometry)."""
        page, [buffer] = self._finish_read(key)
        assert page.view is not None
        view = page.view
        value = torch.empty(0, dtype=view.dtype, device=page.device)
        return value.set_(buffer.untyped_storage(), view.offset, view.size, view.stride)

    def finish_read_storages(self, key: RecordKey) -> list[torch.Tensor]:
        """Wait for a record's read: a uint8 tensor over each new storage, in the order written."""
        return self._finish_read(key)[1]

    def _finish_read(self, key: PageKey) -> tuple[_Page, list[torch.Tensor]]:
        self.start_read(key)
        page = self._pages[key]
        assert page.read is not None and page.buffers is not None
        self._wait(page.read, self._reader, f"reading {_name(key)} from {page.where}")
        self.stats.read_s += page.read.result()
        buffers, page.buffers = page.buffers, None
        del self._pages[key]
        self._disk_bytes -= page.nbytes
        self.stats.pageins += 1
        self.stats.bytes_read += page.nbytes
        return page, buffers

    # -- dead values and the end of the step --

    def discard(self, key: PageKey) -> None:
        """``key`` died while paged out: forget it and delete its files."""
        page = self._pages.pop(key)
        if page.write is not None:
            if not page.write.cancel():
                self._wait(page.write, self._writer, f"writing {_name(key)} to {page.where}")
            page.write, page.sources = None, None
        for path in page.paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._disk_bytes -= page.nbytes

    def finish(self) -> None:
        """The step's ops are done: settle every outstanding write (raising its failure)."""
        for key in [key for key, page in self._pages.items() if page.write is not None]:
            self.wait_write(key)

    def close(self) -> None:
        """Cancel what has not started, let a running transfer end (briefly), drop every page
        from RAM and remove the step's directory. A worker still busy after that is left behind:
        the store starts new ones for the next step."""
        if self._closed:
            return
        self._closed = True
        running = [future for page in self._pages.values() for future in (page.write, page.read)
                   if future is not None and not future.cancel()]
        _, stuck = cf.wait(running, timeout=_JOIN_S)
        if stuck:
            log.warning("a paging thread is still busy on %s; leaving it behind", self.path)
            self.store._abandon_workers()
        self._pages.clear()
        shutil.rmtree(self.path, onerror=_log_rmtree_error)

    # -- waiting --

    def _wait(self, future: cf.Future[float], worker: _Worker, what: str) -> None:
        """Wait for a transfer, never forever: a dead worker or the store's timeout is an error."""
        start = time.perf_counter()
        timeout = self.store.io_timeout_s
        try:
            while not future.done():
                cf.wait([future], timeout=_POLL_S)
                if future.done():
                    break
                if not worker.is_alive():
                    raise PagingError(f"{what}: the paging thread {worker.name} died before finishing")
                if timeout is not None and time.perf_counter() - start > timeout:
                    raise PagingError(f"{what} did not finish within {timeout} s (is the page device stuck?)")
        finally:
            self.stats.wait_s += time.perf_counter() - start
        self._raise_failed(future, what)

    @staticmethod
    def _raise_failed(future: cf.Future[float], what: str) -> None:
        if future.cancelled():
            raise PagingError(f"{what} was cancelled")
        exc = future.exception()
        if exc is None:
            return
        if isinstance(exc, OSError):
            raise _os_error(what, exc) from exc
        raise PagingError(f"{what} failed: {exc!r}") from exc


def _write_job(paths: Sequence[Path], arrays: Sequence[Any]) -> float:
    """The writer's job: each storage's bytes to a new file; returns the seconds it took."""
    start = time.perf_counter()
    for path, array in zip(paths, arrays, strict=True):
        _write_bytes(path, memoryview(array).cast("B"))
    return time.perf_counter() - start


def _read_job(paths: Sequence[Path], arrays: Sequence[Any]) -> float:
    """The reader's job: each file into the bytes taken for it, then the file is deleted."""
    start = time.perf_counter()
    for path, array in zip(paths, arrays, strict=True):
        read_exactly(path, memoryview(array).cast("B"))
        path.unlink()
    return time.perf_counter() - start


def _os_error(what: str, exc: OSError) -> PagingError:
    """A :class:`PagingError` that names the file, the OS's reason and the errno."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else "?"
    reason = exc.strerror or str(exc)
    hint = " (the page device is full: free space or lower the step's paging)" if exc.errno == errno.ENOSPC else ""
    error = PagingError(f"{what} failed: {reason} [errno {code}]{hint}")
    error.errno = exc.errno  # type: ignore[attr-defined]
    return error


def _log_rmtree_error(function: Any, path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        log.warning("could not remove page file %s: %s", path, exc_info[1])


# --- the store ---------------------------------------------------------------------------------

class PageStore:
    """Where a step's pages go: a directory (an SD card, flash), a disk budget and an I/O timeout.

    Creating a store checks the directory and removes step directories left behind by
    processes that no longer run (NOTE [ Page files and cleanup ]).

    Args:
        directory: an existing, writable directory; None for the system's temp directory.
        disk_budget_bytes: the most a step may keep on storage at once; None for no limit.
        io_timeout_s: the longest a step waits for one transfer; None to wait as long as the
            worker thread is alive.

    Raises:
        PagingError: the directory is missing, not a directory, or not writable.

    Example:
        >>> store = PageStore("/mnt/sdcard/edgetrain", disk_budget_bytes=2 << 30)  # doctest: +SKIP
        >>> with store.session() as pages:  # doctest: +SKIP
        ...     pages.write(3, x3); del x3
        ...     x3 = pages.finish_read(3)
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, disk_budget_bytes: int | None = None,
                 io_timeout_s: float | None = None) -> None:
        if disk_budget_bytes is not None and disk_budget_bytes < 0:
            raise PagingError(f"disk_budget_bytes must be >= 0, got {disk_budget_bytes}")
        self.directory = Path(directory if directory is not None else tempfile.gettempdir())
        self.disk_budget_bytes = disk_budget_bytes
        self.io_timeout_s = io_timeout_s
        self._check_directory()
        self.removed_stale = self.clean_stale()
        self._threads: tuple[_Worker, _Worker] | None = None
        self._stop_threads: weakref.finalize | None = None

    def _workers(self) -> tuple[_Worker, _Worker]:
        """The writer and reader threads, started on first use and kept across steps (starting
        and joining threads every step would cost more than a small step's transfers)."""
        threads = self._threads
        if threads is None or not all(t.is_alive() for t in threads):
            self._abandon_workers()
            threads = (_Worker("edgetrain-page-writer"), _Worker("edgetrain-page-reader"))
            for thread in threads:
                thread.start()
            self._threads = threads
            self._stop_threads = weakref.finalize(self, _stop_workers, threads)
        return threads

    def _abandon_workers(self) -> None:
        """Let the current threads end once they are free; the next step gets new ones."""
        if self._stop_threads is not None:
            self._stop_threads()
        self._threads, self._stop_threads = None, None

    def close(self) -> None:
        """Stop the store's threads (also done when the store is garbage-collected)."""
        self._abandon_workers()

    def _check_directory(self) -> None:
        where = f"page directory {self.directory}"
        if not self.directory.exists():
            raise PagingError(f"{where} does not exist (is the storage mounted?)")
        if not self.directory.is_dir():
            raise PagingError(f"{where} is not a directory")
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise PagingError(f"{where} is not writable: {os.strerror(errno.EACCES)} [errno EACCES]")

    def clean_stale(self) -> list[Path]:
        """Remove step directories whose process is gone; returns what was removed."""
        removed: list[Path] = []
        try:
            entries = list(self.directory.iterdir())
        except OSError as exc:
            raise _os_error(f"listing page directory {self.directory}", exc) from exc
        for entry in entries:
            match = _STEP_DIR.fullmatch(entry.name)
            if match is None or pid_running(int(match.group(1))) or not entry.is_dir():
                continue
            log.info("removing pages left by a dead process: %s", entry)
            shutil.rmtree(entry, onerror=_log_rmtree_error)
            removed.append(entry)
        return removed

    @contextlib.contextmanager
    def session(self) -> Iterator[PageSession]:
        """The pages of one step; everything is removed when the block ends, however it ends."""
        pages = PageSession(self)
        try:
            yield pages
        finally:
            pages.close()

    def open(self) -> PageSession:
        """A session the caller must :meth:`PageSession.close` (when a step spans two calls)."""
        return PageSession(self)


def _stop_workers(threads: tuple[_Worker, ...]) -> None:
    for thread in threads:
        thread.stop()

