"""Files an unattended node writes: atomically and durably, and JSON that is always valid JSON.

A camera node loses power at any instant and its SD card may be full, so every file edgetrain
writes for later reading goes through :func:`write_atomic`: a temporary file in the same
directory, ``fsync``, ``os.replace``, then ``fsync`` of the directory. A reader sees the old
file or the new one, never half of one, and a failed write leaves no temporary file behind.

A command refused for its input leaves the directory it was given as it was, though finding
that out can need work that writes there first (a dataset generated, a batch profiled):
:class:`LeftAsItWas` removes what the command made unless it reached its first write of its
own results.

JSON written by the tool never holds ``NaN`` or ``Infinity`` (which JSON does not have and
strict parsers refuse): :func:`to_json` turns non-finite floats into ``null``.

Raw bytes read back into memory (a page file, a storage probe's file) go through
:func:`read_exactly`, which refuses a file of another size than the buffer.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

__all__ = ["atomic_file", "write_atomic", "write_json", "to_json", "json_safe", "fsync_dir", "read_jsonl",
           "read_exactly", "LeftAsItWas"]


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


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A temporary file beside ``path`` that durably replaces it when the block ends without an error.

    On any error the temporary file is removed and ``path`` is left as it was; the error propagates.
    """
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    fsync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` by ``data`` atomically and durably; on any failure nothing of the write remains.

    Raises:
        OSError: the directory is missing or unwritable, ``path`` is a directory, or the disk is full
            (``path`` unchanged); its ``filename`` is ``path``, never the temporary file's.
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file name", str(path))
    try:
        with atomic_file(path) as file:
            file.write(payload)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
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


def read_exactly(path: Path, into: memoryview) -> None:
    """Fill ``into`` from the file at ``path``, unbuffered, looping over short reads.

    Raises:
        OSError: ``EIO`` when the file is shorter or longer than ``into``; whatever opening or reading raises.
    """
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < len(into):
            n = f.readinto(into[done:])
            if not n:
                raise OSError(errno.EIO, f"{path} is {done} bytes, expected {len(into)}")
            done += n
        if f.read(1):
            raise OSError(errno.EIO, f"{path} is longer than the expected {len(into)} bytes")


class LeftAsItWas:
    """Within the ``with`` block, a directory that is put back as it was if the block raises before :meth:`commit`.

    What the block created is removed: entries of ``path`` that were not there when the block began, or
    ``path`` itself (and the parents it needed) if it did not exist when this object was made. Entries that
    were there are not touched, so a resumed run's files stay; the block must not modify them before it
    commits. ``own`` names entries made between this object and the block (a lock file taken first) that
    are removed too if they were not there before.

    Example:
        >>> undo = LeftAsItWas(run_dir, own=(".lock",))
        >>> with RunDirectory(run_dir) as run, undo:   # doctest: +SKIP
        ...     check_everything(run_dir)        # may write a cache into run_dir, may raise
        ...     undo.commit()                    # from here on the directory is the run's
        ...     write_results(run_dir)
    """

    def __init__(self, path: str | Path, *, own: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self._made = _first_missing(self.path)
        self._own = set() if self._made is not None else {name for name in own if not (self.path / name).exists()}
        self._before: set[str] = set()
        self.committed = False

    def __enter__(self) -> LeftAsItWas:
        if self._made is None:
            self._before = set(os.listdir(self.path)) - self._own
        return self

    def commit(self) -> None:
        """The block's own results start here: what it made is kept from now on, whatever follows."""
        self.committed = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None or self.committed:
            return
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
        elif self.path.is_dir():
            for name in set(os.listdir(self.path)) - self._before:
                _remove(self.path / name)


def _first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist; None if ``path`` exists."""
    if path.exists():
        return None
    missing = path
    while not missing.parent.exists():
        missing = missing.parent
    return missing


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
