"""The motion detector scored against the generator's truth on the node streams of ``insitu simulate``.

For each seed, the node stream's clips (``render_video(camera, 200, seed * 1000 + 300 + i)``, the clips
``edgetrain insitu simulate --seed S --node-camera C`` pseudo-labels) go through
:func:`edgetrain.insitu.motion.detect_motion`; boxes are matched one-to-one to truth boxes at IoU >= 0.5. Precision:
detections that found an object; recall: detectable objects (the stand-in detector's floor: >= 50% visible,
>= 14x10 px) found. Both node cameras, per seed and over all, and the detector's time a frame, per clip. The
detector's parameters were chosen on seed 0's first two pole clips. The counts are deterministic; the time is not.
"""

from __future__ import annotations

import time
from typing import Any

from edgetrain.bench.stats import Spread, spread
from edgetrain.insitu.motion import detect_motion, match_sources, score_boxes
from edgetrain.insitu.world import NODE_CAMERAS, render_video

SEEDS = (0, 1, 2)
CLIPS = 6  # the node stream's clips per seed, as ``insitu simulate`` renders them
FRAMES = 200
CAMERAS = ("steep", "pole")

TITLE = "The motion detector's boxes against the truth"


def score_camera(camera: str, seeds: tuple[int, ...], clips: int) -> dict[str, Any]:
    """Counts, precision and recall per seed and over all seeds on ``camera``, and the detector's ms a frame."""
    rows = []
    clip_ms_per_frame: list[float] = []
    for seed in seeds:
        counts: dict[str, float] = {"frames": 0, "detect_s": 0.0}
        for i in range(clips):
            video = render_video(NODE_CAMERAS[camera], FRAMES, seed * 1000 + 300 + i, rate=0.08)
            started = time.perf_counter()
            detections = detect_motion(video.frames)
            detect_s = time.perf_counter() - started
            clip_ms_per_frame.append(1000 * detect_s / len(video.frames))
            counts["detect_s"] += detect_s
            counts["frames"] += len(video.frames)
            for key, value in score_boxes(detections, match_sources(detections, video), video).items():
                counts[key] = counts.get(key, 0) + value
        rows.append(_row(str(seed), counts))
    total = {key: sum(float(row[key]) for row in rows) for key in
             ("frames", "detect_s", "detections", "true_positives", "detectable_objects", "detectable_found")}
    return {"camera": camera, "clips_per_seed": clips, "seeds": rows, "all": _row("all", total),
            "ms_per_frame": spread(clip_ms_per_frame).to_dict()}


def _row(seed: str, c: dict[str, float]) -> dict[str, Any]:
    return {"seed": seed, **{k: int(v) for k, v in c.items() if k != "detect_s"}, "detect_s": c["detect_s"],
            "precision": c["true_positives"] / max(c["detections"], 1),
            "recall": c["detectable_found"] / max(c["detectable_objects"], 1),
            "ms_per_frame": 1000 * c["detect_s"] / c["frames"]}


def run(quick: bool) -> dict[str, Any]:
    """Both node cameras' boxes scored, seed by seed (quick: seed 0's first two clips)."""
    seeds, clips = ((0,), 2) if quick else (SEEDS, CLIPS)
    return {"frames_per_clip": FRAMES, "min_iou": 0.5, "cameras": [score_camera(c, seeds, clips) for c in CAMERAS]}


def render(result: dict[str, Any]) -> str:
    """One table per camera (seeds, then all), then the detector's time a frame."""
    parts = [f"The node stream's clips of `insitu simulate` ({result['frames_per_clip']} frames each) through "
             f"`detect_motion`; a box found an object when it matches a truth box one-to-one at IoU ≥ "
             f"{result['min_iou']:g}. Precision: boxes that found an object. Recall: detectable objects (≥ 50% "
             "visible, ≥ 14x10 px) found."]
    for camera in result["cameras"]:
        ms = Spread.from_dict(camera["ms_per_frame"])
        rows = [f"| {r['seed']} | {r['frames']} | {r['detections']} | {r['true_positives']} | "
                f"{r['detectable_objects']} | {r['detectable_found']} | {r['precision']:.3f} | {r['recall']:.3f} |"
                for r in [*camera["seeds"], camera["all"]]]
        parts.append(f"## {camera['camera']} camera ({camera['clips_per_seed']} clips a seed)\n\n"
                     "| seed | frames | boxes | on an object | detectable objects | found | precision | recall |\n"
                     "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
                     f"The detector takes {ms.median:.2f} ms a frame (median over {ms.n} clips, IQR "
                     f"{ms.q1:.2f}-{ms.q3:.2f} ms, CoV {ms.cov_text}).")
    return "\n\n".join(parts)
