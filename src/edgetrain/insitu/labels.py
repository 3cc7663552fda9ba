"""Pseudo-labels by the rule ``GateConfig.rule`` names, and the stream fit the posterior and size rules read.

:func:`label_detections` labels a clip's detections from the teacher's outputs by the gate (:mod:`.gate`), the
posterior rule (:mod:`.posterior`) or the size rule (:mod:`.sizes`); :func:`fit_stream` fits what the latter two
read (the alignment, the size model and the margin) on a longer stretch of the stream than one clip, where the
classes' mix is nearer the prior; :func:`relabel_tracks` gives a self-training round's labels from a student's
outputs. The cross-fitted round is :mod:`.crossfit`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .gate import RULES, Calibration, GateConfig, accepted, pseudo_labels
from .geometry import box_size_m, elevation_deg, track_side_views
from .model import Outputs
from .posterior import Alignment, competence_weights, fit_alignment, posterior_labels
from .sizes import (
    SizeModel,
    TrackEvidence,
    fit_size_model,
    min_margin,
    score_margins,
    size_labels,
    size_scores,
    track_evidence,
)
from .world import Camera

__all__ = ["label_detections", "relabel_tracks", "StreamFit", "fit_stream"]


def label_detections(ids: Sequence[int], outputs: Outputs, boxes: np.ndarray, calibration: Calibration,
                     camera: Camera, config: GateConfig, propagation: str, alignment: Alignment | None = None,
                     sizes: SizeModel | None = None,
                     margin: float | None = None) -> tuple[list[int | None], np.ndarray]:
    """Pseudo-labels of one clip's detections (None: not stored) and the frames the rule trusts fully.

    ``config.rule`` picks NOTE [ Object size from the mount: the size rule ] ("size": the posterior rule's track
    posteriors times ``sizes``' likelihoods, fitted on a longer stretch of the stream, else on this
    clip alone; whole tracks only; a track shorter than ``config.min_track_frames`` or whose two best scores
    differ by less than ``margin``, fitted on the same stretch, else on this clip by ``config.coverage``, is
    not labelled), NOTE [ Track posteriors: the steep camera's labelling rule ] ("posterior": trusted = full-weight
    views; ``alignment`` fitted on a longer stretch of the stream, else on this clip alone) or NOTE
    [ Estimating the teacher's competence ] ("gate": trusted = gate-accepted frames).
    """
    if config.rule not in RULES:
        raise ValueError(f"the labelling rule must be one of {', '.join(RULES)}, got {config.rule!r}")
    if config.rule == "gate":
        trusted = accepted(outputs, boxes, calibration, config)
        return pseudo_labels(ids, outputs.labels, trusted, config, propagation), trusted
    elevations = elevation_deg(boxes, camera)
    weights = competence_weights(elevations, config)
    if alignment is None:
        alignment = fit_alignment(outputs.probs, elevations, calibration.prior, config.elevation_bands)
    aligned = alignment.apply(outputs.probs, elevations)
    if config.rule == "posterior":
        labels: list[int | None] = list(posterior_labels(ids, aligned, weights, propagation))
        return labels, weights >= 1.0
    if propagation != "track":
        raise ValueError(f"the size rule labels whole tracks: use the posterior rule with propagation {propagation}")
    tracks = _size_evidence(ids, aligned * weights[:, None], boxes, camera, config)
    scores = size_scores(tracks, fit_size_model(tracks, min_frames=config.min_track_frames) if sizes is None else sizes)
    margin = min_margin(scores, tracks.frames, config.coverage) if margin is None else margin
    sure = (score_margins(scores) >= margin) & (tracks.frames >= config.min_track_frames)
    by_track = {tid: int(label) if ok else None for tid, label, ok in zip(tracks.ids, scores.argmax(axis=1), sure,
                                                                           strict=True)}
    return [by_track[int(tid)] for tid in ids], weights >= 1.0


def relabel_tracks(tracks: Sequence[int], probs: np.ndarray, log_sizes: dict[int, np.ndarray] | None = None,
                   side_views: dict[int, float] | None = None) -> dict[int, int]:
    """A self-training round's labels: each track's arg-max of the summed probabilities (n, classes) of its frames.

    With ``log_sizes`` (each track's median log box size, :func:`track_evidence`), the size rule's
    round: the summed probabilities, normalised, times the size likelihoods of a :class:`SizeModel`
    fitted to them (NOTE [ Object size from the mount: the size rule ]), given each track's side view where
    ``side_views`` has some (NOTE [ The size cue given the track's heading ]).
    """
    evidence = track_evidence(tracks, probs, np.zeros((len(tracks), 2)))
    if log_sizes is None:
        return {tid: int(label) for tid, label in zip(evidence.ids, evidence.posteriors.argmax(axis=1), strict=True)}
    evidence = replace(evidence, log_sizes=np.array([log_sizes[tid] for tid in evidence.ids]),
                       side_views=np.array([side_views[tid] for tid in evidence.ids]) if side_views else None)
    return dict(zip(evidence.ids, size_labels(evidence), strict=True))


@dataclass(frozen=True)
class StreamFit:
    """What the posterior and size rules fit on a long stretch of the stream, to label its clips or chunks."""

    alignment: Alignment
    sizes: SizeModel | None  # the size rule's
    track_log_sizes: dict[int, np.ndarray]  # each track's median log box size (the size rule's; its round reads it)
    margin: float = float("-inf")  # the size rule's: the least score margin of a labelled track (min_margin)
    # the size rule's: each track's posterior (aligned, view-weighted teacher votes, normalised; the
    # cross-fitted round reads it)
    track_posteriors: dict[int, np.ndarray] = field(default_factory=dict)
    # the size rule's with GateConfig.size_heading: each track's side view (track_side_views; NaN: no heading)
    track_side_views: dict[int, float] = field(default_factory=dict)


def fit_stream(tracks: np.ndarray, probs: np.ndarray, boxes: np.ndarray, camera: Camera, prior: np.ndarray,
               config: GateConfig) -> StreamFit:
    """The :class:`StreamFit` of detections with ``tracks`` (n,) unique over the stretch, teacher ``probs``
    (n, classes) and ``boxes`` (n, 4): the alignment to ``prior`` (NOTE [ Track posteriors: the steep camera's
    labelling rule ]) and, for the size rule, the size model of the tracks' aligned, view-weighted posteriors and
    the margin that labels ``config.coverage`` of the detections (NOTE [ Object size from the mount: the size
    rule ])."""
    elevations = elevation_deg(boxes, camera)
    alignment = fit_alignment(probs, elevations, prior, config.elevation_bands)
    if config.rule != "size" or len(probs) == 0:
        return StreamFit(alignment, None, {})
    votes = alignment.apply(probs, elevations) * competence_weights(elevations, config)[:, None]
    evidence = _size_evidence(tracks, votes, boxes, camera, config)
    sizes = fit_size_model(evidence, min_frames=config.min_track_frames)
    views = {} if evidence.side_views is None else dict(zip(evidence.ids, evidence.side_views.tolist(), strict=True))
    return StreamFit(alignment, sizes, dict(zip(evidence.ids, evidence.log_sizes, strict=True)),
                     min_margin(size_scores(evidence, sizes), evidence.frames, config.coverage),
                     dict(zip(evidence.ids, evidence.posteriors, strict=True)), views)


def _size_evidence(tracks: Sequence[int] | np.ndarray, votes: np.ndarray, boxes: np.ndarray, camera: Camera,
                   config: GateConfig) -> TrackEvidence:
    """The size rule's :class:`TrackEvidence` of detections: their ``votes`` per track, their boxes' log sizes
    and, with ``config.size_heading``, each track's side view (NOTE [ The size cue given the track's heading ])."""
    views = track_side_views(tracks, boxes, camera) if config.size_heading else None
    return track_evidence(tracks, votes, np.log(box_size_m(boxes, camera)), views)
