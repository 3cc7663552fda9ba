"""The inference path's per-frame latency beside a training student, against the same with the student paused.

The service reports it per chunk (``inference_p95_ratio``, NOTE [ The in-situ service ]); ``insitu simulate``'s
probe and ``python -m benchmarks run insitu_latency`` measure it over whole clips with :func:`latency_beside_student`.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from pathlib import Path

import numpy as np
from torch import nn

from .camera import clip
from .inference import ALIGNMENT_CHUNKS, Serving, infer_chunk
from .service_config import ServiceConfig
from .student import FRAMES, STATUS, TEACHER
from .supervisor import process_cpu_s, start_student, stopped, student_failed
from .teacher import Teacher, save_teacher
from .world import Video

__all__ = ["latency_beside_student", "p95_s", "p95_ratio", "PROBE_FRAME_RATE_HZ"]

PROBE_FRAME_RATE_HZ = 20.0  # latency probes pace frames: the student trains between them (NOTE [ Yielding per frame ])


def p95_s(latencies_s: list[float]) -> float | None:
    """The 95th percentile of ``latencies_s``; None for none."""
    return float(np.percentile(latencies_s, 95)) if latencies_s else None


def p95_ratio(baseline_s: list[float], beside_s: list[float]) -> float | None:
    """The p95 of ``beside_s`` over that of ``baseline_s``; None where either is empty or the baseline's is 0."""
    base, beside = p95_s(baseline_s), p95_s(beside_s)
    return None if base is None or beside is None or base == 0 else beside / base


def latency_beside_student(videos: list[Video], teacher: Teacher, serving_model: nn.Sequential, frames_dir: Path,
                           work: Path, config: ServiceConfig, wait_s: float = 120.0) -> dict[str, float | bool | None]:
    """The inference path's per-frame latency over ``videos`` alone and beside a training student process.

    A student process (as the service starts it, on ``config``'s share of memory) trains from the
    store ``frames_dir`` throughout; chunks of ``config.chunk_frames`` alternate between the student
    paused and running, so both halves see the same machine under the same outside load.

    The measurement starts once the student is planned and training, or after ``wait_s`` if it
    is not by then (a SCHED_IDLE process on a machine kept busy by others may get no CPU even to
    import PyTorch): ``student_training`` says which.

    Returns:
        ``inference_p95_alone_s``, ``inference_p95_beside_student_s``, ``inference_p95_ratio``,
        ``student_training`` and ``student_cpu_share`` (the student's CPU seconds per second while
        it ran: near 0 means the machine gave it nothing, and the ratio says little).
    """
    work.mkdir(parents=True, exist_ok=True)
    save_teacher(teacher, work / TEACHER)
    (work / FRAMES).symlink_to(frames_dir.resolve())
    serving = Serving(serving_model)
    chunks = [clip(v, a, a + config.chunk_frames) for v in videos
              for a in range(0, len(v.frames), config.chunk_frames)]
    student = start_student(work, config, int(config.memory_bytes * config.student_share), quiet=True)
    alone_s: list[float] = []
    beside_s: list[float] = []
    cpu_s = wall_s = 0.0
    try:
        training = _wait_for_training(student, work / STATUS, wait_s)
        for k, video in enumerate(chunks):
            paused = k % 2 == 0
            cpu0_s, wall0_s = process_cpu_s(student), time.perf_counter()
            with stopped(student if paused else None):
                _, latencies_s, _ = infer_chunk(video, k, teacher, serving, config, deque(maxlen=ALIGNMENT_CHUNKS),
                                                None if paused else student)
            if not paused:
                cpu_s += process_cpu_s(student) - cpu0_s
                wall_s += time.perf_counter() - wall0_s
            (alone_s if paused else beside_s).extend(latencies_s)
    finally:
        student.terminate()
        student.wait()
    return {"inference_p95_alone_s": p95_s(alone_s), "inference_p95_beside_student_s": p95_s(beside_s),
            "inference_p95_ratio": p95_ratio(alone_s, beside_s), "student_training": training,
            "student_cpu_share": cpu_s / wall_s if wall_s else None}


def _wait_for_training(student: subprocess.Popen[bytes], status: Path, timeout_s: float) -> bool:
    """Until the student's first status line (it is planned and training): True, or False after ``timeout_s``.

    Raises:
        EdgetrainError: the student exited first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if status.exists() and '"student_start"' in status.read_text():
            return True
        if student.poll() is not None:
            raise student_failed(student, status.parent)
        time.sleep(0.2)
    return False
