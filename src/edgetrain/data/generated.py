"""Datasets generated into a folder: written atomically, reused when complete, checked for room first.

NOTE [ Generated datasets on a node nobody watches ]
The synthetic image and token datasets are pure functions of their spec, written as files under
a data root. Four rules keep an unattended node from filling up or dying on them:

* *Atomic.* The tree is written to a hidden sibling ``.<name>.tmp-<pid>-<hex8>`` and renamed
  into place with its manifest, so a crash never leaves a half-written dataset that looks complete.
  Of two generators of the same dataset (the nodes of one run share a data root), the one that
  finishes second keeps the first one's copy, which the first one's readers hold open by path.
* *Stale temporaries are removed* on every generation or reuse under the same parent folder,
  whichever dataset left them. A generator holds ``fcntl.flock`` on ``.generator.lock`` inside
  its temporary for as long as it writes; the kernel drops that lock when the process dies
  (``kill -9`` included), so a lock we can take marks a dead generator, even when its PID has been
  reused since. A temporary without the lock file (killed in the instant between ``mkdir`` and
  taking the lock, or from an older edgetrain) is judged by the PID in its name.
* *Room is checked up front*: the bytes the files will take on disk (rounded up to 4 KiB
  blocks) against the free space, and the memory drawing one sample takes against what the
  kernel reports available, so a huge request fails at once with the numbers, not with a
  ``MemoryError`` or a full card half an hour later.
* *Never someone else's folder*: an existing folder is replaced only when it is empty or holds
  a manifest of the same kind.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..sysutil.fileio import fsync_dir, write_atomic
from ..sysutil.processes import pid_running
from ..units import format_bytes
from .errors import DataError, DatasetTooLargeError, TooFewSamplesError

__all__ = [
    "BLOCK_BYTES",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "available_memory_bytes",
    "check_split",
    "check_room",
    "disk_bytes_of_files",
    "ensure_generated",
    "free_disk_bytes",
    "is_complete",
    "read_manifest",
    "remove_stale_temporaries",
    "stratified_split",
    "temporary_folder",
    "write_manifest",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".generator.lock"
BLOCK_BYTES = 4096  # a file takes whole blocks of the file system (ext4, FAT32 on SD cards: 4 KiB or more)
_TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]{8}$")
_OUTDATED = re.compile(r"^\..+\.old-[0-9a-f]{8}$")


def stratified_split(samples: int, classes: int, seed: int, val_fraction: float) -> dict[str, list[int]]:
    """Indices of the train and val splits when sample ``i`` has label ``i % classes``.

    Per class, ``round(n_class * val_fraction)`` samples (at most all but one) go to val, chosen
    by a permutation seeded with ``seed``; both lists are sorted.
    """
    rng = np.random.default_rng([seed, 0x5_9117])  # a stream apart from the drawing streams
    val: list[int] = []
    for label in range(classes):
        members = np.arange(label, samples, classes)
        n_val = min(round(len(members) * val_fraction), len(members) - 1)
        val.extend(rng.permutation(members)[:n_val].tolist())
    in_val = set(val)
    return {"train": [i for i in range(samples) if i not in in_val], "val": sorted(val)}


def check_split(samples: int, classes: int, batch: int, seed: int, val_fraction: float, *,
                option: str = "--samples") -> None:
    """Refuse, before anything is generated, ``samples`` whose split leaves less than a batch to train on or
    nothing held out.

    Raises:
        TooFewSamplesError: naming both split sizes and the least ``samples`` that works.
    """
    if _splits_work(samples, classes, batch, seed, val_fraction):
        return
    split = stratified_split(samples, classes, seed, val_fraction)
    least = next(n for n in itertools.count(max(samples, classes)) if _splits_work(n, classes, batch, seed,
                                                                                   val_fraction))
    raise TooFewSamplesError(f"{option} {samples} gives {len(split['train'])} images to train on and "
                             f"{len(split['val'])} held out ({classes} classes, {val_fraction:.0%} of each held out): "
                             f"training needs a batch of {batch} and one image held out; give {option} {least} or more")


def _splits_work(samples: int, classes: int, batch: int, seed: int, val_fraction: float) -> bool:
    split = stratified_split(samples, classes, seed, val_fraction)
    return len(split["train"]) >= batch and len(split["val"]) > 0


def read_manifest(root: str | Path, kind: str) -> dict[str, Any] | None:
    """The manifest of a generated dataset of ``kind`` at ``root``; None when missing, unreadable or another kind."""
    try:
        manifest = json.loads((Path(root) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("kind") == kind else None


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json``: the last file of a generated tree, so its presence means the rest is there."""
    write_atomic(folder / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True))


def is_complete(root: Path, expected: dict[str, Any]) -> bool:
    """Whether ``root`` holds exactly the dataset ``expected`` describes, with every listed file present."""
    if read_manifest(root, expected["kind"]) != expected:
        return False
    return all((root / rel).is_file() for files in expected["files"].values() for rel in files)


# -- room ---------------------------------------------------------------------------------------
def available_memory_bytes() -> int | None:
    """Memory the kernel can give without swapping (``MemAvailable``), else free pages; None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def free_disk_bytes(folder: Path) -> int:
    """Free bytes (for an unprivileged user) on the file system that holds ``folder`` or its nearest existing parent."""
    probe = folder.resolve()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_bytes_of_files(count: int, bytes_each: int) -> int:
    """What ``count`` files of ``bytes_each`` bytes take on disk, each rounded up to whole blocks."""
    return count * -(-max(bytes_each, 1) // BLOCK_BYTES) * BLOCK_BYTES


def check_room(root: Path, what: str, *, disk_bytes: int, memory_bytes: int) -> None:
    """Refuse, with the numbers, a generation whose files or per-sample work do not fit this machine.

    Args:
        root: where the dataset goes (its file system is the one checked).
        what: the dataset in words, for the message ("1000 images of 32x32 px").
        disk_bytes: what the files will take on disk.
        memory_bytes: the memory drawing one sample takes at its peak.

    Raises:
        DatasetTooLargeError: either does not fit.
    """
    available = available_memory_bytes()
    if available is not None and memory_bytes > available:
        raise DatasetTooLargeError(
            f"cannot generate {what}: drawing one sample takes about {format_bytes(memory_bytes)} of memory, "
            f"only {format_bytes(available)} is available; use smaller samples",
            needed_bytes=memory_bytes, available_bytes=available, path=root)
    free = free_disk_bytes(root)
    if disk_bytes > free:
        raise DatasetTooLargeError(
            f"cannot generate {what} at {root}: the files take about {format_bytes(disk_bytes)}, only "
            f"{format_bytes(free)} is free there; use fewer or smaller samples or another --data-root",
            needed_bytes=disk_bytes, available_bytes=free, path=root)


# -- temporaries --------------------------------------------------------------------------------
@contextmanager
def temporary_folder(root: Path) -> Iterator[Path]:
    """A fresh hidden sibling of ``root`` to write into, locked as ours until the block ends, then removed.

    The lock file is gone when the block's body returns, so the folder can be renamed into
    place without it; the lock itself (on the open file) is held until the very end.
    """
    temporary = root.parent / f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temporary.mkdir()
    partial = temporary / (LOCK_NAME + ".partial")  # renamed once locked: a visible lock file is always held
    try:
        with open(partial, "wb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.rename(partial, temporary / LOCK_NAME)
            yield temporary
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)


def _generator_alive(temporary: Path, pid: int) -> bool:
    """Whether the process that writes ``temporary`` still runs: its lock is held, or (no lock file) its PID lives."""
    try:
        lock = open(temporary / LOCK_NAME, "rb")  # noqa: SIM115 - `with` below; a missing file is told apart here
    except FileNotFoundError:
        return pid_running(pid)
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def remove_stale_temporaries(parent: Path) -> list[Path]:
    """Delete the temporaries of dead generators, and folders a swap moved aside, under ``parent``.

    Returns:
        The folders removed.
    """
    if not parent.is_dir():
        return []
    removed = []
    for entry in parent.iterdir():
        temporary = _TEMPORARY.match(entry.name)
        stale = (_OUTDATED.match(entry.name) is not None or
                 (temporary is not None and not _generator_alive(entry, int(temporary.group(1)))))
        if stale and entry.is_dir():
            logger.warning("removing %s, left by a generator that stopped", entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


# -- the whole flow -----------------------------------------------------------------------------
def _refuse_foreign(root: Path, kind: str) -> None:
    """Never replace a folder that is not ours: it must be missing, empty or hold a manifest of ``kind``."""
    if root.exists() and not root.is_dir():
        raise DataError(f"{root} exists and is not a folder", path=root)
    if root.is_dir() and read_manifest(root, kind) is None and any(root.iterdir()):
        raise DataError(f"refusing to write a generated dataset into {root}: it is not empty and has no "
                        f"{MANIFEST_NAME} of a {kind} dataset; choose another folder", path=root)


def _swap_in(temporary: Path, root: Path, expected: dict[str, Any]) -> None:
    """Rename ``temporary`` to ``root``; an outdated ``root`` is moved aside first and deleted after.

    The rename is tried first because it is atomic and fails on a ``root`` that holds files: a ``root`` that another
    process completed with the same data meanwhile is then kept, not moved aside, as its readers (the other nodes of a
    run that share the data root) open its files by path as they go.
    """
    outdated = None
    try:
        os.rename(temporary, root)
    except OSError:
        if is_complete(root, expected):
            logger.info("another process wrote %s first; using its copy", root)
            return
        outdated = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(root, outdated)
        os.rename(temporary, root)
    fsync_dir(root.parent)
    if outdated is not None:
        shutil.rmtree(outdated, ignore_errors=True)


def ensure_generated(root: Path, spec: dict[str, Any], kind: str, manifest: Callable[[], dict[str, Any]],
                     write_tree: Callable[[Path, dict[str, Any]], None], *, what: str, disk_bytes: int,
                     memory_bytes: int) -> Path:
    """Reuse the complete dataset at ``root`` or generate it (see NOTE [ Generated datasets on a node nobody watches ]).

    Args:
        root: the dataset folder.
        spec: the settings, as stored under the manifest's ``"spec"``: a dataset with other ones is replaced.
        kind: the manifest's ``"kind"``.
        manifest: builds the expected manifest (called only once the room is checked, as a
            huge request would make a huge file list).
        write_tree: writes every file and then the manifest into the folder it is given.
        what, disk_bytes, memory_bytes: as for :func:`check_room`.

    Raises:
        DataError: ``root`` is someone else's folder. DatasetTooLargeError: no room.
    """
    remove_stale_temporaries(root.parent)
    found = read_manifest(root, kind)
    if found is not None and found.get("spec") == spec:
        expected = manifest()
        if is_complete(root, expected):
            logger.info("reusing the generated dataset at %s", root)
            return root
    _refuse_foreign(root, kind)
    check_room(root, what, disk_bytes=disk_bytes, memory_bytes=memory_bytes)
    expected = manifest()
    root.parent.mkdir(parents=True, exist_ok=True)
    logger.info("generating %s at %s", what, root)
    with temporary_folder(root) as temporary:
        write_tree(temporary, expected)
        (temporary / LOCK_NAME).unlink()  # not part of the dataset; the lock itself stays held
        _swap_in(temporary, root, expected)
    return root
