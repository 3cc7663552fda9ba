"""The options of ``edgetrain insitu run``: one record that every part of the service reads.

The service's loop (:mod:`.service`), its inference path (:mod:`.inference`), its student process
(:mod:`.supervisor`) and the latency probe (:mod:`.latency`) all read it, so it sits below them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gate import GateConfig
from .teacher import TeacherConfig

__all__ = ["ServiceConfig"]


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
