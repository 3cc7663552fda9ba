"""``edgetrain insitu run``: the node's service, resumable; the student trains beside it in its own process.

Its parts have modules of their own: the camera's chunks (:mod:`.camera`), the inference path (:mod:`.inference`),
the student process as the service handles it (:mod:`.supervisor`), the latency against a paused student
(:mod:`.latency`) and the options (:mod:`.service_config`).

NOTE [ The in-situ service ]
The store directory is the service's whole state; a rerun with the same arguments continues:

* ``teacher.pt``: the teacher, its gate calibration and replay crops (:mod:`.teacher`), trained
  on the generator's eye-level world on the first run (outside the memory budget: a node ships
  with it);
* ``frames/``: the frame store (NOTE [ Frame store on an SD card ]); its manifest's ``cursor``
  is how far into the camera stream the stored batches reach, so a rerun starts there;
* ``student/``: the student's training states, ``model.pt``: the promoted student
  (NOTE [ The student process ]);
* ``status.jsonl``: every status line of both processes.

The inference path runs in this process, one *chunk* of frames at a time (``chunk_frames``, 40 s
at 5 frames/s): per frame, the detector's boxes are cropped and classified by the serving model
(the promoted student, or the teacher) and by the teacher (whose outputs the gate reads); at the
chunk's end the tracker links the chunk's detections, the labelling rule labels them,
and the labelled crops are stored with the new cursor in one atomic manifest write. Tracks do
not cross chunks (a track cut at a chunk boundary is two tracks).

Latency: the per-frame time (crop + both classifications; the labelling rule runs once at the
chunk's end) is measured on every frame with a detection. The first chunk of every run is
processed before the student starts, and every ``probe_every``-th chunk with the student paused
(SIGSTOP ... SIGCONT): those frames give the baseline p95, measured on the same machine under
the same outside load as the rest, which run beside the training student;
``inference_p95_ratio`` is their p95 over the baseline.

NOTE [ An unattended node's service ]
A node restarts ``insitu run`` with the same command line after every reboot or crash, and nobody reads its
logs, so the service keeps ``train``'s contract (NOTE [ Run directory protocol ]):

* **refusal before work**: the options (a quota that holds a crop), the memory (below), the camera (a folder's
  frames, a video file's first frame), the store's manifest and listed files and a shipped ``teacher.pt`` are
  checked before anything is written, rendered or trained. A refusal is one line and exit 2, and the store
  directory stays as it was, or absent. The memory check is a floor: each process holds at least what this one
  holds then (Python, PyTorch and the pipeline's modules), and the student, besides, the decoded store and the
  cushion; the student measures its own runtime and plans its least step once it is up, and a budget still too
  small is then its refusal.
* **one writer**: the store is locked as a run directory is (``.lock``, ``flock``, the holder's pid), before
  the first write. The student inherits the lock's file descriptor, so the store stays locked until both
  processes are gone; a service started while a killed one's student still holds it waits for that student to
  exit (up to ``STUDENT_EXIT_WAIT_S``) instead of being refused.
* **the same command continues**: from the manifest's cursor, wherever it is. A cursor inside a chunk (a
  stream cut by ``--frames``, a video file that ended or was cut short) continues with the rest of that
  chunk, then whole ones, so chunk k is always frames ``k * chunk_frames`` on (its rest numbers its tracks on
  from its stored ones). Done work is not redone: with the cursor at ``--frames`` or at the end of the file
  and the student's last saved step at ``--student-steps``, a rerun stores nothing and starts no student.
* **a failing student is reported with its cause**: its ``student_error`` status line, the signal that
  killed it, or the last line of its stderr (``student.log``), on the service's stderr in one line.
* **no orphan**: the student dies with the service (NOTE [ Children die with their parent ]); it is started
  from the main thread, and decoding a video file runs in this process (PyAV), not in a child.

Memory (NOTE [ Process budget ] for the whole service): ``--memory`` is split between the two
processes, ``student_share`` of it the student's process budget (planned as in ``train
--memory``), the rest the inference process's, which is not planned (it holds one chunk of
frames, two small models and the tracker) but measured: its peak RSS, read from the kernel
after the teacher is ready, is reported against its share.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import subprocess
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InfeasibleBudgetError
from ..profiling.process import read_process_memory, reset_peak
from ..train.budget import CUSHION_BYTES
from ..train.state import StateStore
from ..units import format_bytes
from .camera import camera_chunks, check_camera
from .inference import ALIGNMENT_CHUNKS, TRACKS_PER_CHUNK, Serving, infer_chunk
from .latency import p95_ratio, p95_s
from .motion import DETECTORS
from .service_config import ServiceConfig
from .store import FrameStore, check_quota, check_store
from .student import DECODED_PER_QUOTA_BYTE, FRAMES, PROMOTED, STATES, STATUS, TEACHER, emit
from .supervisor import StoreLock, process_cpu_s, start_student, stopped, student_failed
from .teacher import Teacher, load_teacher, save_teacher, train_teacher
from .video import stated_frames

__all__ = ["run_service"]

log = logging.getLogger(__name__)


def _teacher(root: Path, config: ServiceConfig, say: Callable[[str], None]) -> Teacher:
    path = root / TEACHER
    if not path.exists():
        teacher, _ = train_teacher(config.teacher, say)
        save_teacher(teacher, path)
    return load_teacher(path)


def run_service(root: Path, config: ServiceConfig, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or continue) the service in ``root`` until ``config.frames`` and the student's steps are done.

    Everything is checked before any work, and ``root`` is locked for the run (NOTE [ An unattended node's
    service ]).

    Returns:
        the last status record (``event: "done"``).

    Raises:
        EdgetrainError: a refusal (``root`` as it was), another process holds ``root`` (``RunLockedError``), or the
            student failed (its cause in the message).
    """
    _check_options(config)
    _check_memory(config)
    check_camera(config.camera, truth=config.detector == "standin", preset=config.node_camera)
    check_store(root / FRAMES)
    shipped = load_teacher(root / TEACHER) if (root / TEACHER).exists() else None
    with StoreLock(root) as lock:
        lock.claim()
        return _serve(root, config, say or (lambda message: log.info(message)), lock, shipped)


def _check_options(config: ServiceConfig) -> None:
    if config.detector not in DETECTORS:
        raise ValueError(f"detector must be one of {', '.join(DETECTORS)}, got {config.detector!r}")
    if config.probe_every < 2:
        raise ValueError(f"probe_every must be >= 2 (every chunk paused would never train), got {config.probe_every}")
    if not 0.0 < config.student_share < 1.0:
        raise ValueError(f"the student's share of --memory must be in (0, 1), got {config.student_share}")
    check_quota(config.quota_bytes)


def _split_memory(memory_bytes: int, student_share: float) -> tuple[int, int]:
    """(the student process's budget, the inference process's share) of ``memory_bytes``."""
    student_bytes = int(memory_bytes * student_share)
    return student_bytes, memory_bytes - student_bytes


def _check_memory(config: ServiceConfig) -> None:
    """Refuse a memory the two processes cannot start in, before any work (NOTE [ An unattended node's service ]).

    Each process holds at least what this one holds now, Python, PyTorch and the pipeline's modules; the
    student, besides, the decoded store and the cushion (NOTE [ The student process ]). The student measures
    its own runtime and plans its least step once it is up, and refuses a budget still too small then.

    Raises:
        InfeasibleBudgetError: with the least ``--memory`` these parts need.
    """
    runtime = read_process_memory().rss_bytes
    student_least = runtime + DECODED_PER_QUOTA_BYTE * config.quota_bytes + CUSHION_BYTES

    def fits(memory_bytes: int) -> bool:
        student_bytes, inference_bytes = _split_memory(memory_bytes, config.student_share)
        return student_bytes >= student_least and inference_bytes >= runtime

    if fits(config.memory_bytes):
        return
    least = max(math.ceil(student_least / config.student_share), math.ceil(runtime / (1 - config.student_share)))
    while not fits(least):  # the float division, and int() of the student's share, are off by a few bytes
        least += 1
    while fits(least - 1):
        least -= 1
    raise InfeasibleBudgetError(
        f"--memory {format_bytes(config.memory_bytes)} ({config.memory_bytes} bytes) is below what the service "
        f"needs before its first step, at least {format_bytes(least)} ({least} bytes): each process holds "
        f"{format_bytes(runtime)} of Python and PyTorch (as this one does now), and the student (--student-share "
        f"{config.student_share:g} of it) the decoded store ({DECODED_PER_QUOTA_BYTE} x --quota) and a "
        f"{format_bytes(CUSHION_BYTES)} cushion besides; give --memory {math.ceil(least / 2**20)}MiB or more",
        minimum_bytes=least, budget_bytes=config.memory_bytes)


def _serve(root: Path, config: ServiceConfig, say: Callable[[str], None], lock: StoreLock,
           shipped: Teacher | None) -> dict[str, Any]:
    """:func:`run_service` once its checks passed and ``lock`` holds ``root``."""
    torch.set_num_threads(1)
    teacher = shipped or _teacher(root, config, say)
    store = FrameStore(root / FRAMES, config.quota_bytes)
    serving = Serving(copy.deepcopy(teacher.model))
    serving.reload_if_promoted(root / PROMOTED)
    student_bytes, inference_bytes = _split_memory(config.memory_bytes, config.student_share)
    trains = _saved_student_step(root) < config.student_steps  # a rerun with the steps done starts none
    reset_peak()  # the service's budget starts here: the teacher's one-off training is not the node's
    emit(root, {"event": "start", "camera": config.camera, "resumed_frames": store.cursor,
                "stored_frames": len(store.frames), "memory_bytes": config.memory_bytes,
                "inference_bytes": inference_bytes, "student_bytes": student_bytes, "serving": serving.name})
    student: subprocess.Popen[bytes] | None = None
    started = False
    baseline_s: list[float] = []
    beside_s: list[float] = []
    # the last chunks' track ids, teacher probabilities and boxes; empty again after a resume
    recent: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque(maxlen=ALIGNMENT_CHUNKS)
    held: list[int] = []  # a video file's frames, once read to its end
    try:
        for video in camera_chunks(config.camera, config.chunk_frames, store.cursor, stop=config.frames,
                                   truth=config.detector == "standin", preset=config.node_camera, held=held.append):
            first = store.cursor
            reloaded = serving.reload_if_promoted(root / PROMOTED)
            chunk = first // config.chunk_frames
            paused = student is not None and chunk % config.probe_every == 0
            student_cpu_s = process_cpu_s(student)
            with stopped(student if paused else None):
                items, latencies_s, n_detections = infer_chunk(video, chunk, teacher, serving, config, recent,
                                                               None if paused else student,
                                                               first_track=_first_free_track(store, chunk))
            student_cpu_s = process_cpu_s(student) - student_cpu_s
            evicted = store.add(items, cursor=first + len(video.frames))
            alone = student is None or paused
            (baseline_s if alone else beside_s).extend(latencies_s)
            emit(root, _chunk_status(store, first, len(video.frames), n_detections, len(items), len(evicted),
                                     latencies_s, baseline_s, beside_s, serving, reloaded, inference_bytes,
                                     not alone, student_cpu_s))
            if student is None and trains:
                student, started = start_student(root, config, student_bytes, lock=lock), True
            elif student is not None and student.poll() not in (None, 0):  # stop now, not at the stream's end
                raise student_failed(student, root)
        if held:
            _report_cut_short(root, Path(config.camera), held[0], say)
        if student is None and trains:  # nothing left to infer: the student still finishes its steps
            student, started = start_student(root, config, student_bytes, lock=lock), True
        if student is not None:
            if student.wait() != 0:
                raise student_failed(student, root)
            student = None
        serving.reload_if_promoted(root / PROMOTED)  # promoted after the last chunk: served from now on
    finally:
        if student is not None:
            student.terminate()
            student.wait()
    inference_peak = read_process_memory().peak_rss_bytes
    student_peak = _student_peak_rss_bytes(root / STATUS) if started else 0
    done = {"event": "done", "frames": store.cursor, "stored_frames": len(store.frames),
            "store_bytes": store.bytes_used, "serving": serving.name,
            "baseline_p95_s": p95_s(baseline_s), "inference_p95_s": p95_s(beside_s),
            "inference_p95_ratio": p95_ratio(baseline_s, beside_s),
            "inference_peak_rss_bytes": inference_peak, "inference_bytes": inference_bytes,
            "student_peak_rss_bytes": student_peak, "student_bytes": student_bytes,
            # the sum of the two peaks bounds their peak together from above
            "service_peak_rss_bytes": inference_peak + student_peak, "memory_bytes": config.memory_bytes,
            "within_memory": inference_peak + student_peak <= config.memory_bytes}
    emit(root, done)
    return done


def _saved_student_step(root: Path) -> int:
    """The step of the student's newest intact saved state; 0 before its first."""
    if not (root / STATES).is_dir():
        return 0
    saved = StateStore(root / STATES).load_latest()
    return 0 if saved is None else saved.step


def _first_free_track(store: FrameStore, chunk: int) -> int:
    """The tracker id past the stored tracks of ``chunk`` (0 for a chunk not begun): a chunk resumed mid-way
    numbers its tracks on from those of its first part."""
    base = chunk * TRACKS_PER_CHUNK
    return max((f.track - base + 1 for f in store.frames if base <= f.track < base + TRACKS_PER_CHUNK), default=0)


def _report_cut_short(root: Path, video: Path, held: int, say: Callable[[str], None]) -> None:
    """Say, and record in the status, a video file that ends before its header's count (NOTE [ A video file cut
    short ])."""
    stated = stated_frames(video)
    if stated is None or held >= stated:
        return
    say(f"--camera {str(video)!r} ends after {held} frames; its header states {stated}: the file was cut short")
    emit(root, {"event": "video_cut_short", "camera": str(video), "decoded_frames": held, "stated_frames": stated})


def _student_peak_rss_bytes(status: Path) -> int:
    """The student's peak RSS in this run: VmHWM (the whole process's life) in its last status line."""
    peak = 0
    for line in status.read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "student_start":
            peak = 0
        elif record["event"] == "student":
            peak = int(record["peak_rss_bytes"])
    return peak


def _chunk_status(store: FrameStore, first: int, frames: int, detections: int, labelled: int, evicted: int,
                  latencies_s: list[float], baseline_s: list[float], beside_s: list[float], serving: Serving,
                  reloaded: bool, inference_bytes: int, student_running: bool,
                  student_cpu_s: float) -> dict[str, Any]:
    peak = read_process_memory().peak_rss_bytes
    return {"event": "chunk", "first_frame": first, "frames": frames, "detections": detections,
            "pseudo_labelled": labelled, "evicted": evicted, "stored_frames": len(store.frames),
            "store_bytes": store.bytes_used, "cursor": store.cursor, "serving": serving.name,
            "reloaded": reloaded, "student_running": student_running, "student_cpu_s": round(student_cpu_s, 3),
            "inference_p95_s": p95_s(latencies_s),
            "baseline_p95_s": p95_s(baseline_s), "inference_p95_ratio": p95_ratio(baseline_s, beside_s),
            "inference_peak_rss_bytes": peak, "inference_bytes": inference_bytes,
            "inference_within_budget": peak <= inference_bytes}
