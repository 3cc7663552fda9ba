"""Errors of :mod:`edgetrain.data`; each message is one line that names the file, folder or figure at fault."""

from __future__ import annotations

from pathlib import Path

from ..errors import EdgetrainError

__all__ = [
    "CorruptSampleError",
    "DataError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "DatasetSpecError",
    "DatasetTooLargeError",
    "InputKindError",
    "TooFewClassesError",
    "TooFewSamplesError",
]


class DataError(EdgetrainError):
    """A dataset that cannot be used as asked; ``path`` names the file or folder at fault."""

    def __init__(self, message: str, *, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        super().__init__(message)


class DatasetNotFoundError(DataError, FileNotFoundError):
    """No dataset by that name or at that path."""


class DatasetFormatError(DataError):
    """A folder or file that is not a dataset edgetrain can read (empty, wrong layout, truncated)."""


class TooFewClassesError(DatasetFormatError):
    """A dataset with fewer than two classes that hold samples: nothing to classify."""


class CorruptSampleError(DataError):
    """One sample that cannot be read or decoded (unreadable image, bad record)."""


class TooFewSamplesError(DataError):
    """Fewer readable samples than a task needs (e.g. one batch, after skipping corrupt ones)."""


class DatasetSpecError(DataError, ValueError):
    """Settings no dataset can have (samples < 1, fewer samples than classes, too small images)."""


class InputKindError(DataError):
    """Data of a kind the model cannot take (images for a token model)."""


class DatasetTooLargeError(DataError):
    """A dataset to generate that this machine cannot hold: ``needed_bytes`` > ``available_bytes``."""

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int,
                 path: Path | str | None = None) -> None:
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        super().__init__(message, path=path)
