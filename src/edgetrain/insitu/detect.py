"""Detections and crops: a stand-in detector driven by the generator, with stated miss and false-positive rates.

NOTE [ The stand-in detector ]
The pipeline's detector is *simulated*: it takes the generator's visible boxes, drops each with
probability ``miss_rate``, jitters the rest by a few pixels and adds ``false_positives_per_frame``
boxes of background on average. What reaches the tracker is unlabeled boxes only; the source
track id of each detection is returned separately for evaluation (0 for a false positive) and
never read by the tracker, the teacher gate or the store. A background-subtraction detector
is the next step (see docs/guide/insitu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .world import ObjectTruth, Video

__all__ = ["Detection", "detectable", "detect", "crop", "CROP_PX"]

CROP_PX = 32


@dataclass(frozen=True)
class Detection:
    """A box in a frame, as a detector reports it (no class, no identity)."""

    frame: int
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x1 and y1 exclusive


def detectable(t: ObjectTruth) -> bool:
    """What the stand-in detector can find at all: at least half visible, 14 px tall and 10 px wide."""
    return t.visible_fraction >= 0.5 and t.box[3] - t.box[1] >= 14 and t.box[2] - t.box[0] >= 10


def detect(video: Video, seed: int, *, miss_rate: float = 0.0, false_positives_per_frame: float = 0.0,
           jitter_px: float = 1.0) -> tuple[list[Detection], list[int]]:
    """Detections frame by frame, and (for evaluation only) the track id each came from (0: false positive).

    Every :func:`detectable` object is found, less a random ``miss_rate`` of them.
    """
    if not (0.0 <= miss_rate < 1.0) or false_positives_per_frame < 0:
        raise ValueError("miss_rate must be in [0, 1) and false_positives_per_frame >= 0")
    rng = np.random.default_rng(seed)
    height, width = video.frames.shape[1:3]
    by_frame: dict[int, list[tuple[tuple[int, int, int, int], int]]] = {}
    for t in video.truth:
        if not detectable(t) or rng.random() < miss_rate:
            continue
        box = np.array(t.box, dtype=float) + rng.normal(0, jitter_px, size=4)
        by_frame.setdefault(t.frame, []).append((_clip(box, width, height), t.track_id))
    for f in range(len(video.frames)):
        for _ in range(rng.poisson(false_positives_per_frame)):
            w, h = rng.uniform(10, 40), rng.uniform(10, 40)
            x, y = rng.uniform(0, width - w), rng.uniform(height * 0.2, height - h)
            by_frame.setdefault(f, []).append((_clip(np.array([x, y, x + w, y + h]), width, height), 0))
    detections, sources = [], []
    for f in sorted(by_frame):
        for clipped, source in by_frame[f]:
            detections.append(Detection(f, clipped))
            sources.append(source)
    return detections, sources


def _clip(box: np.ndarray, width: int, height: int) -> tuple[int, int, int, int]:
    x0, y0 = int(np.clip(round(box[0]), 0, width - 2)), int(np.clip(round(box[1]), 0, height - 2))
    x1, y1 = int(np.clip(round(box[2]), x0 + 2, width)), int(np.clip(round(box[3]), y0 + 2, height))
    return x0, y0, x1, y1


def crop(frame: np.ndarray, box: Sequence[int], size_px: int = CROP_PX) -> np.ndarray:
    """The square 1.2x the box's longer side around its centre (black outside the frame), resized to ``size_px``."""
    x0, y0, x1, y1 = box
    half = max(x1 - x0, y1 - y0) * 0.6
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    square = (round(cx - half), round(cy - half), round(cx + half), round(cy + half))
    region = Image.fromarray(frame).crop(square)
    return np.asarray(region.resize((size_px, size_px), Image.Resampling.BILINEAR))
