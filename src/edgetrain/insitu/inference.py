"""The service's inference path: one chunk of frames classified, tracked, labelled and made ready for the store.

NOTE [ Yielding per frame ]
SCHED_IDLE orders one CPU's run queue: on a one-core node the student runs only when the
inference path waits. On a multi-core node it runs on another core at the same time, and shares
the caches and the memory bandwidth with every frame, which raises the inference path's p95
(docs/guide/insitu.md). So by default
(``pause_per_frame``) the service stops the student (SIGSTOP) when a frame with detections
arrives and continues it (SIGCONT) once the frame is answered: during a frame the inference path
has the machine to itself, and the student trains in the time between frames (at a camera's
5 frames/s, nearly all of it: docs/guide/insitu.md). The stop is a syscall on the frame's path (timed with it); the
continue comes after the frame's latency is taken. A stopped student still dies with the service
(its parent-death signal is SIGKILL, NOTE [ The student process ]).

Frames from a camera arrive at its rate; from a folder or the generator they come as fast as the
path takes them, so between frames the student would get no time. ``frame_rate_hz`` paces them
as a camera would: frame k of a chunk is taken no earlier than ``k / frame_rate_hz`` after its
first, and a path that fell behind takes the frames queued meanwhile at once.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

from .detect import crop
from .labels import fit_stream, label_detections
from .model import Outputs, predict
from .motion import run_detector
from .service_config import ServiceConfig
from .store import encode_png
from .student import load_promoted
from .supervisor import stopped
from .teacher import Teacher
from .tracker import TrackerConfig, track
from .world import Video

__all__ = ["Serving", "infer_chunk", "TRACKS_PER_CHUNK", "ALIGNMENT_CHUNKS"]

# track ids are chunk * this + the tracker's id (past the chunk's stored ones in the rest of a resumed chunk):
# unique over the stream
TRACKS_PER_CHUNK = 100_000
ALIGNMENT_CHUNKS = 6  # the posterior and size rules fit over the last 6 chunks (simulate's stream at 200 frames)


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


def infer_chunk(video: Video, chunk: int, teacher: Teacher, serving: Serving, config: ServiceConfig,
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
        with stopped(yielding):  # the latency is taken inside: the student's SIGCONT follows the answer
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

def _arrivals(frame_rate_hz: float | None) -> Iterator[None]:
    """Yields when each frame is there: at once without a rate, else on the camera's clock (frame k at k / rate)."""
    due = time.perf_counter()
    while True:
        if frame_rate_hz is not None:
            time.sleep(max(0.0, due - time.perf_counter()))
            due += 1.0 / frame_rate_hz
        yield

