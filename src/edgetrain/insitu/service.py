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

from ..errors import EdgetrainError
from ..profile.process import read_process_memory, reset_peak
from .detect import crop
from .labels import GateConfig, fit_stream, label_detections
from .model import Outputs, predict
from .motion import DETECTORS, run_detector
from .store import FrameStore, encode_png
from .student import FRAMES, PROMOTED, STATUS, TEACHER, StudentConfig, emit, load_promoted, write_config
from .teacher import Teacher, TeacherConfig, load_teacher, save_teacher, train_teacher
from .tracker import TrackerConfig, track
from .video import read_frames
from .world import Camera, ObjectTruth, Video, node_camera, render_video

__all__ = ["ServiceConfig", "Serving", "run_service", "camera_chunks", "clip", "p95_s", "latency_beside_student",
           "PROBE_FRAME_RATE_HZ"]

log = logging.getLogger(__name__)

PROBE_FRAME_RATE_HZ = 20.0  # latency probes pace frames: the student trains between them (NOTE [ Yielding per frame ])
TRACKS_PER_CHUNK = 100_000  # track ids are chunk * this + the tracker's id: unique over the stream
ALIGNMENT_CHUNKS = 6  # the posterior and size rules fit over the last 6 chunks (simulate's stream at 200 frames)


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


def camera_chunks(camera: str, chunk_frames: int, start: int, *, truth: bool = True,
                  preset: str = "steep") -> Iterator[Video]:
    """The camera stream from frame ``start`` (a multiple of ``chunk_frames``) in chunks, as videos.

    A generated world's chunk k is ``render_video(camera, chunk_frames, seed * 1000 + 300 + k)``
    with the preset ``preset`` (:data:`~edgetrain.insitu.world.NODE_CAMERAS`; a folder without
    truth.json is taken to be seen from that mount)
    (the first ones are ``insitu simulate``'s node clips when ``chunk_frames`` is its
    ``node_frames``); endless. A folder (``edgetrain insitu world --out``) gives its frames in
    order; its ``truth.json`` feeds the stand-in detector only (NOTE [ The stand-in detector ]),
    and is not needed (``truth=False``) by the motion detector, the only one a video file can feed
    (NOTE [ A video file as the camera ]).
    """
    if start % chunk_frames:
        raise EdgetrainError(f"the store's cursor {start} is not a multiple of --chunk-frames {chunk_frames}: "
                             f"rerun with the chunk size the store was made with")
    if camera.isdigit():
        k = start // chunk_frames
        while True:
            yield render_video(node_camera(preset), chunk_frames, int(camera) * 1000 + 300 + k, rate=0.08)
            k += 1
    if Path(camera).is_file():  # NOTE [ A video file as the camera ]
        if truth:
            raise EdgetrainError(f"--camera {camera!r} is a video file, which carries no truth for the stand-in "
                                 "detector: use --detector motion")
        yield from _video_chunks(Path(camera), chunk_frames, start, node_camera(preset))
        return
    folder = Path(camera)
    paths = sorted(folder.glob("frame_*.png"))
    if not paths or (truth and not (folder / "truth.json").exists()):
        raise EdgetrainError(f"--camera {camera!r} is neither a seed, a video file nor a folder of frame_*.png"
                             + (" with truth.json (from `edgetrain insitu world`; --detector motion needs none)"
                                if truth else ""))
    yield from _folder_chunks(folder, paths, chunk_frames, start, node_camera(preset))


def _folder_chunks(folder: Path, paths: list[Path], chunk_frames: int, start: int, mount: Camera) -> Iterator[Video]:
    from PIL import Image

    truth: list[ObjectTruth] = []
    cam = mount  # the node's mount (the posterior rule reads it); truth.json's camera, where there is one
    if (folder / "truth.json").exists():
        meta = json.loads((folder / "truth.json").read_text())
        cam = Camera(**meta["camera"])
        truth = [ObjectTruth(**{**t, "box": tuple(t["box"])}) for t in meta["objects"]]
    for first in range(start, len(paths), chunk_frames):
        chunk = paths[first:first + chunk_frames]
        frames = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in chunk])
        yield Video(cam, frames, tuple(replace(t, frame=t.frame - first) for t in truth
                                       if first <= t.frame < first + len(chunk)))


def _video_chunks(path: Path, chunk_frames: int, start: int, mount: Camera) -> Iterator[Video]:
    frames = read_frames(path, start, (mount.width_px, mount.height_px))
    while chunk := list(itertools.islice(frames, chunk_frames)):
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
                 student: subprocess.Popen[bytes] | None = None
                 ) -> tuple[list[tuple[bytes, int, int]], list[float], int]:
    """The inference path over one chunk: labelled crops to store, per-frame latencies, detections.

    ``student``: the running student process, stopped during each frame with detections when
    ``config.pause_per_frame`` (NOTE [ Yielding per frame ]); None when there is none or the
    whole chunk runs with it paused. ``recent`` holds the track ids (unique over the stream),
    teacher probabilities and boxes of the last chunks (this one appended here): the posterior
    rule's alignment and the size rule's size model are fitted on them (NOTE [ Track posteriors: the steep
    camera's labelling rule ], NOTE [ Object size from the mount: the size rule ]).
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
    recent.append((chunk * TRACKS_PER_CHUNK + np.asarray(ids), chunk_outputs.probs, chunk_boxes))
    tracks, probs, boxes = (np.concatenate(column) for column in zip(*recent, strict=True))
    fit = fit_stream(tracks, probs, boxes, video.camera, teacher.calibration.prior, config.gate)
    pseudo, _ = label_detections(ids, chunk_outputs, chunk_boxes, teacher.calibration, video.camera, config.gate,
                                 config.propagation, fit.alignment, fit.sizes, fit.margin)
    items = [(encode_png(crops[i]), label, chunk * TRACKS_PER_CHUNK + ids[i])
             for i, label in enumerate(pseudo) if label is not None]
    return items, latencies_s, len(detections)


def _teacher(root: Path, config: ServiceConfig, say: Callable[[str], None]) -> Teacher:
    path = root / TEACHER
    if not path.exists():
        teacher, _ = train_teacher(config.teacher, say)
        save_teacher(teacher, path)
    return load_teacher(path)


def _start_student(root: Path, config: ServiceConfig, student_bytes: int, *,
                   quiet: bool = False) -> subprocess.Popen[bytes]:
    """The student process (NOTE [ The student process ]); ``quiet``: its status lines go to status.jsonl only."""
    student = StudentConfig(store_dir=str(root), process_bytes=student_bytes, quota_bytes=config.quota_bytes,
                            steps=config.student_steps, round_steps=config.round_steps, margin=config.margin,
                            seed=config.seed, parent_pid=os.getpid())
    path = write_config(student, root / "student.json")
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}  # as cli.main sets it (NOTE [ Returning freed memory ])
    return subprocess.Popen([sys.executable, "-m", "edgetrain.insitu.background", str(path)], env=env,
                            stdout=subprocess.DEVNULL if quiet else None)


def run_service(root: Path, config: ServiceConfig, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or continue) the service in ``root`` until ``config.frames`` and the student's steps are done.

    Returns:
        the last status record (``event: "done"``).
    """
    if config.detector not in DETECTORS:
        raise ValueError(f"detector must be one of {', '.join(DETECTORS)}, got {config.detector!r}")
    if config.probe_every < 2:
        raise ValueError(f"probe_every must be >= 2 (every chunk paused would never train), got {config.probe_every}")
    if not 0.0 < config.student_share < 1.0:
        raise ValueError(f"the student's share of --memory must be in (0, 1), got {config.student_share}")
    say = say or (lambda message: log.info(message))
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    teacher = _teacher(root, config, say)
    store = FrameStore(root / FRAMES, config.quota_bytes)
    serving = Serving(copy.deepcopy(teacher.model))
    serving.reload_if_promoted(root / PROMOTED)
    student_bytes = int(config.memory_bytes * config.student_share)
    inference_bytes = config.memory_bytes - student_bytes
    reset_peak()  # the service's budget starts here: the teacher's one-off training is not the node's
    emit(root, {"event": "start", "camera": config.camera, "resumed_frames": store.cursor,
                "stored_frames": len(store.frames), "memory_bytes": config.memory_bytes,
                "inference_bytes": inference_bytes, "student_bytes": student_bytes, "serving": serving.name})
    student: subprocess.Popen[bytes] | None = None
    baseline_s: list[float] = []
    beside_s: list[float] = []
    # the last chunks' track ids, teacher probabilities and boxes; empty again after a resume
    recent: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque(maxlen=ALIGNMENT_CHUNKS)
    try:
        for video in camera_chunks(config.camera, config.chunk_frames, store.cursor,
                                   truth=config.detector == "standin", preset=config.node_camera):
            first = store.cursor
            if config.frames is not None and first >= config.frames:
                break
            if config.frames is not None and first + len(video.frames) > config.frames:
                video = clip(video, 0, config.frames - first)
            reloaded = serving.reload_if_promoted(root / PROMOTED)
            chunk = first // config.chunk_frames
            paused = student is not None and chunk % config.probe_every == 0
            student_cpu_s = _cpu_s(student)
            with _paused(student if paused else None):
                items, latencies_s, n_detections = _infer_chunk(video, chunk, teacher, serving, config, recent,
                                                                None if paused else student)
            student_cpu_s = _cpu_s(student) - student_cpu_s
            evicted = store.add(items, cursor=first + len(video.frames))
            alone = student is None or paused
            (baseline_s if alone else beside_s).extend(latencies_s)
            emit(root, _chunk_status(store, first, len(video.frames), n_detections, len(items), len(evicted),
                                     latencies_s, baseline_s, beside_s, serving, reloaded, inference_bytes,
                                     not alone, student_cpu_s))
            if student is None:
                student = _start_student(root, config, student_bytes)
            elif student.poll() not in (None, 0):  # refused its budget: stop now, not at the stream's end
                _check_exit(student, root)
        if student is None:  # nothing left to infer: the student still finishes its steps
            student = _start_student(root, config, student_bytes)
        student.wait()
        _check_exit(student, root)
        student = None
        serving.reload_if_promoted(root / PROMOTED)  # promoted after the last chunk: served from now on
    finally:
        if student is not None:
            student.terminate()
            student.wait()
    inference_peak = read_process_memory().peak_rss_bytes
    student_peak = _student_peak_rss_bytes(root / STATUS)
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


def _check_exit(student: subprocess.Popen[bytes], root: Path) -> None:
    if student.returncode not in (None, 0):
        raise EdgetrainError(f"the student process exited with status {student.returncode} (see {root / STATUS})")


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
            raise EdgetrainError(f"the student process exited with status {student.returncode} (see {status})")
        time.sleep(0.2)
    return False
