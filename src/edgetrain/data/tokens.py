"""A synthetic token-classification dataset for the transformer models, written as binary records.

The transformers take int64 token ids of shape (seq_len,), not pixels, so ``--data synthetic``
with a token model generates this set instead of images. Each class owns
:data:`KEYWORDS_PER_CLASS` keyword tokens (disjoint between classes, drawn by the seed from the
vocabulary). Every position of a sequence is one of its class's keywords with probability
:data:`KEYWORD_RATE`, else a token uniform over the vocabulary (other classes' keywords
included, as noise), and one random position holds a keyword for sure. A model that gathers
which keywords occur separates the classes. The zoo's transformers classify from position 0,
a keyword 40% of the time: plain SGD (lr 0.01) learns that much, 0.48 validation accuracy on
10 classes (chance 0.1) after 4 epochs of 480 sequences of 16 tokens; Adam (lr 1e-3) learns to
attend to the other positions too and reaches 0.99.

Layout under ``root``::

    manifest.json   # kind, spec, class names, split sizes, files
    train.bin       # records of (1 + seq_len) little-endian uint16: the label, then the ids
    val.bin

Like the image set: sample ``i`` is drawn from ``numpy.random.default_rng([seed, i])`` (label
``i % classes``), the split is the same stratified one, and the files are written atomically,
reused when complete and checked for room first (NOTE [ Generated datasets on a node nobody
watches ] in ``generated.py``). Records are read one at a time through the dataset's reader, so
the stall profiler and the caches work as for images.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cache import ByteReader
from .errors import CorruptSampleError, DatasetFormatError, DatasetSpecError
from .folder import ByteRange, FileDataset, Sample, Transform
from .generated import BLOCK_BYTES, ensure_generated, read_manifest, stratified_split, write_manifest

__all__ = ["KEYWORDS_PER_CLASS", "KEYWORD_RATE", "SyntheticTokenSpec", "TokenRecords", "class_keywords",
           "draw_sequence", "generate_synthetic_tokens", "read_token_manifest"]

logger = logging.getLogger(__name__)

_MANIFEST_KIND = "edgetrain-synthetic-tokens"
_MANIFEST_VERSION = 1
_ID = np.dtype("<u2")  # ids and label: vocabularies up to 65536 (BERT's has 30522)
KEYWORDS_PER_CLASS = 8
KEYWORD_RATE = 0.4
_KEYWORD_STREAM = 0x70CE  # a stream apart from the per-sample ones


@dataclass(frozen=True)
class SyntheticTokenSpec:
    """What determines a synthetic token dataset; two equal specs give byte-identical files."""

    samples: int = 1000
    seq_len: int = 32
    vocab_size: int = 1000
    classes: int = 10
    seed: int = 0
    val_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise DatasetSpecError(f"samples must be at least 1, got {self.samples}")
        if self.classes < 2:
            raise DatasetSpecError(f"classes must be at least 2, got {self.classes}")
        if self.samples < self.classes:
            raise DatasetSpecError(f"need at least one sample per class: samples={self.samples} < "
                                   f"classes={self.classes}")
        if self.seq_len < 1:
            raise DatasetSpecError(f"sequence length must be at least 1, got {self.seq_len}")
        lowest = self.classes * KEYWORDS_PER_CLASS
        if not lowest <= self.vocab_size <= np.iinfo(_ID).max + 1:
            raise DatasetSpecError(f"vocab_size must be in {lowest}..{np.iinfo(_ID).max + 1} for {self.classes} "
                                   f"classes of {KEYWORDS_PER_CLASS} keywords, got {self.vocab_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise DatasetSpecError(f"val_fraction must be in [0, 1), got {self.val_fraction}")

    @property
    def record_bytes(self) -> int:
        return _ID.itemsize * (1 + self.seq_len)

    def class_names(self) -> list[str]:
        return [f"{k:02d}-keywords" for k in range(self.classes)]


def class_keywords(spec: SyntheticTokenSpec) -> np.ndarray:
    """(classes, KEYWORDS_PER_CLASS) int64: each class's keyword ids, disjoint between classes."""
    rng = np.random.default_rng([spec.seed, _KEYWORD_STREAM])
    chosen = rng.permutation(spec.vocab_size)[:spec.classes * KEYWORDS_PER_CLASS]
    return chosen.reshape(spec.classes, KEYWORDS_PER_CLASS).astype(np.int64)


def draw_sequence(spec: SyntheticTokenSpec, index: int, keywords: np.ndarray) -> tuple[np.ndarray, int]:
    """The (seq_len,) int64 ids and the label of sample ``index``; a pure function of ``(spec, index)``."""
    label = index % spec.classes
    rng = np.random.default_rng([spec.seed, index])
    ids = rng.integers(0, spec.vocab_size, size=spec.seq_len)  # (L,)
    is_keyword = rng.random(spec.seq_len) < KEYWORD_RATE
    is_keyword[rng.integers(spec.seq_len)] = True
    ids[is_keyword] = rng.choice(keywords[label], size=int(is_keyword.sum()))
    return ids, label


def _manifest(spec: SyntheticTokenSpec) -> dict[str, Any]:
    splits = stratified_split(spec.samples, spec.classes, spec.seed, spec.val_fraction)
    return {
        "kind": _MANIFEST_KIND,
        "version": _MANIFEST_VERSION,
        "spec": asdict(spec),
        "class_names": spec.class_names(),
        "split_sizes": {split: len(indices) for split, indices in splits.items()},
        "files": {split: [f"{split}.bin"] for split in splits},
    }


def read_token_manifest(root: str | Path) -> dict[str, Any] | None:
    """The manifest of a synthetic token dataset at ``root``, or None when there is none or it is unreadable."""
    return read_manifest(root, _MANIFEST_KIND)


def _write_records(folder: Path, spec: SyntheticTokenSpec, manifest: dict[str, Any]) -> None:
    """Every split's records, then the manifest."""
    keywords = class_keywords(spec)
    splits = stratified_split(spec.samples, spec.classes, spec.seed, spec.val_fraction)
    for split, indices in splits.items():
        with open(folder / f"{split}.bin", "wb") as records:
            for index in indices:
                ids, label = draw_sequence(spec, index, keywords)
                records.write(np.concatenate([[label], ids]).astype(_ID).tobytes())
    write_manifest(folder, manifest)


def generate_synthetic_tokens(root: str | Path, *, samples: int = 1000, seq_len: int = 32, vocab_size: int = 1000,
                              classes: int = 10, seed: int = 0, val_fraction: float = 0.2) -> Path:
    """Write (or reuse) the synthetic token dataset the arguments describe at ``root``; return ``root``.

    Args:
        root: the dataset folder, replaced only when empty or holding a token dataset.
        samples: sequences in total (train + val); labels cycle 0, 1, ..., so classes are balanced.
        seq_len: tokens per sequence.
        vocab_size: ids lie in ``0..vocab_size - 1``.
        classes: number of classes (each needs :data:`KEYWORDS_PER_CLASS` ids of the vocabulary).
        seed: keywords, sequences and split follow from it.
        val_fraction: share of each class held out in ``val.bin``.

    Raises:
        DatasetSpecError: impossible settings. DatasetTooLargeError: the files do not fit the free
            disk space. DataError: ``root`` is someone else's folder.

    Example:
        >>> root = generate_synthetic_tokens("/tmp/tokens", samples=200, seq_len=16)  # doctest: +SKIP
        >>> TokenRecords(root / "train.bin", seq_len=16, vocab_size=1000, classes=10)[0][0].shape  # doctest: +SKIP
        torch.Size([16])
    """
    spec = SyntheticTokenSpec(samples=samples, seq_len=seq_len, vocab_size=vocab_size, classes=classes, seed=seed,
                              val_fraction=val_fraction)
    disk_bytes = samples * spec.record_bytes + 2 * BLOCK_BYTES  # two files, each rounded up to whole blocks
    return ensure_generated(
        Path(root).expanduser(), asdict(spec), _MANIFEST_KIND, lambda: _manifest(spec),
        lambda folder, manifest: _write_records(folder, spec, manifest),
        what=f"{samples} synthetic token sequences of length {seq_len} ({classes} classes, seed {seed})",
        disk_bytes=disk_bytes, memory_bytes=8 * spec.record_bytes)


class TokenRecords(FileDataset):
    """Fixed-size token records of one file; returns ((seq_len,) int64 ids, int label).

    Args:
        path: a ``train.bin`` or ``val.bin`` of :func:`generate_synthetic_tokens`.
        seq_len, vocab_size: the record length and the bound every id must stay below.
        classes: class names in label order; a label not below ``len(classes)`` or an id not
            below ``vocab_size`` marks a corrupt record.
        transform, skip_corrupt, reader: as for :class:`~edgetrain.data.ImageFolder`.
    """

    def __init__(self, path: str | Path, *, seq_len: int, vocab_size: int, classes: Sequence[str],
                 transform: Transform | None = None, skip_corrupt: bool = False,
                 reader: ByteReader | None = None) -> None:
        self.path = Path(path)
        self.seq_len, self.vocab_size, self.classes = seq_len, vocab_size, list(classes)
        self.record_bytes = _ID.itemsize * (1 + seq_len)
        n_records, tail_bytes = divmod(self.path.stat().st_size, self.record_bytes)
        if tail_bytes:
            raise DatasetFormatError(f"{self.path} is truncated: {tail_bytes} bytes past its last whole "
                                     f"{self.record_bytes}-byte record", path=self.path)
        self._indices = np.arange(n_records, dtype=np.int64)  # record of each sample
        super().__init__(transform=transform, skip_corrupt=skip_corrupt, reader=reader, n_samples=n_records)
        logger.info("token records %s: %d sequences of %d ids", self.path, n_records, seq_len)

    def __len__(self) -> int:
        return len(self._indices)

    def __repr__(self) -> str:
        return f"TokenRecords({str(self.path)!r}, samples={len(self)}, seq_len={self.seq_len})"

    def source(self, index: int) -> ByteRange:
        return ByteRange(self.path, int(self._indices[index]) * self.record_bytes, self.record_bytes)

    def files(self) -> list[Path]:
        return [self.path]

    @property
    def targets(self) -> list[int]:
        if len(self) == 0:
            return []
        records = np.memmap(self.path, dtype=_ID, mode="r").reshape(-1, 1 + self.seq_len)
        return records[self._indices, 0].astype(np.int64).tolist()

    def _decode(self, raw: bytes, index: int) -> Sample:
        offset = self.source(index).offset
        if len(raw) != self.record_bytes:
            raise CorruptSampleError(f"short read: {len(raw)} of {self.record_bytes} bytes at offset {offset}",
                                     path=self.path)
        record = np.frombuffer(raw, dtype=_ID).astype(np.int64)
        label, ids = int(record[0]), record[1:]
        if label >= len(self.classes):
            raise CorruptSampleError(f"label {label} at offset {offset} is not below {len(self.classes)} classes",
                                     path=self.path)
        if int(ids.max()) >= self.vocab_size:
            raise CorruptSampleError(f"token id {int(ids.max())} at offset {offset} is not below the vocabulary "
                                     f"of {self.vocab_size}", path=self.path)
        return torch.from_numpy(ids), label

    def _select(self, indices: Sequence[int]) -> None:
        self._indices = self._indices[np.asarray(indices, dtype=np.int64)]
