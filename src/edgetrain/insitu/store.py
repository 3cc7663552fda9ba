"""The node's frame store: labelled crops on disk under a byte quota, with a crash-safe manifest.

NOTE [ Frame store on an SD card ]
``manifest.json`` is the store: a frame exists for readers when the manifest lists it. Every
change keeps two invariants, whatever instant the power fails:

* **listed frames are whole**: new frame files are written and flushed to disk (one
  ``os.sync`` per batch, far cheaper than an ``fsync`` per 2 KB file) *before* the manifest
  naming them is replaced atomically (:func:`edgetrain.sysutil.fileio.write_atomic`); an evicted
  frame leaves the manifest *before* its file is deleted. Files the manifest does not list
  (a batch cut short) are deleted when the store is opened.
* **the quota holds on disk**: eviction frees room (manifest first, then files) before the
  new files are written, so frame files and the manifest together never exceed
  ``quota_bytes``. The manifest is charged :data:`MANIFEST_ENTRY_BYTES` per frame plus
  :data:`MANIFEST_HEADER_BYTES` (its compact JSON takes less); while it is being replaced, the
  new copy sits beside the old one for an instant.

The manifest also holds the writer's ``cursor`` (how far into its camera stream the stored
batches reach), replaced in the same atomic write as the frames it covers: a service that
resumes from it neither skips nor repeats a stored batch. Readers in other processes (the
student) read the manifest with :func:`listed_frames` and never open the store for writing
(opening removes unlisted files, which may be a batch the writer is about to list).

A manifest is checked field by field when it is read, and a writer opening the store checks that every listed
file is there with its listed size: a hand-edited or damaged store is refused, naming the manifest and the
field, before the service does any work (:func:`check_store`), never kept or repaired in silence.

Eviction keeps classes balanced: while the stored frames and a new batch together do not fit,
the oldest frame of the class holding the most bytes goes (a batch's own frames included: they
are then never written).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import EdgetrainError
from ..sysutil.fileio import fsync_dir, to_json, write_atomic
from ..units import format_bytes
from .detect import CROP_PX
from .world import CLASSES

__all__ = ["StoredFrame", "FrameStore", "balance", "encode_png", "listed_frames", "decode_png", "check_store",
           "check_quota", "MANIFEST_ENTRY_BYTES", "MANIFEST_HEADER_BYTES"]

MANIFEST = "manifest.json"
MANIFEST_ENTRY_BYTES = 128  # charged per listed frame; an entry's JSON is < 100 bytes up to 10-digit numbers
MANIFEST_HEADER_BYTES = 128


@dataclass(frozen=True)
class StoredFrame:
    name: str  # file name in the store's directory
    label: int
    nbytes: int
    track: int  # the tracker's id (which camera track the frame came from)
    seq: int  # insertion order: eviction takes the oldest of a class first


def encode_png(crop: np.ndarray) -> bytes:
    """A crop (h, w, 3) uint8 as PNG bytes (lossless; ~2-3 KB at 32 px)."""
    buffer = io.BytesIO()
    Image.fromarray(crop).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_png(path: Path) -> np.ndarray:
    """A stored crop (h, w, 3) uint8."""
    return np.asarray(Image.open(path).convert("RGB"))


class ManifestError(EdgetrainError):
    """A manifest that this module did not write as it is: the message names the file and the field."""

    def __init__(self, manifest: Path, field: str, problem: str) -> None:
        super().__init__(f"{manifest}: {field} {problem}; the frame store cannot be opened")


def _read_manifest(manifest: Path) -> tuple[list[StoredFrame], int, int]:
    """The listed frames, the next sequence number and the cursor, each field checked.

    Raises:
        ManifestError: a field is missing or not what the store writes there.
    """
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise EdgetrainError(f"{manifest} is not a frame-store manifest: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(manifest, "the top level", "is not a JSON object")
    next_seq = _count(manifest, data, "next_seq")
    cursor = _count(manifest, data, "cursor") if "cursor" in data else 0
    entries = data.get("frames")
    if not isinstance(entries, list):
        raise ManifestError(manifest, "frames", "is missing or not a list")
    frames = [_frame(manifest, f"frames[{k}]", entry, next_seq) for k, entry in enumerate(entries)]
    names = [f.name for f in frames]
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ManifestError(manifest, f"frames[{names.index(twice, names.index(twice) + 1)}].name",
                            f"lists {twice} a second time")
    return frames, next_seq, cursor


def _count(manifest: Path, record: dict[str, object], field: str, name: str | None = None) -> int:
    """``record[field]``, a non-negative integer (``name``: the field as the message names it)."""
    value = record.get(field)
    if type(value) is not int or value < 0:  # bool is an int subclass: true is no count
        shown = "missing" if field not in record else f"{json.dumps(value)}, not a non-negative integer"
        raise ManifestError(manifest, name or field, f"is {shown}")
    return value


def _frame(manifest: Path, where: str, entry: object, next_seq: int) -> StoredFrame:
    """One listed frame, each field checked: the name the store gives its sequence number, a class label."""
    if not isinstance(entry, dict):
        raise ManifestError(manifest, where, "is not a JSON object")
    unknown = sorted(set(entry) - {"name", "label", "nbytes", "track", "seq"})
    if unknown:
        raise ManifestError(manifest, f"{where}.{unknown[0]}", "is not a field of a stored frame")
    label, nbytes, track, seq = (_count(manifest, entry, field, f"{where}.{field}")
                                 for field in ("label", "nbytes", "track", "seq"))
    if label >= len(CLASSES):
        raise ManifestError(manifest, f"{where}.label", f"is {label}, not a class (0 to {len(CLASSES) - 1})")
    if seq >= next_seq:
        raise ManifestError(manifest, f"{where}.seq", f"is {seq}, not below next_seq {next_seq}")
    if entry.get("name") != _file_name(seq):
        raise ManifestError(manifest, f"{where}.name", f"is {json.dumps(entry.get('name'))}, not "
                            f"{json.dumps(_file_name(seq))} (the name of seq {seq})")
    return StoredFrame(_file_name(seq), label, nbytes, track, seq)


def _file_name(seq: int) -> str:
    return f"{seq:09d}.png"


def _check_listed_files(manifest: Path, frames: Sequence[StoredFrame]) -> None:
    """Every listed frame's file is there with its listed size (NOTE [ Frame store on an SD card ]: listed frames
    are whole)."""
    for k, frame in enumerate(frames):
        try:
            size = (manifest.parent / frame.name).stat().st_size
        except FileNotFoundError:
            raise ManifestError(manifest, f"frames[{k}].name", f"lists {frame.name}, which is not in "
                                f"{manifest.parent}") from None
        if size != frame.nbytes:
            raise ManifestError(manifest, f"frames[{k}].nbytes", f"is {frame.nbytes}, the file holds {size} bytes")


def check_store(root: Path) -> None:
    """Refuse a store whose manifest or listed files are not as the store writes them, changing nothing.

    A new store (no manifest yet) passes.

    Raises:
        EdgetrainError: naming the manifest and the field.
    """
    manifest = root / MANIFEST
    if manifest.exists():
        _check_listed_files(manifest, _read_manifest(manifest)[0])


def check_quota(quota_bytes: int) -> None:
    """Refuse a quota that cannot hold a crop: the manifest's charges and the PNG of a crop of noise (which PNG
    cannot compress: the largest a crop's file is)."""
    noise = np.random.default_rng(0).integers(0, 256, size=(CROP_PX, CROP_PX, 3), dtype=np.uint8)
    least = MANIFEST_HEADER_BYTES + MANIFEST_ENTRY_BYTES + len(encode_png(noise))
    if quota_bytes < least:
        raise ValueError(f"--quota {format_bytes(quota_bytes)} cannot hold a crop: the store needs at least "
                         f"{format_bytes(least)} ({least} bytes; a crop's PNG and its manifest entry)")


def listed_frames(root: Path) -> list[StoredFrame]:
    """The frames a store's manifest lists now, read without opening the store (for readers in other processes).

    A listed frame may be evicted (its file deleted) right after this returns: readers skip a
    missing file.
    """
    manifest = root / MANIFEST
    return _read_manifest(manifest)[0] if manifest.exists() else []


class FrameStore:
    """Labelled crops in ``root`` within ``quota_bytes`` (see NOTE [ Frame store on an SD card ])."""

    def __init__(self, root: Path, quota_bytes: int) -> None:
        if quota_bytes <= 0:
            raise ValueError(f"the store's quota must be positive, got {quota_bytes} bytes")
        self.root = root
        self.quota_bytes = quota_bytes
        root.mkdir(parents=True, exist_ok=True)
        self._frames: list[StoredFrame] = []
        self._next_seq = 0
        self._cursor = 0
        manifest = root / MANIFEST
        if manifest.exists():
            self._frames, self._next_seq, self._cursor = _read_manifest(manifest)
            _check_listed_files(manifest, self._frames)
        else:
            self._write_manifest()  # an empty store is a store
        self._remove_unlisted()

    @property
    def frames(self) -> tuple[StoredFrame, ...]:
        return tuple(self._frames)

    @property
    def cursor(self) -> int:
        """The writer's position in its stream as of the last batch (0 for a new store)."""
        return self._cursor

    @property
    def charged_bytes(self) -> int:
        """What the quota counts: the frames' bytes and the manifest's charge (always <= ``quota_bytes``)."""
        return self.bytes_used + MANIFEST_ENTRY_BYTES * len(self._frames) + MANIFEST_HEADER_BYTES

    @property
    def bytes_used(self) -> int:
        return sum(f.nbytes for f in self._frames)

    def add(self, items: Sequence[tuple[bytes, int, int]], *, cursor: int | None = None) -> list[StoredFrame]:
        """Store ``(encoded frame, label, track)`` items as one batch; returns the stored frames evicted for room.

        ``cursor`` (the writer's stream position after this batch) is listed with the batch, in
        the same atomic manifest write; a batch with no items still records it.

        Eviction balances classes over the stored frames and the batch together (:func:`balance`),
        so a batch's own frames are left out, oldest first, when their class is the one holding
        the most bytes.

        Raises:
            ValueError: one item alone is larger than the quota.
        """
        if not items:
            if cursor is not None:
                self._cursor = cursor
                self._write_manifest()
            return []
        if max(len(data) for data, _, _ in items) + MANIFEST_ENTRY_BYTES + MANIFEST_HEADER_BYTES > self.quota_bytes:
            raise ValueError(f"a frame larger than the store's whole quota ({self.quota_bytes} bytes, "
                             f"{MANIFEST_ENTRY_BYTES + MANIFEST_HEADER_BYTES} of them for the manifest)")
        incoming = [StoredFrame(_file_name(self._next_seq + k), label, len(data), track, self._next_seq + k)
                    for k, (data, label, track) in enumerate(items)]
        payload = {f.name: data for f, (data, _, _) in zip(incoming, items, strict=True)}
        self._next_seq += len(items)
        kept, dropped = balance([*self._frames, *incoming], self.quota_bytes)
        evicted = [f for f in dropped if f.name not in payload]
        if evicted:
            gone = {f.name for f in evicted}
            self._frames = [f for f in self._frames if f.name not in gone]
            self._write_manifest()  # unlisted first, then deleted
            for f in evicted:
                (self.root / f.name).unlink()
        new = [f for f in kept if f.name in payload]
        for f in new:
            with open(self.root / f.name, "wb") as file:
                file.write(payload[f.name])
        _flush_to_disk(self.root)
        self._frames += new
        if cursor is not None:
            self._cursor = cursor
        self._write_manifest()
        return evicted

    def relabel(self, labels_by_track: Mapping[int, int]) -> int:
        """Give every listed frame of a track in ``labels_by_track`` that label (one atomic manifest write).

        A self-training round's new votes; frames and bytes are unchanged, so the quota still
        holds. Returns how many frames changed label.
        """
        changed = [replace(f, label=labels_by_track[f.track]) if f.track in labels_by_track else f
                   for f in self._frames]
        count = sum(a.label != b.label for a, b in zip(changed, self._frames, strict=True))
        if count:
            self._frames = changed
            self._write_manifest()
        return count

    def keep_tracks(self, tracks: Collection[int]) -> int:
        """Remove every listed frame of a track not in ``tracks`` (unlisted first, then deleted); returns how many.

        A cross-fitted self-training round keeps only the tracks it is surest of.
        """
        gone = [f for f in self._frames if f.track not in tracks]
        if gone:
            self._frames = [f for f in self._frames if f.track in tracks]
            self._write_manifest()
            for f in gone:
                (self.root / f.name).unlink()
        return len(gone)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """All listed crops (n, h, w, 3) uint8 and their labels (n,); an empty store gives empty arrays."""
        if not self._frames:
            return np.zeros((0, CROP_PX, CROP_PX, 3), dtype=np.uint8), np.zeros(0, dtype=np.int64)
        crops = np.stack([decode_png(self.root / f.name) for f in self._frames])
        return crops, np.array([f.label for f in self._frames])

    def _write_manifest(self) -> None:
        write_atomic(self.root / MANIFEST, to_json({"quota_bytes": self.quota_bytes, "next_seq": self._next_seq,
                                                    "cursor": self._cursor,
                                                    "frames": [asdict(f) for f in self._frames]}) + "\n")

    def _remove_unlisted(self) -> None:
        listed = {f.name for f in self._frames}
        for path in self.root.glob("*.png"):
            if path.name not in listed:
                path.unlink()
        for path in self.root.glob(f".{MANIFEST}.*.tmp"):  # a manifest write cut short
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def balance(frames: Sequence[StoredFrame], quota_bytes: int) -> tuple[list[StoredFrame], list[StoredFrame]]:
    """The frames kept within ``quota_bytes`` and those dropped: while over, the oldest of the class holding most bytes.

    Each frame costs its bytes plus :data:`MANIFEST_ENTRY_BYTES`, and the manifest's header
    :data:`MANIFEST_HEADER_BYTES`. Ties between classes go to the lower label, so the outcome is
    a function of the frames alone.
    """
    kept = sorted(frames, key=lambda f: f.seq)
    per_class: dict[int, int] = {}
    for f in kept:
        per_class[f.label] = per_class.get(f.label, 0) + f.nbytes + MANIFEST_ENTRY_BYTES
    total = sum(per_class.values()) + MANIFEST_HEADER_BYTES
    dropped = []
    while total > quota_bytes:
        biggest = max(per_class, key=lambda c: (per_class[c], -c))
        victim = next(f for f in kept if f.label == biggest)  # the oldest: kept is in seq order
        kept.remove(victim)
        dropped.append(victim)
        per_class[biggest] -= victim.nbytes + MANIFEST_ENTRY_BYTES
        total -= victim.nbytes + MANIFEST_ENTRY_BYTES
    return kept, dropped


def _flush_to_disk(directory: Path) -> None:
    """Make the files just written in ``directory`` durable: one ``sync`` where the OS has it."""
    if hasattr(os, "sync"):
        os.sync()
    else:  # pragma: no cover - Windows
        for path in directory.glob("*.png"):
            with open(path, "rb+") as file:
                os.fsync(file.fileno())
    fsync_dir(directory)
