"""A contact sheet of the camera world for the docs: eye-level and pole frames with their truth boxes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .detect import detectable
from .world import CLASSES, EYE_LEVEL, POLE, Video, render_video

__all__ = ["contact_sheet"]


def _annotated(video: Video, frame: int) -> Image.Image:
    image = Image.fromarray(video.frames[frame])
    draw = ImageDraw.Draw(image)
    for t in video.truth:
        if t.frame == frame and detectable(t):
            draw.rectangle([t.box[0], t.box[1], t.box[2] - 1, t.box[3] - 1], outline=(255, 255, 0))
            draw.text((t.box[0], max(0, t.box[1] - 10)), f"{CLASSES[t.label]} {t.elevation_deg:.0f}°",
                      fill=(255, 255, 0))
    return image


def contact_sheet(seed: int, out: Path, frames: tuple[int, ...] = (40, 70, 100)) -> Path:
    """Top row: the teacher's eye-level camera; bottom row: the node's pole camera (same seed, truth boxes)."""
    rows = []
    for camera in (EYE_LEVEL[1], POLE):
        video = render_video(camera, max(frames) + 1, seed, rate=0.15)
        rows.append(np.concatenate([np.asarray(_annotated(video, f)) for f in frames], axis=1))
    # 64 colours: the sensor noise would otherwise make a half-megabyte PNG for the docs
    Image.fromarray(np.concatenate(rows, axis=0)).quantize(64).save(out, optimize=True)
    return out
