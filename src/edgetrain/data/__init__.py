"""Datasets, loaders, caches and the data-stall profiler, all offline.

* :func:`generate_synthetic` draws the built-in dataset (``--data synthetic``) as image files,
  :func:`generate_synthetic_tokens` its token counterpart for the transformers (binary records);
* :class:`ImageFolder` and :class:`CifarBinary` read class-per-subfolder images and CIFAR-10
  binary batches through a swappable byte reader;
* :func:`open_dataset` picks one of them from a name or a path and returns train and val sets;
* :class:`MinIOCache` / :class:`LRUCache` keep sample bytes in a byte budget across epochs;
* :func:`analyze_stalls` measures how long training waits on fetching and pre-processing.

See ``docs/guide/data.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .cache import (
    ByteReader,
    CacheStats,
    CachingReader,
    FileReader,
    LRUCache,
    MinIOCache,
    ThrottledReader,
    replay_epochs,
)
from .cifar import CIFAR10_CLASSES, CifarBinary, find_cifar_files, is_cifar_folder
from .errors import (
    CorruptSampleError,
    DataError,
    DatasetFormatError,
    DatasetNotFoundError,
    DatasetSpecError,
    DatasetTooLargeError,
    InputKindError,
    TooFewClassesError,
    TooFewSamplesError,
)
from .folder import ByteRange, FileDataset, ImageFolder, collate_skip_corrupt, first_batch, make_loader, train_val_split
from .generated import remove_stale_temporaries
from .stall import StallReport, StallRow, analyze_stalls, drop_page_cache, make_step_fn, stall_table
from .synthetic import SyntheticSpec, generate_synthetic, read_manifest
from .tokens import SyntheticTokenSpec, TokenRecords, generate_synthetic_tokens, read_token_manifest

__all__ = [
    "ByteRange", "ByteReader", "CIFAR10_CLASSES", "CacheStats", "CachingReader", "CifarBinary",
    "CorruptSampleError", "DataError", "DatasetFormatError", "DatasetNotFoundError", "DatasetSpecError",
    "DatasetTooLargeError", "FileDataset", "FileReader", "ImageFolder", "InputKindError", "LRUCache",
    "MinIOCache", "StallReport", "StallRow", "SyntheticSpec", "SyntheticTokenSpec", "ThrottledReader",
    "TokenRecords", "TooFewClassesError", "TooFewSamplesError", "analyze_stalls", "collate_skip_corrupt",
    "default_data_root", "drop_page_cache", "find_cifar_files", "first_batch", "generate_synthetic",
    "generate_synthetic_tokens", "is_cifar_folder", "make_loader", "make_step_fn", "open_dataset",
    "read_manifest", "read_token_manifest", "remove_stale_temporaries", "replay_epochs", "stall_table",
    "train_val_split",
]

SYNTHETIC = "synthetic"
SYNTHETIC_CLASSES = 10
VAL_FRACTION = 0.2  # held out of a dataset that has no val part of its own
_SPLIT_NAMES = (("train", "val"), ("train", "valid"), ("train", "test"))


def default_data_root() -> Path:
    """Where generated datasets go: ``$EDGETRAIN_DATA``, else ``~/.cache/edgetrain/data``."""
    configured = os.environ.get("EDGETRAIN_DATA")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "edgetrain" / "data"


def _synthetic(root: Path, *, image_size: int, samples: int, seed: int, classes: int,
               image_format: str, skip_corrupt: bool) -> tuple[FileDataset, FileDataset, int]:
    folder = root / f"synthetic-c{classes}-px{image_size}-n{samples}-seed{seed}-{image_format}"
    generate_synthetic(folder, samples=samples, image_size=image_size, classes=classes, seed=seed,
                       image_format=image_format)
    manifest = read_manifest(folder)
    assert manifest is not None  # generate_synthetic just wrote or checked it
    names = manifest["class_names"]
    train = ImageFolder(folder / "train", image_size=image_size, classes=names, skip_corrupt=skip_corrupt)
    val = ImageFolder(folder / "val", image_size=image_size, classes=names, skip_corrupt=skip_corrupt)
    return train, val, len(names)


def _synthetic_tokens(root: Path, *, seq_len: int, vocab_size: int, samples: int, seed: int, classes: int,
                      skip_corrupt: bool) -> tuple[FileDataset, FileDataset, int]:
    folder = root / f"tokens-c{classes}-len{seq_len}-v{vocab_size}-n{samples}-seed{seed}"
    generate_synthetic_tokens(folder, samples=samples, seq_len=seq_len, vocab_size=vocab_size, classes=classes,
                              seed=seed)
    manifest = read_token_manifest(folder)
    assert manifest is not None  # generate_synthetic_tokens just wrote or checked it
    names = manifest["class_names"]
    train, val = (TokenRecords(folder / f"{split}.bin", seq_len=seq_len, vocab_size=vocab_size, classes=names,
                               skip_corrupt=skip_corrupt) for split in ("train", "val"))
    return train, val, len(names)


def _image_folder(path: Path, *, image_size: int, seed: int, val_fraction: float,
                  skip_corrupt: bool) -> tuple[FileDataset, FileDataset, int]:
    for train_name, val_name in _SPLIT_NAMES:
        if (path / train_name).is_dir() and (path / val_name).is_dir():
            train: FileDataset = ImageFolder(path / train_name, image_size=image_size, skip_corrupt=skip_corrupt)
            val: FileDataset = ImageFolder(path / val_name, image_size=image_size, classes=train.classes,
                                           skip_corrupt=skip_corrupt)
            return train, val, train.num_classes
    whole = ImageFolder(path, image_size=image_size, skip_corrupt=skip_corrupt)
    train, val = train_val_split(whole, val_fraction=val_fraction, seed=seed)
    return train, val, whole.num_classes


def _cifar(path: Path, *, image_size: int, seed: int, val_fraction: float,
           skip_corrupt: bool) -> tuple[FileDataset, FileDataset, int]:
    train_files, test_files = find_cifar_files(path)
    if not train_files:
        raise DatasetFormatError(f"{path} holds only the CIFAR-10 test batch ({test_files[0].name}), no "
                                 f"data_batch_*.bin to train on; a model trained on the test set has no test",
                                 path=path)
    if test_files:
        train: FileDataset = CifarBinary(train_files, image_size=image_size, skip_corrupt=skip_corrupt)
        val: FileDataset = CifarBinary(test_files, image_size=image_size, classes=train.classes,
                                       skip_corrupt=skip_corrupt)
        return train, val, train.num_classes
    whole = CifarBinary(train_files, image_size=image_size, skip_corrupt=skip_corrupt)
    train, val = train_val_split(whole, val_fraction=val_fraction, seed=seed)
    return train, val, whole.num_classes


def open_dataset(name_or_path: str | Path, *, image_size: int = 32, samples: int = 1000, seed: int = 0,
                 root: str | Path | None = None, classes: int = SYNTHETIC_CLASSES, image_format: str = "png",
                 val_fraction: float = VAL_FRACTION, skip_corrupt: bool = False,
                 vocab_size: int | None = None) -> tuple[FileDataset, FileDataset, int]:
    """Train and validation datasets and the number of classes, from a name or a folder.

    Args:
        name_or_path: ``"synthetic"`` (generated under ``root``, reused when it exists), a folder
            of CIFAR-10 ``.bin`` batches (``test_batch.bin`` becomes val), or a class-per-subfolder
            image folder (with ``train/`` and ``val/`` subfolders, or split here).
        image_size: side of the square tensors returned; for token data the sequence length.
        samples: synthetic only: images (or sequences) in total (train + val).
        seed: synthetic drawing, and the split of a folder that has no val part.
        root: where synthetic datasets are written (default :func:`default_data_root`).
        classes, image_format: synthetic only (see :func:`generate_synthetic`).
        val_fraction: share held out when the data has no val part of its own.
        skip_corrupt: skip and count unreadable samples instead of raising.
        vocab_size: for a token model (``ModelSpec.vocab_size``): the data is token sequences,
            ``((image_size,) int64 ids below vocab_size, label)``, which only ``"synthetic"``
            provides (:func:`generate_synthetic_tokens`). None: images.

    Returns:
        ``(train, val, num_classes)``.

    Raises:
        DatasetNotFoundError: a name that is not "synthetic" and a path that does not exist.
        DatasetFormatError: a folder that is neither layout, holds no images, or (CIFAR) holds
            only the test batch.
        TooFewClassesError: fewer than two classes with samples.
        InputKindError: a folder or CIFAR dataset for token data.
        DatasetSpecError, DatasetTooLargeError: synthetic settings that are impossible or do
            not fit this machine.

    Example:
        >>> train, val, n = open_dataset("synthetic", image_size=32, samples=1000, seed=0,
        ...                              root="/tmp/edgetrain-data")  # doctest: +SKIP
    """
    if str(name_or_path) == SYNTHETIC:
        base = Path(root).expanduser() if root is not None else default_data_root()
        if vocab_size is not None:
            return _synthetic_tokens(base, seq_len=image_size, vocab_size=vocab_size, samples=samples, seed=seed,
                                     classes=classes, skip_corrupt=skip_corrupt)
        return _synthetic(base, image_size=image_size, samples=samples, seed=seed, classes=classes,
                          image_format=image_format, skip_corrupt=skip_corrupt)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise DatasetNotFoundError(f"no dataset named or at {str(name_or_path)!r}: pass {SYNTHETIC!r}, a folder "
                                   "of class subfolders with images, or a folder of CIFAR-10 .bin files",
                                   path=path)
    if not path.is_dir():
        raise DatasetFormatError(f"{path} is a file; pass the folder that holds the dataset", path=path)
    if vocab_size is not None:
        raise InputKindError(f"{path} holds images, but the model takes token ids; train a token model on "
                             f"--data {SYNTHETIC}, or an image model on this folder", path=path)
    if is_cifar_folder(path):
        opened = _cifar(path, image_size=image_size, seed=seed, val_fraction=val_fraction, skip_corrupt=skip_corrupt)
    else:
        opened = _image_folder(path, image_size=image_size, seed=seed, val_fraction=val_fraction,
                               skip_corrupt=skip_corrupt)
    _check_classes(opened[0], path)
    return opened


def _check_classes(train: FileDataset, path: Path) -> None:
    """Refuse training data with fewer than two classes: a classifier has nothing to learn."""
    if train.num_classes < 2:
        names = ", ".join(map(repr, train.classes)) or "none"
        raise TooFewClassesError(f"{path} has {train.num_classes} class{'es' if train.num_classes != 1 else ''} "
                                 f"with samples ({names}); a classifier needs at least two", path=path)
