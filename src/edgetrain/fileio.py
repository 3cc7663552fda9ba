"""Files an unattended node writes: atomically and durably, and JSON that is always valid JSON.

A camera node loses power at any instant and its SD card may be full, so every file edgetrain
writes for later reading goes through :func:`write_atomic`: a temporary file in the same
directory, ``fsync``, ``os.replace``, then ``fsync`` of the directory. A reader sees the old
file or the new one, never half of one, and a failed write leaves no temporary file behind.

JSON written by the tool never holds ``NaN`` or ``Infinity`` (which JSON does not have and
strict parsers refuse): :func:`to_json` turns non-finite floats into ``null``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "write_json", "to_json", "json_safe", "fsync_dir", "read_jsonl"]


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (containers copied)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def to_json(value: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of ``value``: non-finite floats become ``null``; anything else JSON lacks raises."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def fsync_dir(directory: Path) -> None:
    """Make a rename or creation in ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. Windows, where NTFS journals renames itself
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` by ``data`` atomically and durably; on any failure nothing of the write remains.

    Raises:
        OSError: the directory is missing or unwritable, or the disk is full (``path`` unchanged).
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    fsync_dir(path.parent)
    return path


def write_json(path: str | Path, value: Any) -> Path:
    """:func:`write_atomic` of :func:`to_json` (indented, newline-terminated)."""
    return write_atomic(path, to_json(value, indent=1) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file such as a run's ``metrics.jsonl``, in order; none if it is missing.

    A line that does not parse is left out: the last one may have been cut by a kill or a power cut while
    it was appended, and the records before it are whole.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records
