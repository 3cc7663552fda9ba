"""The node's frame store: labelled crops on disk under a byte quota, with a crash-safe manifest.

NOTE [ Frame store on an SD card ]
``manifest.json`` is the store: a frame exists for readers when the manifest lists it. Every
change keeps two invariants, whatever instant the power fails:

* **listed frames are whole**: new frame files are written and flushed to disk (one
  ``os.sync`` per batch, far cheaper than an ``fsync`` per 2 KB file) *before* the manifest
  naming them is replaced atomically (:func:`edgetrain.fileio.write_atomic`); an evicted
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
from ..fileio import fsync_dir, to_json, write_atomic
from .detect import CROP_PX

__all__ = ["StoredFrame", "FrameStore", "balance", "encode_png", "listed_frames", "decode_png", "MANIFEST_ENTRY_BYTES",
           "MANIFEST_HEADER_BYTES"]

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


def _read_manifest(manifest: Path) -> tuple[list[StoredFrame], int, int]:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        return [StoredFrame(**f) for f in data["frames"]], int(data["next_seq"]), int(data.get("cursor", 0))
    except (ValueError, KeyError, TypeError) as exc:
        raise EdgetrainError(f"{manifest} is not a frame-store manifest: {exc}") from None


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
        incoming = [StoredFrame(f"{self._next_seq + k:09d}.png", label, len(data), track, self._next_seq + k)
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
