"""The teacher a node ships with: the eye-level model, its competence calibration and a replay set, in one file.

The teacher is trained on the generator's eye-level world (:func:`train_teacher`), the same way
for ``insitu simulate`` and ``insitu run``. A node keeps it as ``teacher.pt``: the weights, the
gate's :class:`~edgetrain.insitu.gate.Calibration` and the eye-level crops the student replays
against forgetting. The file holds tensors only, written atomically, and loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import EdgetrainError
from ..sysutil.fileio import write_atomic
from .detect import crop, detectable
from .gate import Calibration, GateConfig, calibrate
from .model import FitConfig, classifier, fit, predict
from .world import CLASSES, EYE_LEVEL, Camera, Video, render_video

__all__ = ["Teacher", "TeacherConfig", "Labelled", "crops_with_truth", "render_clips", "train_teacher",
           "save_teacher", "load_teacher"]


@dataclass(frozen=True)
class TeacherConfig:
    seed: int = 0
    videos: int = 30  # eye-level clips (the last 4 held in for calibration)
    frames: int = 50
    epochs: int = 10
    replay_crops: int = 800  # eye-level crops shipped with the teacher, replayed by the student
    gate: GateConfig = field(default_factory=GateConfig)


@dataclass(frozen=True)
class Teacher:
    model: nn.Sequential
    calibration: Calibration
    replay_crops: np.ndarray  # (n, CROP_PX, CROP_PX, 3) uint8
    replay_labels: np.ndarray  # (n,)


@dataclass(frozen=True)
class Labelled:
    """Every detectable object's crop at its true box, with label, box and elevation (teacher data, scoring)."""

    crops: np.ndarray  # (n, CROP_PX, CROP_PX, 3) uint8
    labels: np.ndarray  # (n,)
    boxes: np.ndarray  # (n, 4)
    elevations_deg: np.ndarray  # (n,)


def crops_with_truth(videos: list[Video]) -> Labelled:
    crops, labels, boxes, elevations = [], [], [], []
    for v in videos:
        for t in v.truth:
            if detectable(t):
                crops.append(crop(v.frames[t.frame], t.box))
                labels.append(t.label)
                boxes.append(t.box)
                elevations.append(t.elevation_deg)
    return Labelled(np.array(crops), np.array(labels), np.array(boxes), np.array(elevations))


def render_clips(cameras: tuple[Camera, ...], count: int, frames: int, seed: int, rate: float) -> list[Video]:
    return [render_video(cameras[i % len(cameras)], frames, seed + i, rate=rate) for i in range(count)]


def train_teacher(config: TeacherConfig, say: Callable[[str], None]) -> tuple[Teacher, Labelled]:
    """The teacher trained on the eye-level world of ``config.seed``, and its training crops (with truth)."""
    say("rendering the teacher's eye-level world")
    eye = render_clips(EYE_LEVEL, config.videos, config.frames, config.seed * 1000 + 100, rate=0.25)
    train = crops_with_truth(eye[:-4])
    held_x = crops_with_truth(eye[-4:]).crops
    say(f"training the teacher on {len(train.crops)} eye-level crops")
    model = fit(classifier(len(CLASSES), config.seed), train.crops, train.labels,
                FitConfig(epochs=config.epochs, seed=config.seed))
    calibration = calibrate(predict(model, train.crops), train.labels, train.boxes, predict(model, held_x),
                            config.gate)
    rng = np.random.default_rng(config.seed)
    replay = rng.choice(len(train.crops), size=min(config.replay_crops, len(train.crops)), replace=False)
    return Teacher(model, calibration, train.crops[replay], train.labels[replay]), train


def save_teacher(teacher: Teacher, path: Path) -> Path:
    """Write ``teacher`` to ``path`` atomically (tensors only)."""
    c = teacher.calibration
    payload = {"model": teacher.model.state_dict(), "class_means": torch.from_numpy(c.class_means),
               "feature_std": torch.from_numpy(c.feature_std), "max_distance": float(c.max_distance),
               "aspect_bounds": torch.from_numpy(c.aspect_bounds),
               "class_prior": torch.from_numpy(c.prior),
               "replay_crops": torch.from_numpy(teacher.replay_crops),
               "replay_labels": torch.from_numpy(teacher.replay_labels.astype(np.int64))}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return write_atomic(path, buffer.getvalue())


def load_teacher(path: Path) -> Teacher:
    """The teacher :func:`save_teacher` wrote; one-line error for a missing or foreign file."""
    try:
        payload = torch.load(path, weights_only=True)
        model = classifier(len(CLASSES), 0)
        model.load_state_dict(payload["model"])
        calibration = Calibration(payload["class_means"].numpy(), payload["feature_std"].numpy(),
                                  float(payload["max_distance"]), payload["aspect_bounds"].numpy(),
                                  payload["class_prior"].numpy())
        teacher = Teacher(model.eval(), calibration, payload["replay_crops"].numpy(),
                          payload["replay_labels"].numpy())
    except (OSError, RuntimeError, KeyError, TypeError) as exc:
        raise EdgetrainError(f"{path} is not a teacher file: {exc}") from None
    return teacher
