"""The competence gate: which of the teacher's frames to trust and a track's vote; every labelling rule's settings.

:class:`GateConfig` holds the settings of all the rules in :data:`RULES` (the gate's here, the posterior rule's of
:mod:`.posterior`, the size rule's of :mod:`.sizes`), so the other rules' modules build on this one;
:func:`~edgetrain.insitu.labels.label_detections` applies the rule it names.

NOTE [ Estimating the teacher's competence ]
Voting the teacher's *confident* labels along a track is not enough: far from its training
views the teacher is confidently wrong. The node cannot read the true viewpoint, so the gate
estimates competence from what it has:

1. *calibration on held-in views*: on eye-level crops the teacher never trained on, the
   distance of each crop's feature to its predicted class's mean (per-dimension standardised)
   is measured; the gate accepts a frame only if its distance is within the ``quantile`` of
   those held-in distances (a frame that looks unlike the training views is not trusted,
   however confident), and its softmax confidence is at least ``min_confidence``;
2. *apparent shape*: the detection box's aspect (height / width) must lie inside the central
   ``aspect_quantiles`` of the boxes of the predicted class in the teacher's training data. Seen
   from above, a barrel's box is not the tall box the teacher learned barrels by, so a confident
   "dome" there is not trusted (what the cue gains: docs/guide/insitu.md);
3. *agreement along the track*: a track is labelled only if at least ``min_votes`` frames pass
   and ``min_agreement`` of them agree.

The track's label then covers every frame of the track, before the first accepted frame
(backward propagation) and after it (forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .model import Outputs
from .tracker import track_rows

__all__ = ["GateConfig", "Calibration", "log_aspect", "calibrate", "accepted", "vote", "propagate", "pseudo_labels",
           "PROPAGATION", "RULES"]

PROPAGATION = ("track", "forward", "none")
# NOTE [ Object size from the mount: the size rule ]; NOTE [ Track posteriors: the steep camera's labelling rule ];
# NOTE [ Estimating the teacher's competence ]
RULES = ("size", "posterior", "gate")


@dataclass(frozen=True)
class GateConfig:
    rule: str = "posterior"  # one of RULES (simulate's default is "size"; the service's "posterior")
    elevation_bands: int = 3  # posterior rule: quantile bands of elevation aligned to the class prior separately
    full_weight_below_deg: float = 40.0  # posterior rule: a frame's vote weighs 1 up to this elevation ...
    no_weight_above_deg: float = 60.0  # ... falling linearly to floor_weight here
    floor_weight: float = 0.05
    min_confidence: float = 0.85
    quantile: float = 0.9  # of held-in feature distances a trusted frame stays within
    aspect_quantiles: tuple[float, float] = (0.2, 0.8)  # of the training boxes' aspects, per class
    min_votes: int = 3
    min_agreement: float = 0.8
    coverage: float = 1.0  # size rule: the share of the stream's detections labelled, surest tracks first
    min_track_frames: int = 3  # size rule: shorter tracks are neither fitted nor labelled (mostly false boxes)
    size_heading: bool = True  # size rule: a moving track's size is judged given its heading (NOTE [ The size cue
    # given the track's heading ])


@dataclass(frozen=True)
class Calibration:
    """What the gate learned from the teacher's data: class means, feature scale, distance and aspect bounds."""

    class_means: np.ndarray  # (classes, features)
    feature_std: np.ndarray  # (features,)
    max_distance: float
    aspect_bounds: np.ndarray  # (classes, 2): low and high log(height / width) of trusted boxes
    class_prior: np.ndarray | None = None  # (classes,): the training labels' frequencies (None: uniform)

    @property
    def prior(self) -> np.ndarray:
        """The class frequencies the node assumes in its stream: ``class_prior``, else uniform."""
        n_classes = len(self.class_means)
        return np.full(n_classes, 1.0 / n_classes) if self.class_prior is None else self.class_prior

    def distance(self, outputs: Outputs) -> np.ndarray:
        """Standardised RMS distance of each feature to its predicted class's mean."""
        diff = (outputs.features - self.class_means[outputs.labels]) / self.feature_std
        return np.sqrt((diff**2).mean(axis=1))


def log_aspect(boxes: np.ndarray) -> np.ndarray:
    """log(height / width) of boxes (n, 4) given as x0, y0, x1, y1."""
    boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
    return np.log((boxes[:, 3] - boxes[:, 1]) / (boxes[:, 2] - boxes[:, 0]))


def calibrate(train: Outputs, train_labels: np.ndarray, train_boxes: np.ndarray, held_in: Outputs,
              config: GateConfig) -> Calibration:
    """Class means and box aspects from the teacher's training crops; the distance bound from held-in crops."""
    n_classes = train.probs.shape[1]
    means = np.stack([train.features[train_labels == c].mean(axis=0) for c in range(n_classes)])
    std = train.features.std(axis=0) + 1e-6
    aspects = log_aspect(train_boxes)
    bounds = np.stack([np.quantile(aspects[train_labels == c], config.aspect_quantiles) for c in range(n_classes)])
    distances = Calibration(means, std, float("inf"), bounds).distance(held_in)
    prior = np.bincount(train_labels, minlength=n_classes) / len(train_labels)
    return Calibration(means, std, float(np.quantile(distances, config.quantile)), bounds, prior)


def accepted(outputs: Outputs, boxes: np.ndarray, calibration: Calibration, config: GateConfig) -> np.ndarray:
    """Which frames the gate trusts (bool per frame), from the teacher's outputs and the detection boxes."""
    aspect = log_aspect(boxes)
    low, high = calibration.aspect_bounds[outputs.labels, 0], calibration.aspect_bounds[outputs.labels, 1]
    return ((outputs.confidence >= config.min_confidence) & (calibration.distance(outputs) <= calibration.max_distance)
            & (aspect >= low) & (aspect <= high))


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


def pseudo_labels(ids: Sequence[int], teacher_labels: np.ndarray, trusted: np.ndarray, config: GateConfig,
                  propagation: str) -> list[int | None]:
    """Each detection's pseudo-label (None: not stored); ``ids`` are track ids of detections in frame order.

    ``propagation`` is one of :data:`PROPAGATION`: "track" (backward and forward along the
    track), "forward" (from the first trusted frame on) or "none" (the trusted frames alone:
    the ablation without a tracker).
    """
    if propagation not in PROPAGATION:
        raise ValueError(f"propagation must be one of {', '.join(PROPAGATION)}, got {propagation!r}")
    if propagation == "none":
        return [int(label) if ok else None for label, ok in zip(teacher_labels, trusted, strict=True)]
    pseudo: list[int | None] = [None] * len(ids)
    for members in track_rows(ids).values():
        labels = propagate([int(teacher_labels[i]) for i in members], [bool(trusted[i]) for i in members],
                           config, backward=propagation == "track")
        for i, label in zip(members, labels, strict=True):
            pseudo[i] = label
    return pseudo
