"""CIFAR-10 in its binary distribution format, for users who have the files (nothing is downloaded).

The format (the "binary version" of CIFAR-10, files ``data_batch_1.bin`` .. ``data_batch_5.bin``
and ``test_batch.bin``) is a plain sequence of 3073-byte records: one label byte (0..9), then
3072 pixel bytes, the 1024 red values of a 32x32 image in row-major order, then the green
ones, then the blue ones. ``batches.meta.txt`` holds the class names, one per line.

Records are read one at a time through the dataset's reader (never the whole file), so a
2 GB device never holds the 150 MB training set in memory and the stall profiler sees the
real per-sample reads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

from .cache import ByteReader
from .errors import CorruptSampleError, DatasetFormatError, DatasetNotFoundError
from .folder import DEFAULT_MEAN, DEFAULT_STD, ByteRange, FileDataset, Sample, Transform, as_size, normalise

__all__ = ["CIFAR10_CLASSES", "CifarBinary", "RECORD_BYTES", "find_cifar_files", "is_cifar_folder"]

logger = logging.getLogger(__name__)

CIFAR_SIDE = 32
RECORD_BYTES = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE  # label byte + R, G, B planes
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_TRAIN_PATTERN = "data_batch_*.bin"
_TEST_NAME = "test_batch.bin"
_META_NAME = "batches.meta.txt"
_EXTRACTED_DIR = "cifar-10-batches-bin"  # what the official archive unpacks to


def _batches_dir(root: Path) -> Path:
    """``root`` itself, or the ``cifar-10-batches-bin`` folder inside it."""
    inner = root / _EXTRACTED_DIR
    return inner if inner.is_dir() else root


def is_cifar_folder(root: str | Path) -> bool:
    """Whether ``root`` (or its ``cifar-10-batches-bin``) holds CIFAR-10 binary batch files."""
    folder = _batches_dir(Path(root))
    return folder.is_dir() and (any(folder.glob(_TRAIN_PATTERN)) or (folder / _TEST_NAME).is_file())


def find_cifar_files(root: str | Path) -> tuple[list[Path], list[Path]]:
    """The training batch files (sorted) and the test batch file (a list of zero or one)."""
    folder = _batches_dir(Path(root))
    if not folder.is_dir():
        raise DatasetNotFoundError(f"no CIFAR-10 folder at {root}", path=root)
    train = sorted(folder.glob(_TRAIN_PATTERN))
    test = [folder / _TEST_NAME] if (folder / _TEST_NAME).is_file() else []
    if not train and not test:
        raise DatasetFormatError(f"{folder} has no CIFAR-10 binary files ({_TRAIN_PATTERN} or {_TEST_NAME})",
                                 path=folder)
    return train, test


def _class_names(folder: Path) -> list[str]:
    """Names from ``batches.meta.txt`` when present, else the CIFAR-10 names."""
    meta = folder / _META_NAME
    if meta.is_file():
        names = [line.strip() for line in meta.read_text(encoding="utf-8", errors="replace").splitlines()]
        names = [n for n in names if n]
        if names:
            return names
    return list(CIFAR10_CLASSES)


def _count_records(path: Path, skip_corrupt: bool) -> tuple[int, int]:
    """Whole records in ``path`` and whether a truncated record trails them (0 or 1)."""
    if not path.is_file():
        raise DatasetNotFoundError(f"no CIFAR-10 batch file at {path}", path=path)
    size_bytes = path.stat().st_size
    n_records, tail_bytes = divmod(size_bytes, RECORD_BYTES)
    if tail_bytes == 0 and n_records > 0:
        return n_records, 0
    problem = (f"{path} is empty" if size_bytes == 0 else
               f"{path} is truncated or not a CIFAR-10 binary batch: {size_bytes} bytes is not a whole number "
               f"of {RECORD_BYTES}-byte records ({tail_bytes} bytes left over)")
    if not skip_corrupt:
        raise DatasetFormatError(problem, path=path)
    logger.warning("skipping a partial record: %s", problem)
    return n_records, int(tail_bytes > 0)


class CifarBinary(FileDataset):
    """Records of CIFAR-10 binary batch files; returns (normalised float (3,H,W) tensor, int label).

    Args:
        files: the batch files, read in order (e.g. from :func:`find_cifar_files`).
        image_size: the 32x32 images are resized (bilinear, antialiased) when this differs.
        classes: class names in label order (default: ``batches.meta.txt`` or the CIFAR-10 names);
            a label byte not below ``len(classes)`` marks a corrupt record.
        mean, std, transform, skip_corrupt, reader: as for :class:`~edgetrain.data.ImageFolder`.
            A file whose size is not a whole number of records raises
            :class:`~edgetrain.data.DatasetFormatError`, or with ``skip_corrupt`` counts its
            partial record as corrupt and reads the whole ones.

    Example:
        >>> train_files, test_files = find_cifar_files("~/cifar-10-batches-bin")  # doctest: +SKIP
        >>> train = CifarBinary(train_files, image_size=32)                           # doctest: +SKIP
    """

    def __init__(self, files: Sequence[str | Path], *, image_size: int | tuple[int, int] = CIFAR_SIDE,
                 classes: Sequence[str] | None = None, mean: Sequence[float] = DEFAULT_MEAN,
                 std: Sequence[float] = DEFAULT_STD, transform: Transform | None = None,
                 skip_corrupt: bool = False, reader: ByteReader | None = None) -> None:
        self.paths = [Path(f) for f in files]
        if not self.paths:
            raise DatasetFormatError("no CIFAR-10 batch files given")
        self.classes = list(classes) if classes is not None else _class_names(self.paths[0].parent)
        counts = [_count_records(p, skip_corrupt) for p in self.paths]
        # sample i is record i of the concatenated files; `_records` maps it to (file, record)
        self._records = np.concatenate([np.stack([np.full(n, k), np.arange(n)], axis=1)
                                        for k, (n, _) in enumerate(counts)]).astype(np.int64)
        if len(self._records) == 0:
            raise DatasetFormatError(f"no whole CIFAR-10 records in {', '.join(map(str, self.paths))}",
                                     path=self.paths[0])
        self.image_size = as_size(image_size)
        self.mean, self.std = tuple(mean), tuple(std)
        super().__init__(transform=transform, skip_corrupt=skip_corrupt, reader=reader, n_samples=len(self._records))
        self._corrupt_outside_samples = sum(tail for _, tail in counts)
        logger.info("CIFAR-10 binary: %d records from %d files", len(self._records), len(self.paths))

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"CifarBinary({[p.name for p in self.paths]}, samples={len(self)})"

    def source(self, index: int) -> ByteRange:
        file_index, record = self._records[index].tolist()
        return ByteRange(self.paths[file_index], record * RECORD_BYTES, RECORD_BYTES)

    @property
    def targets(self) -> list[int]:
        """Every record's label byte, read with a strided memory map (touches every record's page)."""
        labels = np.empty(len(self._records), dtype=np.int64)
        for k, path in enumerate(self.paths):
            rows = np.flatnonzero(self._records[:, 0] == k)
            if rows.size:
                mapped = np.memmap(path, dtype=np.uint8, mode="r")
                labels[rows] = mapped[self._records[rows, 1] * RECORD_BYTES]
                del mapped
        return labels.tolist()

    def _decode(self, raw: bytes, index: int) -> Sample:
        where = self.source(index)
        if len(raw) != RECORD_BYTES:
            raise CorruptSampleError(f"short read: {len(raw)} of {RECORD_BYTES} bytes at offset {where.offset}",
                                     path=where.path)
        label = raw[0]
        if label >= len(self.classes):
            raise CorruptSampleError(f"label byte {label} at offset {where.offset} is not below "
                                     f"{len(self.classes)} classes", path=where.path)
        pixels = torch.frombuffer(bytearray(raw[1:]), dtype=torch.uint8).view(3, CIFAR_SIDE, CIFAR_SIDE)
        image = normalise(pixels, self.mean, self.std)
        if image.shape[1:] != self.image_size:
            image = functional.interpolate(image.unsqueeze(0), size=self.image_size, mode="bilinear",
                                           align_corners=False, antialias=True).squeeze(0)
        return image, int(label)

    def _select(self, indices: Sequence[int]) -> None:
        self._records = self._records[np.asarray(indices, dtype=np.int64)].reshape(-1, 2)
