"""``edgetrain insitu run``: the node's service, resumable; the student trains beside it in its own process.

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

NOTE [ Yielding per frame ]
SCHED_IDLE orders one CPU's run queue: on a one-core node the student runs only when the
inference path waits. On a multi-core node it runs on another core at the same time, and shares
the caches and the memory bandwidth with every frame: measured here with the student on a whole
core, the inference path's p95 rose by a median 9% (runs up to 31%). So by default
(``pause_per_frame``) the service stops the student (SIGSTOP) when a frame with detections
arrives and continues it (SIGCONT) once the frame is answered: during a frame the inference path
has the machine to itself, and the student trains in the time between frames (at 5 frames/s and
3-4 ms a frame, about 98% of it). The stop is a syscall on the frame's path (timed with it); the
continue comes after the frame's latency is taken. A stopped student still dies with the service
(its parent-death signal is SIGKILL, NOTE [ The student process ]).

Frames from a camera arrive at its rate; from a folder or the generator they come as fast as the
path takes them, so between frames the student would get no time. ``frame_rate_hz`` paces them
as a camera would: frame k of a chunk is taken no earlier than ``k / frame_rate_hz`` after its
first, and a path that fell behind takes the frames queued meanwhile at once.

Memory (NOTE [ Process budget ] for the whole service): ``--memory`` is split between the two
processes, ``student_share`` of it the student's process budget (planned as in ``train
--memory``), the rest the inference process's, which is not planned (it holds one chunk of
frames, two small models and the tracker) but measured: its peak RSS, read from the kernel
after the teacher is ready, is reported against its share.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import EdgetrainError, InfeasibleBudgetError
from ..profile.process import read_process_memory, reset_peak
from ..sysutil.processes import pid_running
from ..train.budget import CUSHION_BYTES
from ..train.rundir import LOCK_FILE, RunDirectory, RunLockedError
from ..train.state import StateStore
from ..units import format_bytes
from .detect import crop
from .labels import GateConfig, fit_stream, label_detections
from .model import Outputs, predict
from .motion import DETECTORS, run_detector
from .store import FrameStore, check_quota, check_store, encode_png
from .student import (
    DECODED_PER_QUOTA_BYTE,
    FRAMES,
    PROMOTED,
    STATES,
    STATUS,
    TEACHER,
    StudentConfig,
    emit,
    load_promoted,
    write_config,
)
from .teacher import Teacher, TeacherConfig, load_teacher, save_teacher, train_teacher
from .tracker import TrackerConfig, track
from .video import probe_video, read_frames, stated_frames
from .world import Camera, ObjectTruth, Video, node_camera, render_video

__all__ = ["ServiceConfig", "Serving", "StoreLock", "run_service", "check_camera", "camera_chunks", "clip", "p95_s",
           "latency_beside_student", "PROBE_FRAME_RATE_HZ", "STUDENT_LOG"]

log = logging.getLogger(__name__)

PROBE_FRAME_RATE_HZ = 20.0  # latency probes pace frames: the student trains between them (NOTE [ Yielding per frame ])
# track ids are chunk * this + the tracker's id (past the chunk's stored ones in the rest of a resumed chunk):
# unique over the stream
TRACKS_PER_CHUNK = 100_000
ALIGNMENT_CHUNKS = 6  # the posterior and size rules fit over the last 6 chunks (simulate's stream at 200 frames)
STUDENT_LOG = "student.log"  # the student's stderr: warnings, a crash's traceback
# A service started while a killed one's student still holds the store's lock waits this long for it to exit
# (NOTE [ An unattended node's service ]): the kernel kills it with its parent, at once, and where it cannot, the
# student stops at its next step.
STUDENT_EXIT_WAIT_S = 10.0


@dataclass(frozen=True)
class ServiceConfig:
    camera: str  # an integer: the seed of a generated world seen by `node_camera`; else a folder from `insitu world`
    # or a video file (seen from `node_camera`'s mount)
    memory_bytes: int  # the whole service: inference process + student process
    frames: int | None = None  # stop after this many frames of the stream (None: the whole stream, forever)
    chunk_frames: int = 200  # 40 s at 5 frames/s: a generated chunk is one of `insitu simulate`'s node clips
    quota_bytes: int = 8 * 2**20
    student_share: float = 0.5  # of memory_bytes, the student process's budget
    student_steps: int = 400
    round_steps: int = 25
    margin: float = 0.02
    probe_every: int = 4  # every 4th chunk runs with the student paused: the latency baseline
    pause_per_frame: bool = True  # the student stopped while a frame is inferred (NOTE [ Yielding per frame ])
    frame_rate_hz: float | None = None  # frames arrive at this rate (a camera's); None: as soon as the path is free
    propagation: str = "track"
    # the tracker cuts a track whose box jumps this far (NOTE [ The motion gate: a track is cut where its box jumps ])
    motion_gate_px: float = 8.0
    node_camera: str = "steep"  # a generated world's camera preset (world.NODE_CAMERAS)
    detector: str = "standin"  # or "motion" (NOTE [ The motion detector ]): frames alone, no truth.json needed
    seed: int = 0  # the teacher's world, the models' and the detector's noise
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    gate: GateConfig = field(default_factory=GateConfig)


def check_camera(camera: str, *, truth: bool = True, preset: str = "steep") -> None:
    """Refuse, before any work, a camera the service cannot read (NOTE [ An unattended node's service ]).

    ``camera`` is a seed, a folder of ``frame_*.png`` (with ``truth.json`` where ``truth``: the stand-in detector
    reads it) or a video file whose first frame decodes at the mount's size (the motion detector only).

    Raises:
        EdgetrainError: naming ``--camera`` and what is wrong with it.
    """
    mount = node_camera(preset)
    if camera.isdigit():
        return
    if Path(camera).is_file():  # NOTE [ A video file as the camera ]
        if truth:
            raise EdgetrainError(f"--camera {camera!r} is a video file, which carries no truth for the stand-in "
                                 "detector: use --detector motion")
        probe_video(Path(camera), (mount.width_px, mount.height_px))
        return
    folder = Path(camera)
    if not any(folder.glob("frame_*.png")) or (truth and not (folder / "truth.json").exists()):
        raise EdgetrainError(f"--camera {camera!r} is neither a seed, a video file nor a folder of frame_*.png"
                             + (" with truth.json (from `edgetrain insitu world`; --detector motion needs none)"
                                if truth else ""))


def camera_chunks(camera: str, chunk_frames: int, start: int, *, stop: int | None = None, truth: bool = True,
                  preset: str = "steep", held: Callable[[int], None] | None = None) -> Iterator[Video]:
    """The camera stream from frame ``start`` to frame ``stop`` (None: its end) in chunks, as videos.

    Chunk k is frames ``k * chunk_frames`` to ``(k + 1) * chunk_frames``; a ``start`` inside a chunk gives the
    rest of that chunk first (NOTE [ An unattended node's service ]), and ``stop`` cuts the last one. A generated
    world's chunk k is ``render_video(camera, chunk_frames, seed * 1000 + 300 + k)`` with the preset ``preset``
    (:data:`~edgetrain.insitu.world.NODE_CAMERAS`; a folder without truth.json is taken to be seen from that
    mount) (the first ones are ``insitu simulate``'s node clips when ``chunk_frames`` is its ``node_frames``);
    endless. A folder (``edgetrain insitu world --out``) gives its frames in order; its ``truth.json`` feeds the
    stand-in detector only (NOTE [ The stand-in detector ]), and is not needed (``truth=False``) by the motion
    detector, the only one a video file can feed (NOTE [ A video file as the camera ]). ``held``: for a video
    file, called with the frames it holds once it is read to its end (NOTE [ A video file cut short ]).

    Raises:
        EdgetrainError: at the call, a camera that cannot be read (:func:`check_camera`).
    """
    check_camera(camera, truth=truth, preset=preset)
    bounds = _chunk_bounds(start, chunk_frames, stop)
    mount = node_camera(preset)
    if camera.isdigit():
        return _generated_chunks(int(camera), chunk_frames, bounds, mount)
    if Path(camera).is_file():
        return _video_chunks(Path(camera), start, bounds, mount, held)
    return _folder_chunks(Path(camera), bounds, mount)


def _chunk_bounds(start: int, chunk_frames: int, stop: int | None) -> Iterator[tuple[int, int]]:
    """(first, stop) of each chunk from frame ``start``: the rest of the chunk ``start`` is in, then whole ones,
    the last cut at ``stop``."""
    first = start
    while stop is None or first < stop:
        end = (first // chunk_frames + 1) * chunk_frames
        yield first, end if stop is None else min(end, stop)
        first = end


def _generated_chunks(seed: int, chunk_frames: int, bounds: Iterator[tuple[int, int]],
                      mount: Camera) -> Iterator[Video]:
    for first, end in bounds:
        k = first // chunk_frames
        video = render_video(mount, chunk_frames, seed * 1000 + 300 + k, rate=0.08)
        yield clip(video, first - k * chunk_frames, end - k * chunk_frames)


def _folder_chunks(folder: Path, bounds: Iterator[tuple[int, int]], mount: Camera) -> Iterator[Video]:
    from PIL import Image

    paths = sorted(folder.glob("frame_*.png"))
    truth: list[ObjectTruth] = []
    cam = mount  # the node's mount (the posterior rule reads it); truth.json's camera, where there is one
    if (folder / "truth.json").exists():
        meta = json.loads((folder / "truth.json").read_text())
        cam = Camera(**meta["camera"])
        truth = [ObjectTruth(**{**t, "box": tuple(t["box"])}) for t in meta["objects"]]
    for first, end in bounds:
        chunk = paths[first:end]
        if not chunk:
            return
        frames = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in chunk])
        yield Video(cam, frames, tuple(replace(t, frame=t.frame - first) for t in truth
                                       if first <= t.frame < first + len(chunk)))


def _video_chunks(path: Path, start: int, bounds: Iterator[tuple[int, int]], mount: Camera,
                  held: Callable[[int], None] | None) -> Iterator[Video]:
    frames = read_frames(path, start, (mount.width_px, mount.height_px), held)
    for first, end in bounds:
        chunk = list(itertools.islice(frames, end - first))
        if not chunk:
            return
        yield Video(mount, np.stack(chunk), ())


def clip(video: Video, first: int, stop: int) -> Video:
    """Frames ``first`` to ``stop`` (exclusive) of ``video``, its truth re-indexed to them."""
    return Video(video.camera, video.frames[first:stop],
                 tuple(replace(t, frame=t.frame - first) for t in video.truth if first <= t.frame < stop))


def p95_s(latencies_s: list[float]) -> float | None:
    return float(np.percentile(latencies_s, 95)) if latencies_s else None


@dataclass
class Serving:
    """The model whose class the node reports: the promoted student once there is one, else the teacher."""

    model: nn.Sequential
    name: str = "teacher"
    stamp: tuple[int, int] | None = None  # (mtime_ns, size) of the model file loaded

    def reload_if_promoted(self, path: Path) -> bool:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return False
        if (stat.st_mtime_ns, stat.st_size) == self.stamp:
            return False
        weights, step, _ = load_promoted(path)
        self.model.load_state_dict(weights)
        self.name, self.stamp = f"student@{step}", (stat.st_mtime_ns, stat.st_size)
        return True


def _infer_chunk(video: Video, chunk: int, teacher: Teacher, serving: Serving, config: ServiceConfig,
                 recent: deque[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 student: subprocess.Popen[bytes] | None = None, first_track: int = 0
                 ) -> tuple[list[tuple[bytes, int, int]], list[float], int]:
    """The inference path over one chunk: labelled crops to store, per-frame latencies, detections.

    ``student``: the running student process, stopped during each frame with detections when
    ``config.pause_per_frame`` (NOTE [ Yielding per frame ]); None when there is none or the
    whole chunk runs with it paused. ``recent`` holds the track ids (unique over the stream),
    teacher probabilities and boxes of the last chunks (this one appended here): the posterior
    rule's alignment and the size rule's size model are fitted on them (NOTE [ Track posteriors: the steep
    camera's labelling rule ], NOTE [ Object size from the mount: the size rule ]). A track's id is
    ``chunk * TRACKS_PER_CHUNK + first_track`` plus the tracker's: ``first_track`` is past the ids of the chunk's
    stored tracks where the chunk is the rest of one begun before (:func:`_first_free_track`).
    """
    detections, _ = run_detector(video, config.detector, config.seed * 7919 + chunk)  # sources: never scored here
    by_frame: dict[int, list[int]] = {}
    for i, d in enumerate(detections):
        by_frame.setdefault(d.frame, []).append(i)
    crops: list[np.ndarray] = []
    outputs: list[Outputs] = []
    latencies_s = []
    yielding = student if config.pause_per_frame else None
    arrivals = _arrivals(config.frame_rate_hz)
    for f in range(len(video.frames)):
        next(arrivals)
        members = by_frame.get(f, [])
        if not members:
            continue
        started = time.perf_counter()
        with _paused(yielding):  # the latency is taken inside: the student's SIGCONT follows the answer
            x = np.array([crop(video.frames[f], detections[i].box) for i in members])
            predict(serving.model, x)  # the node's answer (reported to the application; not used for labels)
            crops += list(x)
            outputs.append(predict(teacher.model, x))  # what the labelling rule reads at the chunk's end
            latencies_s.append(time.perf_counter() - started)  # frames with detections: the path's real work
    if not detections:
        return [], latencies_s, 0
    ids = track(detections, TrackerConfig(seed=config.seed + chunk, max_jump_px=config.motion_gate_px))
    chunk_outputs = Outputs(np.concatenate([o.probs for o in outputs]), np.concatenate([o.features for o in outputs]))
    chunk_boxes = np.array([d.box for d in detections])
    stream_ids = [chunk * TRACKS_PER_CHUNK + first_track + i for i in ids]
    recent.append((np.asarray(stream_ids), chunk_outputs.probs, chunk_boxes))
    tracks, probs, boxes = (np.concatenate(column) for column in zip(*recent, strict=True))
    fit = fit_stream(tracks, probs, boxes, video.camera, teacher.calibration.prior, config.gate)
    pseudo, _ = label_detections(ids, chunk_outputs, chunk_boxes, teacher.calibration, video.camera, config.gate,
                                 config.propagation, fit.alignment, fit.sizes, fit.margin)
    items = [(encode_png(crops[i]), label, stream_ids[i])
             for i, label in enumerate(pseudo) if label is not None]
    return items, latencies_s, len(detections)


def _teacher(root: Path, config: ServiceConfig, say: Callable[[str], None]) -> Teacher:
    path = root / TEACHER
    if not path.exists():
        teacher, _ = train_teacher(config.teacher, say)
        save_teacher(teacher, path)
    return load_teacher(path)


class StoreLock(RunDirectory):
    """The store's lock: ``train``'s run-directory lock (NOTE [ Run directory protocol ]), refused in terms of
    ``--store``, whose file descriptor the student inherits (NOTE [ An unattended node's service ]).

    The cluster commands share their lock the same way; this one does not import the cluster's package into
    the node's inference process, whose memory is budgeted.
    """

    def __enter__(self) -> StoreLock:
        deadline = time.monotonic() + STUDENT_EXIT_WAIT_S
        while True:
            try:
                super().__enter__()
                return self
            except RunLockedError:
                holder = self._holder()
                if holder is not None and not pid_running(holder) and time.monotonic() < deadline:
                    time.sleep(0.1)  # its service is gone: the student that shares the lock is exiting
                    continue
                raise RunLockedError(f"--store {self.path} is in use by another edgetrain process (pid "
                                     f"{'unknown' if holder is None else holder}, or its student): wait for it "
                                     "to end or use another --store") from None

    def _holder(self) -> int | None:
        """The pid the holder wrote into the lock file (:meth:`claim`); None where there is none."""
        try:
            text = (self.path / LOCK_FILE).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None


def _start_student(root: Path, config: ServiceConfig, student_bytes: int, *, lock: StoreLock | None = None,
                   quiet: bool = False) -> subprocess.Popen[bytes]:
    """The student process (NOTE [ The student process ]); ``quiet``: its status lines go to status.jsonl only.

    Started from the calling thread, which must live as long as it does (NOTE [ Children die with their
    parent ]): the service's main thread. It inherits ``lock``, the store's, so the store stays locked while it
    lives; its stderr goes to ``student.log``, where a failure's cause is read (:func:`_student_failed`).
    """
    student = StudentConfig(store_dir=str(root), process_bytes=student_bytes, quota_bytes=config.quota_bytes,
                            steps=config.student_steps, round_steps=config.round_steps, margin=config.margin,
                            seed=config.seed, parent_pid=os.getpid())
    path = write_config(student, root / "student.json")
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}  # as cli.main sets it (NOTE [ Returning freed memory ])
    with open(root / STUDENT_LOG, "wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "edgetrain.insitu.background", str(path)], env=env,
                                stdout=subprocess.DEVNULL if quiet else None, stderr=stderr,
                                pass_fds=() if lock is None else (lock.lock_fd,))


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
            student_cpu_s = _cpu_s(student)
            with _paused(student if paused else None):
                items, latencies_s, n_detections = _infer_chunk(video, chunk, teacher, serving, config, recent,
                                                                None if paused else student,
                                                                first_track=_first_free_track(store, chunk))
            student_cpu_s = _cpu_s(student) - student_cpu_s
            evicted = store.add(items, cursor=first + len(video.frames))
            alone = student is None or paused
            (baseline_s if alone else beside_s).extend(latencies_s)
            emit(root, _chunk_status(store, first, len(video.frames), n_detections, len(items), len(evicted),
                                     latencies_s, baseline_s, beside_s, serving, reloaded, inference_bytes,
                                     not alone, student_cpu_s))
            if student is None and trains:
                student, started = _start_student(root, config, student_bytes, lock=lock), True
            elif student is not None and student.poll() not in (None, 0):  # stop now, not at the stream's end
                raise _student_failed(student, root)
        if held:
            _report_cut_short(root, Path(config.camera), held[0], say)
        if student is None and trains:  # nothing left to infer: the student still finishes its steps
            student, started = _start_student(root, config, student_bytes, lock=lock), True
        if student is not None:
            if student.wait() != 0:
                raise _student_failed(student, root)
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
            "inference_p95_ratio": _ratio(baseline_s, beside_s),
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


def _student_failed(student: subprocess.Popen[bytes], root: Path) -> EdgetrainError:
    """The service's error for a student that exited with a non-zero status, with the cause it left: its
    ``student_error`` status line, else the signal that killed it, else its stderr's last line."""
    status = student.returncode
    cause = _student_error(root / STATUS, student.pid)
    if cause is None and status is not None and status < 0:
        name = signal.Signals(-status).name
        cause = f"killed by {name}" + (" (out of memory, or kill -9)" if -status == signal.SIGKILL else "")
    if cause is None:
        cause = _last_line(root / STUDENT_LOG) or f"it left no cause in {root / STATUS} or {root / STUDENT_LOG}"
    return EdgetrainError(f"the student process exited with status {status}: {cause}")


def _student_error(status: Path, pid: int) -> str | None:
    """The error of the last ``student_error`` line process ``pid`` wrote to ``status``; None without one."""
    errors = [record["error"] for record in map(json.loads, status.read_text().splitlines())
              if record.get("event") == "student_error" and record.get("pid") == pid] if status.exists() else []
    return errors[-1] if errors else None


def _last_line(path: Path) -> str | None:
    """The last non-blank line of a text file (a traceback's last is its exception); None where there is none."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


@contextlib.contextmanager
def _paused(student: subprocess.Popen[bytes] | None) -> Iterator[None]:
    """The student stopped (SIGSTOP) for the block, continued (SIGCONT) after it.

    A student already reaped (it finished its steps) is left alone: its pid may be another process's now.
    """
    if student is None or student.returncode is not None:
        yield
        return
    os.kill(student.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(student.pid, signal.SIGCONT)


def _arrivals(frame_rate_hz: float | None) -> Iterator[None]:
    """Yields when each frame is there: at once without a rate, else on the camera's clock (frame k at k / rate)."""
    due = time.perf_counter()
    while True:
        if frame_rate_hz is not None:
            time.sleep(max(0.0, due - time.perf_counter()))
            due += 1.0 / frame_rate_hz
        yield


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


def _cpu_s(process: subprocess.Popen[bytes] | None) -> float:
    """CPU seconds ``process`` has used (user + system, from /proc); 0 without one or once it is gone.

    The chunk status reports the student's share of a chunk's time: SCHED_IDLE gets no CPU on a
    machine kept busy by others, and a latency ratio measured beside a starved student means little.
    """
    if process is None:
        return 0.0
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def _ratio(baseline_s: list[float], beside_s: list[float]) -> float | None:
    base, beside = p95_s(baseline_s), p95_s(beside_s)
    return None if base is None or beside is None or base == 0 else beside / base


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
            "baseline_p95_s": p95_s(baseline_s), "inference_p95_ratio": _ratio(baseline_s, beside_s),
            "inference_peak_rss_bytes": peak, "inference_bytes": inference_bytes,
            "inference_within_budget": peak <= inference_bytes}


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
    student = _start_student(work, config, int(config.memory_bytes * config.student_share), quiet=True)
    alone_s: list[float] = []
    beside_s: list[float] = []
    cpu_s = wall_s = 0.0
    try:
        training = _wait_for_training(student, work / STATUS, wait_s)
        for k, video in enumerate(chunks):
            paused = k % 2 == 0
            cpu0_s, wall0_s = _cpu_s(student), time.perf_counter()
            with _paused(student if paused else None):
                _, latencies_s, _ = _infer_chunk(video, k, teacher, serving, config, deque(maxlen=ALIGNMENT_CHUNKS),
                                                 None if paused else student)
            if not paused:
                cpu_s += _cpu_s(student) - cpu0_s
                wall_s += time.perf_counter() - wall0_s
            (alone_s if paused else beside_s).extend(latencies_s)
    finally:
        student.terminate()
        student.wait()
    return {"inference_p95_alone_s": p95_s(alone_s), "inference_p95_beside_student_s": p95_s(beside_s),
            "inference_p95_ratio": _ratio(alone_s, beside_s), "student_training": training,
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
            raise _student_failed(student, status.parent)
        time.sleep(0.2)
    return False
