"""Per-frame inference latency of the in-situ service, alone and beside its training student process.

The benchmark first builds what the service would have after its first run: a store from
``edgetrain insitu run --camera 0 --memory 1GiB --frames 1200 --student-steps 1`` (the teacher and the stream's
pseudo-labelled frames), in a temporary folder. It then renders held-out clips of the node's camera (``simulate``'s
test clips) and runs the service's inference path over them in 25-frame chunks, with a student process (as the
service starts it: SCHED_IDLE, one thread, half of 1 GiB) training from the store's frames, paused (SIGSTOP) on even
chunks and running on odd ones (:func:`edgetrain.insitu.latency.latency_beside_student`), so both halves see the same
machine under the same outside load. Three modes: frames at 20 a second (a frame every 50 ms: the student trains
between frames) with the student stopped while each frame is inferred (the service's default, NOTE [ Yielding per
frame ]); the same with the student left running during frames; and frames back to back with both running at once.
Each measurement has a fresh student; the modes' measurements are interleaved. The result per mode: both p95s, their
ratio (the bound: 1.10), whether the student was training and its CPU share while it ran, each as a spread over the
measurements. A CPU share near 0 means the machine, busy with other work, gave the SCHED_IDLE student nothing, and
the ratio then says nothing about training's interference: run it on a quiet machine.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from edgetrain.bench.stats import Spread, spread
from edgetrain.insitu.latency import PROBE_FRAME_RATE_HZ, latency_beside_student
from edgetrain.insitu.service import run_service
from edgetrain.insitu.service_config import ServiceConfig
from edgetrain.insitu.simulate import QUICK
from edgetrain.insitu.student import FRAMES, TEACHER
from edgetrain.insitu.teacher import TeacherConfig, load_teacher, render_clips
from edgetrain.insitu.world import NODE_CAMERAS

SEED = 0
NODE_CAMERA = "steep"
MEMORY_BYTES = 2**30
STORE_FRAMES = 1200  # the stream the store is built from: 6 chunks of 200 frames
CLIP_FRAMES = 200
# (name, frames per second or None for back to back, the student stopped while each frame is inferred)
MODES = (("20 frames/s, student stopped per frame", PROBE_FRAME_RATE_HZ, True),
         ("20 frames/s, student running during frames", PROBE_FRAME_RATE_HZ, False),
         ("back to back, student running during frames", None, False))
SPREAD_KEYS = ("inference_p95_alone_s", "inference_p95_beside_student_s", "inference_p95_ratio", "student_cpu_share")

TITLE = "Inference latency beside the training student"


def teacher_config(quick: bool) -> TeacherConfig:
    """The service's teacher (``insitu run``'s; quick: ``--quick``'s small one)."""
    if not quick:
        return TeacherConfig(seed=SEED)
    return TeacherConfig(seed=SEED, videos=QUICK["teacher_videos"], frames=QUICK["teacher_frames"],
                         epochs=QUICK["teacher_epochs"], replay_crops=QUICK["replay_crops"])


def build_store(root: Path, frames: int, quick: bool) -> dict[str, Any]:
    """The store of a first service run over ``frames`` of the generated stream, its student stopped after a step;
    returns the run's last status record (``stored_frames``, ``store_bytes``, ...)."""
    config = ServiceConfig(camera=str(SEED), memory_bytes=MEMORY_BYTES, frames=frames, student_steps=1, seed=SEED,
                           node_camera=NODE_CAMERA, teacher=teacher_config(quick))
    with _stdout_silenced():
        return run_service(root, config, say=lambda message: None)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 to /dev/null: the service and its student write their status lines there, and the
    runner's stdout is for its own lines."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def run(quick: bool) -> dict[str, Any]:
    """Every mode measured ``repeats`` times over the same clips, the modes interleaved (quick: a small store and
    teacher, one clip, two modes, two measurements each)."""
    clips, repeats, store_frames = (1, 2, 200) if quick else (3, 5, STORE_FRAMES)
    modes = (MODES[0], MODES[2]) if quick else MODES
    torch.set_num_threads(1)
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in modes}
    with tempfile.TemporaryDirectory(prefix="edgetrain-insitu-latency-") as work:
        store = Path(work) / "store"
        built = build_store(store, store_frames, quick)
        teacher = load_teacher(store / TEACHER)
        videos = render_clips((NODE_CAMERAS[NODE_CAMERA],), clips, CLIP_FRAMES, SEED * 1000 + 500, rate=0.08)
        for k in range(repeats):
            for m, (name, rate_hz, pause) in enumerate(modes):
                config = ServiceConfig(camera=str(SEED), memory_bytes=MEMORY_BYTES, chunk_frames=25, seed=SEED,
                                       student_steps=10**6,  # trains throughout (stopped at the end), however long
                                       frame_rate_hz=rate_hz, pause_per_frame=pause)
                measured[name].append(latency_beside_student(videos, teacher, copy.deepcopy(teacher.model),
                                                             store / FRAMES, Path(work) / f"node{k}_{m}", config))
    rows = []
    for name, rate_hz, pause in modes:
        results = measured[name]
        values = {key: [float(v) for r in results if (v := r[key]) is not None] for key in SPREAD_KEYS}
        rows.append({"mode": name, "frame_rate_hz": rate_hz, "pause_per_frame": pause, "runs": len(results),
                     "student_training": sum(bool(r["student_training"]) for r in results),
                     "ratios": values["inference_p95_ratio"],
                     **{key: spread(v).to_dict() if v else None for key, v in values.items()}})
    return {"clips": clips, "frames": clips * CLIP_FRAMES, "chunk_frames": 25, "store_stream_frames": store_frames,
            "stored_frames": built["stored_frames"],
            "bound": 1.10, "modes": rows}


def render(result: dict[str, Any]) -> str:
    """One row per mode: the student's CPU share, both p95s and their ratio with its spread and highest run."""
    lines = []
    for row in result["modes"]:
        if row["inference_p95_ratio"] is None:
            lines.append(f"| {row['mode']} | {row['runs']} | {row['student_training']} | no ratio | | | | |")
            continue
        ratio = Spread.from_dict(row["inference_p95_ratio"])
        share = row["student_cpu_share"]
        alone, beside = (Spread.from_dict(row[k]) for k in ("inference_p95_alone_s", "inference_p95_beside_student_s"))
        above = sum(r > result["bound"] for r in row["ratios"])
        lines.append(f"| {row['mode']} | {row['runs']} | {row['student_training']} | "
                     f"{'' if share is None else format(share['median'], '.2f')} | {alone.median * 1e3:.2f} ms | "
                     f"{beside.median * 1e3:.2f} ms | {ratio.median:.3f} ({ratio.q1:.3f}-{ratio.q3:.3f}, CoV "
                     f"{ratio.cov_text}) | {max(row['ratios']):.3f} | {above} |")
    return (f"The service's inference path over {result['clips']} held-out clip(s) ({result['frames']} frames) in "
            f"chunks of {result['chunk_frames']}, the training student paused on even chunks and running on odd "
            f"ones; the store it trains from is a first service run over {result['store_stream_frames']} frames of "
            f"the generated stream ({result['stored_frames']} frames stored). The ratio is the p95 beside the "
            "student over the p95 with it paused, per run; the bound is "
            f"{result['bound']:.2f}. The student's CPU share is its CPU seconds per second while it ran: near 0, "
            "the machine gave the SCHED_IDLE student no time and the ratio measures nothing.\n\n"
            "| mode | runs | student training | student's CPU share (median) | p95 alone (median) | "
            "p95 beside (median) | ratio, median (IQR, CoV) | highest ratio | runs above the bound |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines))
