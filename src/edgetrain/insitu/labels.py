"""From teacher outputs to pseudo-labels: a competence gate that reads no ground truth, and track propagation.

NOTE [ Estimating the teacher's competence ]
The prototype in issue #13 showed that voting the teacher's *confident* labels along a track
is not enough: far from its training views the teacher is confidently wrong. The node cannot
read the true viewpoint, so the gate estimates competence from what it has:

1. *calibration on held-in views*: on eye-level crops the teacher never trained on, the
   distance of each crop's feature to its predicted class's mean (per-dimension standardised)
   is measured; the gate accepts a frame only if its distance is within the ``quantile`` of
   those held-in distances (a frame that looks unlike the training views is not trusted,
   however confident), and its softmax confidence is at least ``min_confidence``;
2. *agreement along the track*: a track is labelled only if at least ``min_votes`` frames pass
   and ``min_agreement`` of them agree.

The track's label then covers every frame of the track, before the first accepted frame
(backward propagation) and after it (forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .model import Outputs

__all__ = ["GateConfig", "Calibration", "calibrate", "accepted", "vote", "propagate"]


@dataclass(frozen=True)
class GateConfig:
    min_confidence: float = 0.9
    quantile: float = 0.9  # of held-in feature distances a trusted frame stays within
    min_votes: int = 3
    min_agreement: float = 0.8


@dataclass(frozen=True)
class Calibration:
    """What the gate learned on held-in eye-level views: class means, feature scale, distance bound."""

    class_means: np.ndarray  # (classes, features)
    feature_std: np.ndarray  # (features,)
    max_distance: float

    def distance(self, outputs: Outputs) -> np.ndarray:
        """Standardised RMS distance of each feature to its predicted class's mean."""
        diff = (outputs.features - self.class_means[outputs.labels]) / self.feature_std
        return np.sqrt((diff**2).mean(axis=1))


def calibrate(train: Outputs, train_labels: np.ndarray, held_in: Outputs, config: GateConfig) -> Calibration:
    """Class means from the teacher's training crops; the distance bound from held-in crops it got right."""
    n_classes = train.probs.shape[1]
    means = np.stack([train.features[train_labels == c].mean(axis=0) for c in range(n_classes)])
    std = train.features.std(axis=0) + 1e-6
    partial = Calibration(means, std, float("inf"))
    distances = partial.distance(held_in)
    return Calibration(means, std, float(np.quantile(distances, config.quantile)))


def accepted(outputs: Outputs, calibration: Calibration, config: GateConfig) -> np.ndarray:
    """Which frames the gate trusts (bool per frame)."""
    return (outputs.confidence >= config.min_confidence) & (calibration.distance(outputs) <= calibration.max_distance)


def vote(labels: Sequence[int], trusted: Sequence[bool], config: GateConfig) -> int | None:
    """A track's label from its trusted frames' teacher labels, or None if too few or they disagree."""
    votes = [label for label, ok in zip(labels, trusted, strict=True) if ok]
    if len(votes) < config.min_votes:
        return None
    counts = np.bincount(votes)
    winner = int(counts.argmax())
    return winner if counts[winner] >= config.min_agreement * len(votes) else None


def propagate(labels: Sequence[int], trusted: Sequence[bool], config: GateConfig, *,
              backward: bool = True) -> list[int | None]:
    """Pseudo-labels for a track's frames (in time order): its voted label on every frame.

    With ``backward=False`` (an online node that cannot revisit the past), frames before the
    first trusted frame that carries the voted label stay unlabelled.
    """
    label = vote(labels, trusted, config)
    if label is None:
        return [None] * len(labels)
    if backward:
        return [label] * len(labels)
    first = next(i for i, (lab, ok) in enumerate(zip(labels, trusted, strict=True)) if ok and lab == label)
    return [None] * first + [label] * (len(labels) - first)
