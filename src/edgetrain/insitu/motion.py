"""A real detector for a fixed camera: background subtraction on grey frames (numpy and SciPy only).

NOTE [ The motion detector ]
The node's camera does not move, so what differs from the background is what moves. Per frame:

1. grey = 0.299 R + 0.587 G + 0.114 B (float32);
2. foreground = |grey - gain x background| > ``threshold`` grey levels (``gain``: the ratio of the
   frame's median to the background's, the light's global brightness drift), cleaned by a binary opening
   (drops sensor-noise specks) and a dilation (joins an object's shaded faces);
3. connected components (``scipy.ndimage.label``), each component's bounding box
   (``find_objects``); boxes smaller than the stand-in's detectability floor (``min_width_px`` x
   ``min_height_px``) or of fewer than ``min_area_px`` foreground pixels are dropped;
4. the background is an exponential running mean of the frames, updated with rate ``alpha``
   where nothing moves and ``alpha_foreground`` under (and next to) foreground: a slow light
   drift is followed, a passing object (a few frames on a pixel) is hardly learned, and what
   stays in place (static clutter whose shading changes as the light turns; a stopped object)
   fades into the background within ~1/``alpha_foreground`` frames.

The background starts as the first frame. Objects in view in that frame leave a ghost where
they stood until they move off and the background there is relearned (``alpha`` per frame of the
difference): the first ``warmup_frames`` frames report nothing.

Two objects that touch in the image are one component (one box), an object cut by an occluder
may be two: both count against the detector when it is scored (:func:`score_boxes`), and both
reach the tracker and the gate as they would on a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import EdgetrainError
from .detect import Detection, detect, detectable
from .tracker import iou_matrix
from .world import Video

__all__ = ["MotionConfig", "detect_motion", "match_sources", "score_boxes", "run_detector", "DETECTORS"]

DETECTORS = ("standin", "motion")

_GREY = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True)
class MotionConfig:
    threshold: float = 20.0  # grey levels (sensor noise: sigma 4)
    alpha: float = 0.3  # background update per frame where nothing moves
    alpha_foreground: float = 0.02  # ... and under foreground: what stays (shading of static clutter) is learned
    min_area_px: int = 60
    min_width_px: int = 10
    min_height_px: int = 14
    warmup_frames: int = 3
    dilate_px: int = 4  # joins an object's parts (faces that differ from the ground by less than the threshold)


def detect_motion(frames: np.ndarray, config: MotionConfig = MotionConfig()) -> list[Detection]:
    """Boxes of moving things in ``frames`` (T, H, W, 3) uint8, frame by frame (NOTE [ The motion detector ])."""
    try:
        from scipy import ndimage
    except ImportError:
        raise EdgetrainError("the motion detector needs SciPy: pip install 'edgetrain[insitu]'") from None
    background = frames[0].astype(np.float32) @ _GREY
    structure = np.ones((3, 3), dtype=bool)
    detections = []
    for f, frame in enumerate(frames):
        grey = frame.astype(np.float32) @ _GREY
        gain = float(np.median(grey)) / max(float(np.median(background)), 1.0)  # the light's global drift
        raw = np.abs(grey - gain * background) > config.threshold
        mask = ndimage.binary_dilation(ndimage.binary_opening(raw, structure), structure,
                                       iterations=config.dilate_px)
        still = ~ndimage.binary_dilation(mask, structure, iterations=2)
        background += np.where(still, config.alpha, config.alpha_foreground) * (grey - background)
        if f < config.warmup_frames:
            continue
        labels, _ = ndimage.label(mask)
        for k, region in enumerate(ndimage.find_objects(labels), start=1):
            if region is None:
                continue
            ys, xs = region
            if (xs.stop - xs.start < config.min_width_px or ys.stop - ys.start < config.min_height_px
                    or int(raw[region][labels[region] == k].sum()) < config.min_area_px):
                continue
            detections.append(Detection(f, (xs.start, ys.start, xs.stop, ys.stop)))
    return detections


def match_sources(detections: list[Detection], video: Video, min_iou: float = 0.5) -> list[int]:
    """For scoring only: the truth track each detection found (IoU >= ``min_iou``, one-to-one per frame), 0 if none.

    Every truth record counts, detectable or not: a box on an object mostly hidden is not a
    false positive.
    """
    from scipy.optimize import linear_sum_assignment

    truth_by_frame: dict[int, list[tuple[int, tuple[int, int, int, int]]]] = {}
    for t in video.truth:
        truth_by_frame.setdefault(t.frame, []).append((t.track_id, t.box))
    sources = [0] * len(detections)
    by_frame: dict[int, list[int]] = {}
    for i, d in enumerate(detections):
        by_frame.setdefault(d.frame, []).append(i)
    for f, members in by_frame.items():
        truth = truth_by_frame.get(f, [])
        if not truth:
            continue
        iou = iou_matrix(np.array([detections[i].box for i in members], dtype=float),
                         np.array([box for _, box in truth], dtype=float))
        rows, cols = linear_sum_assignment(-iou)
        for r, c in zip(rows, cols, strict=True):
            if iou[r, c] >= min_iou:
                sources[members[r]] = truth[c][0]
    return sources


def score_boxes(detections: list[Detection], sources: list[int], video: Video) -> dict[str, int]:
    """Counts for precision (detections that found an object) and recall (detectable objects found) of boxes."""
    found = {(d.frame, s) for d, s in zip(detections, sources, strict=True) if s}
    targets = {(t.frame, t.track_id) for t in video.truth if detectable(t)}
    return {"detections": len(detections), "true_positives": sum(1 for s in sources if s),
            "detectable_objects": len(targets), "detectable_found": len(found & targets)}


def run_detector(video: Video, detector: str, seed: int, *, miss_rate: float = 0.0,
                 false_positives_per_frame: float = 0.0) -> tuple[list[Detection], list[int]]:
    """Detections of ``video`` by ``detector`` (one of :data:`DETECTORS`) and, for scoring only, their sources.

    The stand-in takes its boxes from the truth (NOTE [ The stand-in detector ]), with
    ``miss_rate`` and ``false_positives_per_frame``; the motion detector reads the frames alone,
    and its sources are matched to the truth afterwards (:func:`match_sources`; empty truth: all 0).
    """
    if detector == "standin":
        return detect(video, seed, miss_rate=miss_rate, false_positives_per_frame=false_positives_per_frame)
    if detector == "motion":
        detections = detect_motion(video.frames)
        return detections, match_sources(detections, video)
    raise ValueError(f"detector must be one of {', '.join(DETECTORS)}, got {detector!r}")
