"""Crash-safe, resumable training state: what to save, how to write it durably, how to resume.

Edge devices lose power and write to slow, fragile SD cards, so a run must be able to stop at
any instant and continue as if it never had. A :class:`TrainingState` holds everything that
decides the rest of a run (weights, optimizer state, the checkpointing schedule, every RNG,
the step and epoch counters, the position in the data order, and free-form metadata); a
:class:`StateStore` writes it atomically and durably and finds the newest intact copy again.

NOTE [ State file format ]
A state file is a fixed 64-byte header followed by a ``torch.save`` payload (a zip archive)::

    offset  size  field
         0     8  magic b"EDGTSTAT"
         8     4  format version, uint32 little-endian (1)
        12     8  payload length in bytes, uint64 little-endian
        20    32  SHA-256 digest of the payload bytes
        52    12  reserved, zero

The payload is streamed to disk through a hashing writer, so saving never holds a second
serialized copy of the model in memory; loading checks the size and the digest in one
streaming pass before ``torch.load`` reads the payload in place through an offset view.
The digest lives in the same file as the data it covers, so one ``os.replace`` publishes
both at once: there is no window in which a sidecar and its data disagree.

The payload holds only tensors, plain containers and primitives (the schedule as its JSON
dict, RNG states as tensors and ints), so it loads with ``torch.load(weights_only=True)``:
resuming never unpickles arbitrary code. :func:`save_state` rejects anything else up front,
naming the offending key, rather than writing a file that would later refuse to load.

NOTE [ Durable write protocol ]
1. write header placeholder + payload to ``.state-<step>.pt.<random>.tmp`` in the run
   directory (same file system, so the rename below is atomic); fill in the header;
2. ``flush`` + ``os.fsync`` the temp file: its bytes are on the card;
3. ``os.replace`` it onto ``state-<step:09d>.pt``: readers see the old file or the new one;
4. ``os.fsync`` the directory: the rename itself survives a power cut;
5. only then delete states beyond the newest ``keep_last``.
A crash before 3 leaves a stray temp file, which loading ignores and the next
``load_latest``/``save`` deletes; a crash after 3 leaves a complete file. One process writes
a run directory at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import random
import re
import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.data import Sampler

from ..core.optim import TrainingOptimizer
from ..core.schedule import Schedule
from ..errors import EdgetrainError
from ..sysutil.fileio import atomic_file, fsync_dir

__all__ = [
    "TrainingState", "StateStore", "ResumableSampler", "StateError", "CorruptStateError",
    "capture_rng", "restore_rng", "save_state", "load_state", "STATE_FORMAT_VERSION",
]

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 1
_MAGIC = b"EDGTSTAT"
_HEADER = struct.Struct("<8sIQ32s12x")  # magic, version, payload bytes, sha256
_HEADER_BYTES = _HEADER.size  # 64
_READ_CHUNK_BYTES = 1 << 20
_STATE_NAME = re.compile(r"state-(\d{9,})\.pt")
_TEMP_NAME = re.compile(r"\.state-\d{9,}\.pt\..+\.tmp")
_PAYLOAD_KIND = "edgetrain.train.state"


class StateError(EdgetrainError):
    """A training state that cannot be saved or resumed (unsafe payload, nothing valid to load)."""


class CorruptStateError(StateError):
    """One state file that is truncated, altered or unreadable; carries its path and why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


# --------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """Snapshot every global random stream a training step may draw from.

    Dropout and random augmentation draw from torch's CPU (and CUDA) generator, user code
    often from Python's ``random`` or NumPy's legacy global generator; a resumed run draws the
    same numbers as an uninterrupted one only if all of them continue from where they were.
    The result contains only tensors, ints, floats and strings (safe for ``weights_only``).

    Returns:
        ``{"torch": uint8 tensor, "cuda": [uint8 tensor per device], "python": {...},
        "numpy": {...}}``; ``"cuda"`` is empty when CUDA is unavailable.

    Example:
        >>> rng = capture_rng(); a = torch.rand(3); restore_rng(rng); torch.equal(a, torch.rand(3))
        True
    """
    version, internal, gauss_next = random.getstate()
    name, key, pos, has_gauss, cached_gaussian = cast("tuple[str, np.ndarray, int, int, float]",
                                                      np.random.get_state(legacy=True))
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else [],
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"bit_generator": str(name), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
    }


def restore_rng(rng: Mapping[str, Any]) -> None:
    """Put every global random stream back to a :func:`capture_rng` snapshot.

    CUDA states are restored when this machine has as many devices as the snapshot; otherwise
    a warning says the CUDA streams will differ (CPU-only resumes of a GPU run still work).
    """
    torch.set_rng_state(rng["torch"])
    _restore_cuda_rng(list(rng.get("cuda", [])))
    py = rng["python"]
    random.setstate((int(py["version"]), tuple(int(v) for v in py["internal"].tolist()), py["gauss_next"]))
    npr = rng["numpy"]
    key = npr["key"].numpy().astype(np.uint32)
    np.random.set_state((npr["bit_generator"], key, int(npr["pos"]), int(npr["has_gauss"]),
                         float(npr["cached_gaussian"])))


def _restore_cuda_rng(states: list[torch.Tensor]) -> None:
    if not states:
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available != len(states):
        log.warning("the state holds CUDA RNG states for %d device(s), this machine has %d; "
                    "CUDA random streams will differ from the interrupted run", len(states), available)
        return
    torch.cuda.set_rng_state_all(states)


# --------------------------------------------------------------------------- sampler


class ResumableSampler(Sampler[int]):
    """A deterministic sampler whose order is a function of ``(seed, epoch)`` and that can start mid-epoch.

    Resuming must replay exactly the samples the interrupted run had not trained on yet, in the
    same order. Storing the permutation would cost a tensor per checkpoint; instead the order
    is regenerated from a generator seeded by ``(seed, epoch)`` and the state is five integers.

    ``position`` counts the indices of the current epoch already handed out; iterating yields
    the order from ``position`` on and advances it. With a ``DataLoader`` of ``num_workers=0``
    that count is exactly the number of samples trained on whenever the loop holds a batch;
    a loader with workers prefetches ahead, so pass the true count to :meth:`state_dict`.
    Call :meth:`set_epoch` before each new epoch.

    Args:
        dataset_len: number of samples.
        seed: base seed of the shuffle; the same seed gives the same order for every epoch.
        shuffle: ``False`` gives ``0 .. dataset_len-1`` every epoch (still resumable).

    Example:
        >>> s = ResumableSampler(5, seed=0); first = list(s)
        >>> t = ResumableSampler(5, seed=0); t.load_state_dict({**t.state_dict(), "position": 2})
        >>> list(t) == first[2:]
        True
    """

    def __init__(self, dataset_len: int, seed: int, shuffle: bool = True) -> None:
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        self.dataset_len, self.seed, self.shuffle = int(dataset_len), int(seed), bool(shuffle)
        self.epoch = 0
        self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first sample."""
        self.epoch, self.position = int(epoch), 0

    def order(self, epoch: int | None = None) -> torch.Tensor:
        """The whole index order of ``epoch`` (default: the current one), an int64 tensor."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return torch.arange(self.dataset_len)
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
        return torch.randperm(self.dataset_len, generator=generator)

    def __iter__(self) -> Iterator[int]:
        for index in self.order()[self.position:].tolist():
            self.position += 1
            yield index

    def __len__(self) -> int:
        """Indices left in the current epoch (all of them at an epoch's start)."""
        return self.dataset_len - self.position

    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """The sampler's state; ``consumed`` overrides ``position`` when a loader prefetches ahead."""
        position = self.position if consumed is None else int(consumed)
        if not 0 <= position <= self.dataset_len:
            raise ValueError(f"position must be in [0, {self.dataset_len}], got {position}")
        return {"dataset_len": self.dataset_len, "seed": self.seed, "shuffle": self.shuffle,
                "epoch": self.epoch, "position": position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from ``state``; refuses a state made for another dataset size, seed or shuffle."""
        saved = (int(state["dataset_len"]), int(state["seed"]), bool(state["shuffle"]))
        if saved != (self.dataset_len, self.seed, self.shuffle):
            raise StateError(f"sampler state is for (dataset_len, seed, shuffle)={saved}, this sampler is "
                             f"{(self.dataset_len, self.seed, self.shuffle)}; the data order cannot be resumed")
        position = int(state["position"])
        if not 0 <= position <= self.dataset_len:
            raise StateError(f"sampler position {position} is outside [0, {self.dataset_len}]")
        self.epoch, self.position = int(state["epoch"]), position


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed for ``(seed, epoch)``; hashing keeps distinct pairs from colliding."""
    digest = hashlib.sha256(f"edgetrain-sampler:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# --------------------------------------------------------------------------- state


@dataclass
class TrainingState:
    """Everything that decides the rest of a training run, as saved between two steps.

    The state is a snapshot of one point of the loop, and resuming re-enters the loop at that
    point: ``step`` optimizer steps are done, the next batch comes from ``epoch`` at the
    sampler's ``position``. ``model``/``optimizer``/``lr_scheduler`` are ``state_dict()``s;
    :meth:`capture` takes them by reference (no copy, edge RAM is scarce), so save a captured
    state before the next step changes the tensors.

    Attributes:
        step: optimizer steps completed in the whole run.
        epoch: epoch the next batch belongs to.
        model: ``model.state_dict()``.
        optimizer: ``optimizer.state_dict()`` or ``None``.
        schedule: the checkpointing schedule in use, saved as ``Schedule.to_dict()``.
        rng: a :func:`capture_rng` snapshot (empty: not captured).
        sampler: a :meth:`ResumableSampler.state_dict` or ``None``.
        lr_scheduler: ``lr_scheduler.state_dict()`` or ``None``.
        metadata: free-form plain data (config, best accuracy, ...).
        torch_version: the torch that wrote the state; RNG streams and ``randperm`` are only
            guaranteed to repeat under the same version.
    """

    step: int
    epoch: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None = None
    schedule: Schedule | None = None
    rng: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, int] | None = None
    lr_scheduler: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    torch_version: str = str(torch.__version__)

    @classmethod
    def capture(cls, *, step: int, epoch: int, model: nn.Module, optimizer: TrainingOptimizer | None = None,
                schedule: Schedule | None = None, sampler: ResumableSampler | Mapping[str, int] | None = None,
                lr_scheduler: Any = None, metadata: Mapping[str, Any] | None = None,
                rng: bool = True) -> TrainingState:
        """Collect the state of a live run; ``sampler`` may be a sampler or its ``state_dict(consumed=...)``.

        Example:
            >>> state = TrainingState.capture(step=10, epoch=0, model=model, optimizer=opt, sampler=sampler)
            >>> store.save(state)
        """
        sampler_state = sampler.state_dict() if isinstance(sampler, ResumableSampler) else sampler
        return cls(step=int(step), epoch=int(epoch), model=model.state_dict(),
                   optimizer=optimizer.state_dict() if optimizer is not None else None,
                   schedule=schedule, rng=capture_rng() if rng else {},
                   sampler=dict(sampler_state) if sampler_state is not None else None,
                   lr_scheduler=lr_scheduler.state_dict() if lr_scheduler is not None else None,
                   metadata=dict(metadata or {}))

    def restore(self, model: nn.Module, optimizer: TrainingOptimizer | None = None, *,
                sampler: ResumableSampler | None = None, lr_scheduler: Any = None, rng: bool = True) -> None:
        """Load the state into a freshly built run; each object passed must have its part saved.

        Restore the RNG last thing before training continues (this method does it last), and
        after anything that draws random numbers at start-up, such as building the model.
        """
        model.load_state_dict(self.model)
        if optimizer is not None:
            optimizer.load_state_dict(self._require("optimizer", self.optimizer))
        if sampler is not None:
            sampler.load_state_dict(self._require("sampler", self.sampler))
        if lr_scheduler is not None:
            lr_scheduler.load_state_dict(self._require("lr_scheduler", self.lr_scheduler))
        if rng:
            if self.torch_version != torch.__version__:
                log.warning("state written by torch %s, running torch %s: random streams and the data order "
                            "may differ from the interrupted run", self.torch_version, torch.__version__)
            restore_rng(self._require("rng", self.rng or None))

    def _require(self, part: str, value: Any) -> Any:
        if value is None:
            raise StateError(f"the training state of step {self.step} has no {part} to restore")
        return value

    def to_payload(self) -> dict[str, Any]:
        """The state as plain data for ``torch.save`` (and ``weights_only`` loading)."""
        return {"kind": _PAYLOAD_KIND, "version": STATE_FORMAT_VERSION, "step": self.step, "epoch": self.epoch,
                "model": self.model, "optimizer": self.optimizer,
                "schedule": self.schedule.to_dict() if self.schedule is not None else None,
                "rng": self.rng, "sampler": self.sampler, "lr_scheduler": self.lr_scheduler,
                "metadata": self.metadata, "torch_version": self.torch_version}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> TrainingState:
        """Inverse of :meth:`to_payload`; raises :class:`StateError` on a foreign or newer payload."""
        if payload.get("kind") != _PAYLOAD_KIND:
            raise StateError(f"not an edgetrain training state (kind={payload.get('kind')!r})")
        if payload.get("version") != STATE_FORMAT_VERSION:
            raise StateError(f"training state version {payload.get('version')!r}; "
                             f"this edgetrain reads {STATE_FORMAT_VERSION}")
        schedule = payload["schedule"]
        return cls(step=int(payload["step"]), epoch=int(payload["epoch"]), model=payload["model"],
                   optimizer=payload["optimizer"],
                   schedule=Schedule.from_dict(schedule) if schedule is not None else None,
                   rng=payload["rng"], sampler=payload["sampler"], lr_scheduler=payload["lr_scheduler"],
                   metadata=payload["metadata"], torch_version=str(payload["torch_version"]))


# --------------------------------------------------------------------------- safe payload

_PLAIN_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.Size, torch.dtype, torch.device)
_MAPPINGS = (dict, OrderedDict)
_SEQUENCES = (list, tuple, set)


def _check_loadable(obj: Any, where: str) -> None:
    """Raise :class:`StateError` at the first value ``torch.load(weights_only=True)`` would refuse.

    Types are matched exactly: ``numpy.float64`` is a ``float`` subclass but pickles as a
    NumPy global, which safe loading rejects.
    """
    kind = type(obj)
    if kind in (torch.Tensor, nn.Parameter) or kind in _PLAIN_LEAVES:
        return
    if kind in _MAPPINGS:
        for key, value in obj.items():
            _check_loadable(key, f"{where} key {key!r}")
            _check_loadable(value, f"{where}[{key!r}]")
        return
    if kind in _SEQUENCES:
        for i, value in enumerate(obj):
            _check_loadable(value, f"{where}[{i}]")
        return
    raise StateError(f"{where} is a {kind.__module__}.{kind.__qualname__}, which torch.load(weights_only=True) "
                     "refuses; store plain data instead (float(x), x.tolist(), a dict)")


# --------------------------------------------------------------------------- file I/O


class _HashingWriter:
    """Counts and hashes the bytes ``torch.save`` streams to a file, so no in-memory copy is needed."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.sha256, self.length = file, hashlib.sha256(), 0
        self.error: OSError | None = None  # torch.save reports a failed write as a bare RuntimeError

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.length += view.nbytes
        try:
            return self.file.write(view)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()


class _PayloadView(io.RawIOBase):
    """A read-only, seekable window ``[offset, offset + length)`` of an open file, for ``torch.load``."""

    def __init__(self, file: io.BufferedIOBase, offset: int, length: int) -> None:
        super().__init__()
        self.file, self.offset, self.length, self.pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        want = max(0, min(len(buffer), self.length - self.pos))
        self.file.seek(self.offset + self.pos)
        got = self.file.readinto(memoryview(buffer)[:want]) or 0
        self.pos += got
        return got


def save_state(state: TrainingState, path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically and durably (see NOTE [ Durable write protocol ]).

    Raises:
        StateError: the state holds something safe loading would refuse, or the write failed (a
            full or failing disk): nothing of it remains and an earlier file at ``path`` is intact.
    """
    path = Path(path)
    payload = state.to_payload()
    _check_loadable(payload, "state")
    writer: _HashingWriter | None = None
    try:
        with atomic_file(path) as file:
            file.write(bytes(_HEADER_BYTES))
            writer = _HashingWriter(file)
            torch.save(payload, writer)  # type: ignore[arg-type]  # any object with write(); the stub says IO
            file.seek(0)
            file.write(_HEADER.pack(_MAGIC, STATE_FORMAT_VERSION, writer.length, writer.sha256.digest()))
    except (OSError, RuntimeError) as exc:
        cause = writer.error if writer is not None and writer.error is not None else exc
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause).splitlines()[0]
        raise StateError(f"cannot save the training state to {path}: {reason}; "
                         "the states saved before are intact") from exc
    return path


def load_state(path: str | Path) -> TrainingState:
    """Read and verify one state file (size and SHA-256) and load it with ``weights_only=True`` on CPU.

    Raises:
        CorruptStateError: the file is truncated, altered, or its payload does not load.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            length = _verify(file, path)
            try:
                payload = torch.load(_PayloadView(file, _HEADER_BYTES, length),  # type: ignore[arg-type]  # a RawIOBase
                                     map_location="cpu", weights_only=True)
                return TrainingState.from_payload(payload)
            except Exception as exc:  # a verified payload that still fails: wrong kind, version, or content
                raise CorruptStateError(path, f"payload does not load: {exc}") from exc
    except OSError as exc:  # an SD card read error is as fatal to this file as corruption
        raise CorruptStateError(path, f"unreadable: {exc}") from exc


def _verify(file: IO[bytes], path: Path) -> int:
    """Check header, size and checksum of an open state file; return the payload length."""
    header = file.read(_HEADER_BYTES)
    if len(header) < _HEADER_BYTES:
        raise CorruptStateError(path, f"truncated header ({len(header)} of {_HEADER_BYTES} bytes)")
    magic, version, length, digest = _HEADER.unpack(header)
    if magic != _MAGIC:
        raise CorruptStateError(path, "not an edgetrain state file (bad magic)")
    if version != STATE_FORMAT_VERSION:
        raise CorruptStateError(path, f"state file format {version}; this edgetrain reads {STATE_FORMAT_VERSION}")
    size = os.fstat(file.fileno()).st_size - _HEADER_BYTES
    if size != length:
        raise CorruptStateError(path, f"payload is {size} bytes, header says {length} (truncated or extended)")
    sha256 = hashlib.sha256()
    while chunk := file.read(_READ_CHUNK_BYTES):
        sha256.update(chunk)
    if sha256.digest() != digest:
        raise CorruptStateError(path, "SHA-256 checksum mismatch")
    return int(length)


# --------------------------------------------------------------------------- store


class StateStore:
    """The training states of one run directory: durable saves, the newest intact one on load.

    Files are ``state-<step:09d>.pt`` (sorted by step). The caller saves every N steps and at
    epoch ends; a later save of the same step replaces the file atomically. One process
    writes a run directory at a time.

    Args:
        run_dir: directory of the run; created if missing.
        keep_last: states kept after each save (older ones are deleted once the new one is durable).

    Example:
        >>> store = StateStore("runs/a", keep_last=3)
        >>> state = store.load_latest()          # None on a fresh run
        >>> store.save(TrainingState.capture(step=1, epoch=0, model=model))
    """

    def __init__(self, run_dir: str | Path, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.run_dir, self.keep_last = Path(run_dir), int(keep_last)
        if not self.run_dir.is_dir():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.run_dir.parent)

    def path_for(self, step: int) -> Path:
        """Where the state of ``step`` is stored."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.run_dir / f"state-{step:09d}.pt"

    def paths(self) -> list[Path]:
        """State files present, oldest step first (valid or not; temp files excluded)."""
        found = [(int(m.group(1)), p) for p in self.run_dir.iterdir() if (m := _STATE_NAME.fullmatch(p.name))]
        return [p for _, p in sorted(found)]

    def save(self, state: TrainingState) -> Path:
        """Write ``state`` durably as the state of ``state.step``, then prune; returns its path.

        States of later steps than ``state.step`` belong to a timeline the run abandoned (it
        resumed from an earlier state, e.g. past a corrupt one), so they are deleted too.
        """
        self.remove_temp_files()
        path = save_state(state, self.path_for(state.step))
        self._prune(state.step)
        return path

    def load_latest(self) -> TrainingState | None:
        """The newest state that verifies, falling back past corrupt ones with a warning.

        Returns:
            the state, or ``None`` when the directory holds no state files at all.

        Raises:
            StateError: state files exist but none is intact.
        """
        self.remove_temp_files()
        failures: list[CorruptStateError] = []
        for path in reversed(self.paths()):
            try:
                state = load_state(path)
            except CorruptStateError as exc:
                log.warning("skipping corrupt training state %s: %s", path, exc.reason)
                failures.append(exc)
                continue
            if failures:
                log.warning("resuming from %s, the newest intact state", path)
            return state
        if failures:
            raise StateError(f"no intact training state in {self.run_dir}: "
                             + "; ".join(f"{f.path.name}: {f.reason}" for f in failures))
        return None

    def remove_temp_files(self) -> list[Path]:
        """Delete temp files left by a write that a crash interrupted; returns what was removed."""
        removed = []
        for path in self.run_dir.iterdir():
            if _TEMP_NAME.fullmatch(path.name):
                log.info("removing %s, left by an interrupted save", path)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(path)
        return removed

    def _prune(self, saved_step: int) -> None:
        steps = [(int(_STATE_NAME.fullmatch(p.name).group(1)), p) for p in self.paths()]  # type: ignore[union-attr]
        newer = [p for step, p in steps if step > saved_step]
        older = [p for step, p in steps if step <= saved_step]
        for path in newer:
            log.warning("deleting %s: a later step than the state just saved (an abandoned run)", path)
        for path in newer + older[:-self.keep_last]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
