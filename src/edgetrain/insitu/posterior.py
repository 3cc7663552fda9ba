"""The posterior rule: each track labelled by its frames' teacher probabilities, weighted by their view and aligned
to the class prior.

NOTE [ Track posteriors: the steep camera's labelling rule ]
On the steep camera (8 m, 60° down) none of the gate's cues (NOTE [ Estimating the teacher's competence ]) tells
the teacher's confident mistakes from its right answers (``python -m benchmarks run insitu_gate`` finds no setting
of them at high precision and useful coverage: docs/results/insitu_gate.md): from above, the shared grey roofs make
the teacher call most crates and barrels "dome", with confidence. Two cues a node *can* compute help, and the rule
``GateConfig.rule = "posterior"`` (GateConfig's default: the service's rule) uses them instead of a gate:

1. *the view from the node's own mount*: the camera's elevation above a box's ground contact
   (the bottom edge's row, the camera's height, tilt and focal length;
   :func:`~edgetrain.insitu.geometry.elevation_deg`). Where the view is shallow (near the top of the image)
   the teacher is right more often, so each frame's vote is weighted by :func:`competence_weights`: 1 up to
   ``full_weight_below_deg``, falling linearly to ``floor_weight`` at ``no_weight_above_deg``.
2. *the class prior*: the node assumes its objects come in the proportions of the teacher's
   training data (no label shift; :attr:`~edgetrain.insitu.gate.Calibration.class_prior`). Within each band of
   elevation (``elevation_bands`` quantile bands of the stream's own boxes) the teacher's
   probabilities are reweighted per class until their mean matches that prior
   (:func:`fit_alignment`: distribution alignment, fitted over the whole stream), which undoes a band's bias toward
   "dome" without knowing which crops are wrong.

Each track's label is the arg-max of its frames' weighted, aligned probabilities
(:func:`posterior_labels`), and every track is labelled: the student learns more from every
track, at a lower label precision, than from the few the gate trusts at a higher one (docs/guide/insitu.md). A
self-training round (:func:`~edgetrain.insitu.labels.relabel_tracks`) then lets the student, once trained on
those labels, vote again on each stored track with its own probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .gate import PROPAGATION, GateConfig
from .tracker import track_rows

__all__ = ["competence_weights", "Alignment", "fit_alignment", "posterior_labels"]


def competence_weights(elevations_deg: np.ndarray, config: GateConfig) -> np.ndarray:
    """A frame's vote weight by its view: 1 up to ``full_weight_below_deg``, linear down to ``floor_weight``."""
    span = config.no_weight_above_deg - config.full_weight_below_deg
    return np.clip((config.no_weight_above_deg - elevations_deg) / span, config.floor_weight, 1.0)


@dataclass(frozen=True)
class Alignment:
    """Per-class weights for each band of elevation that bring a stream's mean teacher probabilities to the prior."""

    edges_deg: np.ndarray  # (bands + 1,): quantiles of the fitted stream's elevations
    weights: np.ndarray  # (bands, classes)

    def apply(self, probs: np.ndarray, elevations_deg: np.ndarray) -> np.ndarray:
        """``probs`` (n, classes) reweighted by their band's weights and renormalised."""
        bands = len(self.weights)
        band = np.clip(np.searchsorted(self.edges_deg, elevations_deg, side="right") - 1, 0, bands - 1)
        aligned = probs * self.weights[band]
        return aligned / np.maximum(aligned.sum(axis=1, keepdims=True), 1e-12)


def fit_alignment(probs: np.ndarray, elevations_deg: np.ndarray, prior: np.ndarray, bands: int,
                  iterations: int = 50) -> Alignment:
    """The :class:`Alignment` of ``probs`` (n, classes): each band's mean reweighted to ``prior``.

    Bands are quantiles of ``elevations_deg`` (equal counts). The weights are found by damped
    fixed-point steps (w *= sqrt(prior / mean of the reweighted rows)). Fit it on a long stretch of
    the stream: over a few tracks the classes' true mix is far from the prior.
    """
    n_classes = probs.shape[1]
    if len(probs) == 0:
        return Alignment(np.zeros(2), np.ones((1, n_classes)))
    edges = np.quantile(elevations_deg, np.linspace(0.0, 1.0, bands + 1))
    band = np.clip(np.searchsorted(edges, elevations_deg, side="right") - 1, 0, bands - 1)
    weights = np.ones((bands, n_classes))
    for b in range(bands):
        rows = probs[band == b]
        for _ in range(iterations if len(rows) else 0):
            q = rows * weights[b]
            q /= np.maximum(q.sum(axis=1, keepdims=True), 1e-12)
            weights[b] *= np.sqrt(prior / np.maximum(q.mean(axis=0), 1e-12))
    return Alignment(edges, weights)


def posterior_labels(ids: Sequence[int], probs: np.ndarray, weights: np.ndarray, propagation: str) -> list[int]:
    """Each detection's label: the arg-max of its track's weighted probabilities (n, classes).

    "track": over the whole track; "forward": over the track's frames up to this one (an online
    node); "none": the frame's own probabilities (no tracker).
    """
    if propagation not in PROPAGATION:
        raise ValueError(f"propagation must be one of {', '.join(PROPAGATION)}, got {propagation!r}")
    weighted = probs * weights[:, None]
    if propagation == "none":
        return [int(label) for label in weighted.argmax(axis=1)]
    labels = [0] * len(ids)
    for members in track_rows(ids).values():
        votes = weighted[members]
        votes = votes.cumsum(axis=0) if propagation == "forward" else np.broadcast_to(votes.sum(axis=0), votes.shape)
        for i, label in zip(members, votes.argmax(axis=1), strict=True):
            labels[i] = int(label)
    return labels
