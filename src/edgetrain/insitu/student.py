"""The student: trained from the frame store in its own low-priority process, resumable, promoted when it wins.

NOTE [ The student process ]
``edgetrain insitu run`` starts this module as a child (``python -m edgetrain.insitu.background
CONFIG.json``). It keeps out of the inference path's way and inside its share of the node's
memory:

* **priority**: ``SCHED_IDLE`` (the kernel runs it only on a CPU nothing else wants) where the
  kernel allows, else ``nice 19``; one torch thread.
* **memory**: the process budget ``process_bytes`` (the service's ``--memory`` less the inference
  process's share) is split as ``edgetrain train --memory`` splits it (NOTE [ Process budget ]):
  the runtime baseline measured after one warm-up step, an allowance for the decoded store
  (:data:`DECODED_PER_QUOTA_BYTE` times the store's quota), a cushion, and the step's tensors,
  which edgetrain's planner and executor (:class:`~edgetrain.runtime.Checkpointed`) keep within
  what is left. The glibc mmap threshold is pinned as under ``train --memory``.
* **crash safety**: the model, Adam's state, the step and the promoted accuracy are saved through
  :class:`~edgetrain.train.state.StateStore` (atomic, checksummed) after every round; a student
  restarted after a kill -9 continues from the newest intact state. Batches are drawn from a
  generator seeded by ``(seed, step)``, so no sampler state is needed. An exclusive ``flock``
  on ``student.lock`` keeps two students off one state directory.
* **evaluation and promotion**: the frames of one track in :data:`HELD_OUT_EVERY` (chosen by a
  hash of the track id) are held out (whole tracks, so a held-out crop has no near-twin in
  training); their labels
  are the teacher's propagated track labels (teacher-consistent: no ground truth on a node).
  After each round the student and the teacher are scored on them; the student is promoted when
  it beats the teacher by ``margin`` and its last promoted self: ``model.pt`` is replaced
  atomically and the inference path reloads it.
* **lifetime**: it exits after ``steps`` optimizer steps in all; the kernel kills it when its
  parent (the service) dies (``PR_SET_PDEATHSIG``), and it checks its parent between steps where
  that is not available.

Status lines (JSON) go to stdout and to ``status.jsonl``, as the service's do.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import io
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import EdgetrainError, InfeasibleBudgetError
from ..sysutil.fileio import to_json, write_atomic
from .model import augment, predict, to_tensor
from .store import StoredFrame, decode_png, listed_frames
from .teacher import load_teacher

__all__ = ["StudentConfig", "run_student", "emit", "load_promoted", "held_out", "stored_split", "HELD_OUT_EVERY",
           "DECODED_PER_QUOTA_BYTE", "write_config", "STATUS", "PROMOTED", "TEACHER", "FRAMES", "STATES"]

HELD_OUT_EVERY = 5  # a fifth of the camera's stored tracks
# A decoded 32 px crop is 3072 bytes; its PNG at least ~1 KB plus the 128 B the quota charges its
# manifest entry: the store decodes to under 3x its quota.
DECODED_PER_QUOTA_BYTE = 3
STATUS = "status.jsonl"
PROMOTED = "model.pt"
TEACHER = "teacher.pt"
FRAMES = "frames"
STATES = "student"
MIN_HELD_OUT = 20  # held-out frames needed before a promotion is considered


@dataclass(frozen=True)
class StudentConfig:
    store_dir: str
    process_bytes: int  # this process's budget (NOTE [ Process budget ])
    quota_bytes: int  # the frame store's quota (for the decoded-store allowance)
    steps: int = 400  # optimizer steps in all (across restarts)
    round_steps: int = 25  # steps between evaluations and saved states
    batch: int = 64
    lr: float = 1e-3
    margin: float = 0.02  # the student must beat the teacher on the held-out slice by this much
    seed: int = 0
    parent_pid: int = 0  # exit when this process is gone (0: do not watch)


def emit(store_dir: Path, record: dict[str, Any]) -> None:
    """One status line, stamped with the wall-clock ``time`` (Unix seconds), to stdout and to ``status.jsonl``.

    One append write per line, so the lines of the two processes do not mix.
    """
    line = to_json({**record, "time": round(time.time(), 3)}) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    fd = os.open(store_dir / STATUS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def load_promoted(path: Path) -> tuple[dict[str, torch.Tensor], int, float]:
    """The promoted student's weights, the step it was promoted at and its held-out accuracy."""
    payload = torch.load(path, weights_only=True)
    return payload["model"], int(payload["step"]), float(payload["accuracy"])


class _Frames:
    """The store's listed frames, decoded once each; frames evicted since are dropped."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._decoded: dict[str, tuple[np.ndarray, StoredFrame]] = {}

    def refresh(self) -> None:
        listed = {f.name: f for f in listed_frames(self.root)}
        self._decoded = {name: v for name, v in self._decoded.items() if name in listed}
        for name, frame in listed.items():
            if name not in self._decoded:
                with contextlib.suppress(FileNotFoundError):  # evicted since the manifest was read
                    self._decoded[name] = (decode_png(self.root / name), frame)

    def split(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """(train crops, labels), (held-out crops, labels)."""
        parts: dict[bool, tuple[list[np.ndarray], list[int]]] = {True: ([], []), False: ([], [])}
        for crop, frame in self._decoded.values():
            held = held_out(frame.track)
            parts[held][0].append(crop)
            parts[held][1].append(frame.label)

        def arrays(part: tuple[list[np.ndarray], list[int]]) -> tuple[np.ndarray, np.ndarray]:
            if not part[0]:
                return np.zeros((0, 32, 32, 3), dtype=np.uint8), np.zeros(0, dtype=np.int64)
            return np.stack(part[0]), np.array(part[1], dtype=np.int64)

        return arrays(parts[False]), arrays(parts[True])


def stored_split(frames_dir: Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The store's listed frames split as the student splits them: (train crops, labels), (held-out crops, labels)."""
    frames = _Frames(frames_dir)
    frames.refresh()
    return frames.split()


def held_out(track: int) -> bool:
    """Whether a track's frames are held out for evaluation (one track in :data:`HELD_OUT_EVERY`, by CRC-32)."""
    return zlib.crc32(track.to_bytes(8, "little")) % HELD_OUT_EVERY == 0


def _batches(x: np.ndarray, y: np.ndarray, config: StudentConfig, step: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """One batch per step from ``step`` on, drawn by a generator seeded by (seed, step): resumable as it is."""
    while True:
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        idx = torch.randint(len(x), (config.batch,), generator=gen)
        yield augment(to_tensor(x[idx.numpy()]), gen), torch.from_numpy(y[idx.numpy()])
        step += 1


def run_student(config: StudentConfig, priority: str) -> int:
    """Train until ``config.steps``; returns the process's exit status (0 done, 3 parent gone)."""
    from ..profiling.process import configure_allocator, read_process_memory
    from ..runtime import Checkpointed
    from ..train.budget import measure_runtime_baseline, split_process_budget
    from ..train.state import StateStore, TrainingState

    root = Path(config.store_dir)
    torch.set_num_threads(1)
    configure_allocator()
    lock = open(root / "student.lock", "w")  # noqa: SIM115 - held for the process's life
    fcntl.flock(lock, fcntl.LOCK_EX)  # a student killed with its service may still be exiting
    teacher = load_teacher(root / TEACHER)
    model = copy.deepcopy(teacher.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    states = StateStore(root / STATES, keep_last=2)
    saved = states.load_latest()
    step, promoted_accuracy = 0, 0.0
    if saved is not None:
        saved.restore(model, optimizer, rng=False)
        step, promoted_accuracy = saved.step, float(saved.metadata["promoted_accuracy"])
    # The budget: measure what this process holds once a step has run (thread pools, kernels up).
    replay_x, replay_y = teacher.replay_crops, teacher.replay_labels.astype(np.int64)
    sample_x, sample_y = to_tensor(replay_x[: config.batch]), torch.from_numpy(replay_y[: config.batch])
    nn.functional.cross_entropy(model(sample_x), sample_y).backward()
    optimizer.zero_grad(set_to_none=True)
    data_bytes = DECODED_PER_QUOTA_BYTE * config.quota_bytes
    baseline_bytes = measure_runtime_baseline(model, sample_x, sample_y)
    budget = split_process_budget(config.process_bytes, baseline_bytes + data_bytes)  # the store is its data
    try:
        net = Checkpointed(model, sample=sample_x, memory=max(budget.tensor_bytes, 1), optimizer="adam",
                           target=sample_y)
    except InfeasibleBudgetError as exc:  # in process terms, as `train --memory` refuses
        if exc.minimum_bytes is None:
            raise
        raise budget.infeasible(exc.minimum_bytes) from None
    emit(root, {"event": "student_start", "pid": os.getpid(), "priority": priority, "threads": 1,
                "resumed_step": step, "process_bytes": config.process_bytes, "decoded_store_bytes": data_bytes,
                "runtime_baseline_bytes": baseline_bytes, "tensor_budget_bytes": budget.tensor_bytes,
                "planned_step_peak_bytes": net.plan.predicted_peak_bytes})
    frames = _Frames(root / FRAMES)
    while step < config.steps:
        if config.parent_pid and os.getppid() != config.parent_pid:
            return 3
        frames.refresh()
        (train_x, train_y), (held_x, held_y) = frames.split()
        x, y = np.concatenate([train_x, replay_x]), np.concatenate([train_y, replay_y])
        net.train()
        batches = _batches(x, y, config, step)
        for _ in range(min(config.round_steps, config.steps - step)):
            xb, yb = next(batches)
            loss = nn.functional.cross_entropy(net(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if config.parent_pid and os.getppid() != config.parent_pid:
                return 3
        record = _evaluate(model, teacher.model, held_x, held_y)
        promote = (record["held_out_frames"] >= MIN_HELD_OUT
                   and record["student_accuracy"] >= record["teacher_accuracy"] + config.margin
                   and record["student_accuracy"] > promoted_accuracy)
        if promote:
            promoted_accuracy = record["student_accuracy"]
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "step": step, "accuracy": promoted_accuracy}, buffer)
            write_atomic(root / PROMOTED, buffer.getvalue())
        states.save(TrainingState.capture(step=step, epoch=0, model=model, optimizer=optimizer, rng=False,
                                          metadata={"promoted_accuracy": promoted_accuracy}))
        memory = read_process_memory()
        emit(root, {"event": "student", "step": step, "train_frames": len(train_x), "replay_frames": len(replay_x),
                    **record, "promoted": promote, "promoted_accuracy": promoted_accuracy,
                    "rss_bytes": memory.rss_bytes, "peak_rss_bytes": memory.peak_rss_bytes,
                    "process_bytes": config.process_bytes})
    return 0


def _evaluate(student: nn.Sequential, teacher: nn.Sequential, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Student's and teacher's accuracy on the held-out stored frames, against their teacher-consistent labels."""
    if len(x) == 0:
        return {"held_out_frames": 0, "student_accuracy": 0.0, "teacher_accuracy": 0.0}
    return {"held_out_frames": len(x), "student_accuracy": float((predict(student, x).labels == y).mean()),
            "teacher_accuracy": float((predict(teacher, x).labels == y).mean())}


def main(argv: list[str], priority: str = "unchanged") -> int:
    """Run the student of ``CONFIG.json`` (``argv[0]``); a refusal (a budget too small, no intact state) is one
    status line (``student_error``, with this process's pid: the service reports it) and exit status 2.

    Started through :mod:`edgetrain.insitu.background`, which lowers the priority first.
    """
    config = StudentConfig(**json.loads(Path(argv[0]).read_text()))
    try:
        return run_student(config, priority)
    except EdgetrainError as exc:
        emit(Path(config.store_dir), {"event": "student_error", "pid": os.getpid(), "error": str(exc)})
        return 2


def write_config(config: StudentConfig, path: Path) -> Path:
    """The child's configuration file (read by :func:`main`)."""
    return write_atomic(path, to_json(asdict(config)))

