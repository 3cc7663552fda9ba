"""Image-classification datasets read from files: a class-per-subfolder image folder, and what it shares.

NOTE [ Corrupt samples ]
A sample that cannot be read or decoded raises :class:`CorruptSampleError` naming its file.
With ``skip_corrupt=True`` the dataset returns ``None`` for it instead, logs a warning once per
sample, and marks it in a shared-memory flag array (one byte per sample), so
``dataset.corrupt_count`` is right in the main process even when DataLoader workers found the
samples. :func:`collate_skip_corrupt` (used by :func:`make_loader`) drops the ``None`` items, so
a batch can be smaller than ``batch_size``; a batch whose samples were all corrupt comes out
as ``None`` and the training loop skips it.
"""

from __future__ import annotations

import copy
import io
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from ..sysutil.processes import worker_dies_with_parent
from .cache import ByteReader, FileReader
from .errors import CorruptSampleError, DatasetFormatError, DatasetNotFoundError, TooFewSamplesError

__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "IMAGE_EXTENSIONS",
    "ByteRange",
    "FileDataset",
    "ImageFolder",
    "collate_skip_corrupt",
    "first_batch",
    "make_loader",
    "train_val_split",
]

logger = logging.getLogger(__name__)

DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)  # with the mean above, pixels land in [-1, 1]
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".webp", ".tif", ".tiff")
Transform = Callable[[torch.Tensor], torch.Tensor]
Sample = tuple[torch.Tensor, int]


@dataclass(frozen=True)
class ByteRange:
    """Where a sample's raw bytes are: ``size`` bytes of ``path`` from ``offset`` (None: to the end)."""

    path: Path
    offset: int = 0
    size: int | None = None


# What a decoder raises on bad bytes: PIL raises OSError (truncated), UnidentifiedImageError
# (an OSError), SyntaxError or ValueError (some plugins); a missing file is an OSError too.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, CorruptSampleError)


def _new_flags(n_samples: int) -> torch.Tensor:
    """One shared-memory byte per sample, so workers' findings reach the main process."""
    return torch.zeros(n_samples, dtype=torch.uint8).share_memory_()


def as_size(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """``(height, width)`` from an int or a pair, checked."""
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    if height < 1 or width < 1:
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    return int(height), int(width)


def normalise(pixels_chw: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (C,H,W) to float32 (C,H,W): scaled to [0, 1], then ``(x - mean) / std`` per channel."""
    scaled = pixels_chw.to(torch.float32).div_(255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return scaled.sub_(mean_t).div_(std_t)


class FileDataset(Dataset[Any]):
    """A map-style dataset whose samples are byte ranges of files, read through a swappable reader.

    Subclasses say where sample ``i`` lives (:meth:`source`) and how to decode its bytes
    (:meth:`_decode`); this class reads, handles corrupt samples (see NOTE [ Corrupt samples ])
    and applies the user's ``transform``. The stall profiler relies on :meth:`with_reader` and
    :meth:`files` to measure the same pipeline with cold, throttled or in-memory bytes.
    """

    classes: list[str]

    def __init__(self, *, transform: Transform | None, skip_corrupt: bool, reader: ByteReader | None,
                 n_samples: int) -> None:
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        self.reader: ByteReader = reader if reader is not None else FileReader()
        self._corrupt = _new_flags(n_samples)
        self._corrupt_outside_samples = 0  # e.g. a truncated record that has no index

    # -- what subclasses provide -------------------------------------------------------------
    def __len__(self) -> int:
        raise NotImplementedError

    def source(self, index: int) -> ByteRange:
        """Where sample ``index``'s raw bytes are."""
        raise NotImplementedError

    def _decode(self, raw: bytes, index: int) -> Sample:
        """Raw bytes to the sample's tensor (normalised (C,H,W) float pixels, or (L,) int64 ids) and its label."""
        raise NotImplementedError

    def _select(self, indices: Sequence[int]) -> None:
        """Keep only ``indices`` of the subclass's own per-sample lists (for :meth:`subset`)."""
        raise NotImplementedError

    @property
    def targets(self) -> list[int]:
        """The label of every sample, in order (used to stratify splits)."""
        raise NotImplementedError

    # -- shared behaviour --------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def corrupt_count(self) -> int:
        """How many corrupt samples were found (and skipped) so far, across DataLoader workers."""
        return int(self._corrupt.sum()) + self._corrupt_outside_samples

    @property
    def corrupt_indices(self) -> list[int]:
        return torch.nonzero(self._corrupt).flatten().tolist()

    def files(self) -> list[Path]:
        """Every distinct file the samples live in (the profiler drops them from the page cache)."""
        return sorted({self.source(i).path for i in range(len(self))})

    def __getitem__(self, index: int) -> Sample | None:
        index = self._check_index(index)
        if self.skip_corrupt and self._corrupt[index]:
            return None
        where = self.source(index)
        try:
            raw = self.reader.read(where.path, where.offset, where.size)
            pixels, label = self._decode(raw, index)
        except _DECODE_ERRORS as exc:
            self._on_corrupt(index, where, exc)
            return None
        if self.transform is not None:
            pixels = self.transform(pixels)
        return pixels, label

    def _check_index(self, index: int) -> int:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        return index % n

    def _on_corrupt(self, index: int, where: ByteRange, exc: BaseException) -> None:
        message = f"corrupt sample {index} in {where.path}: {exc}"
        if not self.skip_corrupt:
            raise CorruptSampleError(message + " (pass skip_corrupt=True to skip such samples)",
                                     path=where.path) from exc
        if not self._corrupt[index]:
            self._corrupt[index] = 1
            logger.warning("skipping %s", message)
        return None

    def log_corrupt_summary(self) -> int:
        """Log how many samples were skipped as corrupt (a warning when any); return the count."""
        count = self.corrupt_count
        if count:
            logger.warning("%d of %d samples were corrupt and skipped", count, len(self))
        else:
            logger.info("no corrupt samples found among %d", len(self))
        return count

    def with_reader(self, reader: ByteReader) -> FileDataset:
        """The same dataset reading its bytes through ``reader`` (shares the corrupt flags)."""
        clone = copy.copy(self)
        clone.reader = reader
        return clone

    def subset(self, indices: Sequence[int]) -> FileDataset:
        """A dataset of samples ``indices`` of this one, in that order, with its own corrupt flags."""
        picked = [self._check_index(int(i)) for i in indices]
        clone = copy.copy(self)
        clone._select(picked)
        clone._corrupt = _new_flags(len(picked))
        if picked:
            clone._corrupt.copy_(self._corrupt[torch.tensor(picked, dtype=torch.long)])
        clone._corrupt_outside_samples = 0
        return clone


def _decode_image(raw: bytes, image_size: tuple[int, int]) -> torch.Tensor:
    """Encoded image bytes to uint8 (3,H,W), resized to ``image_size`` (height, width)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.load()  # decode now, so a truncated file fails here and not later
            rgb = image.convert("RGB")
    except UnidentifiedImageError:
        raise CorruptSampleError(f"not an image format Pillow can decode ({len(raw)} bytes)") from None
    height, width = image_size
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1)  # (3, H, W)


def _images_in(folder: Path, suffixes: set[str]) -> list[Path]:
    """The image files directly in ``folder``, sorted (none when it is not a folder)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def _scan_folder(root: Path, classes: Sequence[str] | None,
                 extensions: Iterable[str]) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names and ``(file, label)`` pairs of a class-per-subfolder tree, sorted for determinism.

    Found class folders without images are left out (with a warning), so they take no label; a
    given ``classes`` list is kept whole, as a validation folder may lack a class of training.
    """
    if not root.is_dir():
        raise DatasetNotFoundError(f"no image folder at {root}", path=root)
    suffixes = {e.lower() for e in extensions}
    names = list(classes) if classes is not None else sorted(p.name for p in root.iterdir()
                                                             if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise DatasetFormatError(f"{root} has no class subfolders; expected {root}/<class>/<image files>",
                                 path=root)
    files = {name: _images_in(root / name, suffixes) for name in names}
    for name in (n for n in names if not files[n]):
        logger.warning("class folder %s has no images%s", root / name,
                       "" if classes is not None else "; it is not counted as a class")
    if classes is None:
        names = [n for n in names if files[n]]
    samples = [(path, label) for label, name in enumerate(names) for path in files[name]]
    if not samples:
        raise DatasetFormatError(f"{root} has no image files ({', '.join(sorted(suffixes))}) in its class "
                                 "subfolders", path=root)
    return names, samples


class ImageFolder(FileDataset):
    """Images in ``root/<class name>/<file>``; returns (normalised float (3,H,W) tensor, int label).

    Like torchvision's ImageFolder, but reading through a :class:`~edgetrain.data.cache.ByteReader`
    so the stall profiler and the caches can sit under it, and with corrupt-sample handling.

    Args:
        root: the folder whose subfolders are the classes (sorted names give labels 0, 1, ...).
        image_size: every image is resized to this (an int for square, or (height, width)).
        classes: class names in label order; default: the sorted subfolder names. Pass it so a
            validation folder with a missing class keeps the training labels.
        mean, std: per-channel normalisation after scaling pixels to [0, 1].
        transform: applied to the normalised tensor (augmentation); not treated as corruption.
        skip_corrupt: skip and count unreadable images instead of raising.
        reader: where bytes come from (default: the file system).

    Example:
        >>> train = ImageFolder("data/train", image_size=32)        # doctest: +SKIP
        >>> pixels, label = train[0]; pixels.shape                    # doctest: +SKIP
        torch.Size([3, 32, 32])
    """

    def __init__(self, root: str | Path, *, image_size: int | tuple[int, int] = 32,
                 classes: Sequence[str] | None = None, mean: Sequence[float] = DEFAULT_MEAN,
                 std: Sequence[float] = DEFAULT_STD, transform: Transform | None = None,
                 skip_corrupt: bool = False, reader: ByteReader | None = None,
                 extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        self.root = Path(root)
        self.classes, self.samples = _scan_folder(self.root, classes, extensions)
        self.image_size = as_size(image_size)
        self.mean, self.std = tuple(mean), tuple(std)
        super().__init__(transform=transform, skip_corrupt=skip_corrupt, reader=reader, n_samples=len(self.samples))
        logger.info("image folder %s: %d images, %d classes", self.root, len(self.samples), len(self.classes))

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return f"ImageFolder({str(self.root)!r}, samples={len(self)}, classes={self.num_classes})"

    @property
    def targets(self) -> list[int]:
        return [label for _, label in self.samples]

    def source(self, index: int) -> ByteRange:
        return ByteRange(self.samples[index][0])

    def files(self) -> list[Path]:
        return sorted({path for path, _ in self.samples})

    def _decode(self, raw: bytes, index: int) -> Sample:
        pixels = _decode_image(raw, self.image_size)
        return normalise(pixels, self.mean, self.std), self.samples[index][1]

    def _select(self, indices: Sequence[int]) -> None:
        self.samples = [self.samples[i] for i in indices]


def train_val_split(dataset: FileDataset, *, val_fraction: float = 0.2,
                    seed: int = 0) -> tuple[FileDataset, FileDataset]:
    """Split into train and validation sets, stratified by label, the same way for the same seed.

    Each class gives ``round(n_class * val_fraction)`` samples to validation (at least one stays
    in training), chosen by a permutation seeded with ``seed``; both parts keep the dataset order.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    rng = np.random.default_rng(seed)
    targets = np.asarray(dataset.targets)
    val_indices: list[int] = []
    for label in np.unique(targets).tolist():
        members = np.flatnonzero(targets == label)
        n_val = min(round(len(members) * val_fraction), len(members) - 1)
        val_indices.extend(rng.permutation(members)[:n_val].tolist())
    in_val = np.zeros(len(targets), dtype=bool)
    in_val[val_indices] = True
    return dataset.subset(np.flatnonzero(~in_val).tolist()), dataset.subset(np.flatnonzero(in_val).tolist())


def collate_skip_corrupt(batch: list[Sample | None]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Stack the samples that are not None (skipped corrupt ones); None when none are left."""
    kept = [item for item in batch if item is not None]
    if not kept:
        return None
    pixels, labels = default_collate(kept)
    return pixels, labels


def first_batch(dataset: FileDataset, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``batch`` readable samples in index order, stacked: what a run profiles before it trains.

    A sample that comes back None (corrupt, skipped) is passed over, so a skipped sample in the
    first ``batch`` indices costs one more read, not a crash.

    Returns:
        ``(inputs (batch, ...), labels (batch,) int64)``.

    Raises:
        TooFewSamplesError: the whole dataset has fewer than ``batch`` readable samples.
    """
    readable = (item for item in (dataset[i] for i in range(len(dataset))) if item is not None)
    items = list(itertools.islice(readable, batch))
    if len(items) < batch:  # every sample was read
        raise TooFewSamplesError(f"only {len(items)} of {len(dataset)} samples are readable "
                                 f"({len(dataset) - len(items)} corrupt), fewer than one batch of {batch}")
    inputs, labels = default_collate(items)
    return inputs, labels


def make_loader(dataset: Dataset[Any], *, batch_size: int, workers: int = 0, shuffle: bool = True,
                seed: int = 0, drop_last: bool = False) -> DataLoader[Any]:
    """A DataLoader that shuffles reproducibly (``seed``) and drops skipped corrupt samples.

    Batches are ``(pixels (B,3,H,W) float32, labels (B,) int64)``, or None when every sample of
    a batch was corrupt and skipped.
    """
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
                      collate_fn=collate_skip_corrupt, drop_last=drop_last, generator=generator,
                      persistent_workers=False, worker_init_fn=worker_dies_with_parent)
