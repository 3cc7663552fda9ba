"""From teacher outputs to pseudo-labels: a competence gate that reads no ground truth, and track propagation.

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
   "dome" there is not trusted. (Without this cue, seed 0's pseudo-labels were 92% correct at
   69% coverage; with it 99% at 73%: docs/guide/insitu.md.)
3. *agreement along the track*: a track is labelled only if at least ``min_votes`` frames pass
   and ``min_agreement`` of them agree.

The track's label then covers every frame of the track, before the first accepted frame
(backward propagation) and after it (forward).

NOTE [ Track posteriors: the steep camera's labelling rule ]
On the steep camera (8 m, 60° down) none of the cues above tells the teacher's confident
mistakes from its right answers (benchmarks/insitu_gate.py: no setting of them reaches 95%
precision above 5% coverage): from above, the shared grey roofs make the teacher call most
crates and barrels "dome", with confidence. Two cues a node *can* compute help, and the rule
``GateConfig.rule = "posterior"`` (GateConfig's default: the service's rule) uses them instead of a gate:

1. *the view from the node's own mount*: the camera's elevation above a box's ground contact
   (the bottom edge's row, the camera's height, tilt and focal length; :func:`elevation_deg`).
   Where the view is shallow (near the top of the image) the teacher is right more often, so
   each frame's vote is weighted by :func:`competence_weights`: 1 up to
   ``full_weight_below_deg``, falling linearly to ``floor_weight`` at ``no_weight_above_deg``.
2. *the class prior*: the node assumes its objects come in the proportions of the teacher's
   training data (no label shift; :attr:`Calibration.class_prior`). Within each band of
   elevation (``elevation_bands`` quantile bands of the stream's own boxes) the teacher's
   probabilities are reweighted per class until their mean matches that prior
   (:func:`fit_alignment`: distribution alignment, fitted over the whole stream), which undoes a band's bias toward
   "dome" without knowing which crops are wrong.

Each track's label is the arg-max of its frames' weighted, aligned probabilities
(:func:`posterior_labels`), and every track is labelled: the student learns more from every
track at ~75% precision than from 40% of them at ~90% (docs/guide/insitu.md). A self-training round
(:func:`relabel_tracks`) then lets the student, once trained on those labels, vote again on each
stored track with its own probabilities.

NOTE [ Object size from the mount: the size rule ]
The steep camera's worst confusions (crates and barrels called "dome", docs/guide/insitu.md) are between
objects of different physical size, and the node can measure size without the teacher: the ground
contact's depth follows from the mount (as its elevation does), so a box's width and height in
pixels become metres at that depth (:func:`box_size_m`; the height mixes the object's height and
footprint seen from above, which is fine: it is compared only with other boxes of this camera). No
size is known per class in advance, so the rule ``GateConfig.rule = "size"`` learns one from the
stream (:func:`fit_size_model`): each track's posterior from the posterior rule (normalised) is a
soft class assignment; a Gaussian of log width and log height per class is fitted to the tracks'
median log sizes under those weights, each track weighing its number of detections and tracks of
fewer than 3 left out of the fit (with ``--false-positives 0.5`` most tracks are one false box
long: unweighted, they drew the Gaussians to random sizes, and label precision fell to 0.36); each
track's assignment becomes its posterior times the classes' size likelihoods, and the fit repeats
(EM with the teacher's posterior as a fixed prior per track, 20 rounds). A track's label is the
arg-max of posterior times size likelihood (:func:`size_labels`): size overrules the teacher on a
track only where the track's size is far likelier under another class than the teacher's posterior
is sure. The self-training round combines the student's track probabilities with the same cue
(:func:`relabel_tracks` with ``log_sizes``). Tracks only: a frame's size is noisy (occlusion, the
frame's edge), a track's median much less.

With ``GateConfig.coverage`` below 1 the rule labels only the tracks it is surest of: tracks ranked
by the margin of their two best scores (log posterior plus log size likelihood), the surest holding
``coverage`` of the stream's detections are labelled and the rest are not stored (:func:`min_margin`).
Tracks of fewer than ``GateConfig.min_track_frames`` detections are not labelled either: with
``--false-positives 0.5`` a fifth of the detections are false boxes, nearly all in one-box tracks, and
labelling them cost 15 points of label precision (seed 0: 0.66 against 0.81); without false
positives such tracks hold 0.2% of the detections.

NOTE [ Cross-fitted self-training ]
The self-training round's student votes on the very crops it was trained on, so its track votes
mostly echo the labels it was given, wrong ones included (docs/guide/insitu.md). The
cross-fitted round (``insitu simulate --round-folds K``) deals the stored tracks into K folds
(:func:`fold_of_tracks`: whole tracks, so a student never sees any crop of a track it votes on)
and trains one student per fold on the other folds' tracks; each votes on its fold's crops. Three
cues that err for different reasons then meet per track (:func:`cross_fitted_scores`): the
students' summed votes (appearance from the node's own viewpoint, learnt from other tracks), the
teacher's view-weighted, aligned posterior (appearance from eye level) and the track's size under
the stream's size model (geometry from the mount); their product, normalised, is the track's
posterior, its arg-max the new label. Tracks ranked by the difference of their two best posteriors
give the confidence (:func:`cross_fitted_labels`: the surest holding ``coverage`` of the detections
keep their labels, the rest leave the store when ``coverage`` < 1).

The size likelihoods get a floor here (:data:`SIZE_OUTLIER_LOG_DENSITY`: a uniform outlier density of
e^-4 per log metre squared added under every class): a fragment at the frame's edge can have a box unlike
every class, and far out in the Gaussians' tails the likelier class wins by orders of magnitude, so without
the floor such tracks were among the surest (seed 0: three pyramid fragments of 3-8 detections whose best
class's log-likelihood was -6 to -13, labelled "barrel" at margin 1.0). Under the floor a size unlike
every class has no say, and the students and the teacher decide. A second round (simulate's default
``rounds=2``) trains new fold students on the first round's labels of its surest tracks only (holding
``coverage`` of the detections); they vote on every track, and only the last round removes the least sure
tracks from the store.

NOTE [ Votes agreed over several fold orders ]
One deal of the tracks into folds is one draw: which tracks a fold student learns from, and the order
its batches come in, move its votes, and on seed 3 the fold students' seed alone moved the last
round's kept labels from 0.966 to 0.910 correct (docs/guide/insitu.md). Repeated cross-fitting
(``insitu simulate --round-repeats M``, :func:`repeated_cross_fit`) deals the tracks M times (the first
deal in order of first appearance, as a single deal is; each later one in a random order of its own), trains each
deal's fold students with their own seed, and gives each detection the mean of the M votes it got, each
from a student that never saw its track; the round's cues then meet as with one deal. The students train one
after the other (each within the planned step memory); the round costs M times its fold students.

NOTE [ The size cue given the track's heading ]
A box's width depends on which side of the object the camera sees: a crate (2 m x 1 m footprint) is ~2 m
wide seen side-on and ~1 m end-on, so one Gaussian of log size per class (NOTE [ Object size from the
mount: the size rule ]) is wide for crates and puts end-on crates near pyramids (seed 7: every cue called them
pyramids; docs/guide/insitu.md). The generator moves every object along its long axis on a straight path, and
the node sees that path without ground truth: each box's foot point (bottom centre) maps to the ground
through the mount (:func:`ground_point_m`), and the principal axis of a track's foot points is its heading
(:func:`heading_rad`, modulo 180°: a footprint looks the same from the front and the back). A box's width
in pixels measures the footprint along the ground direction that moves the image's x the most ((1, -a cos
tilt) for a box centred a focal lengths off the image's centre), so per box |cos| of the angle between
the heading and that direction is 1 side-on and 0 end-on, and the track's *side view* is its median
(:func:`track_side_views`). With ``GateConfig.size_heading`` the size model's mean is linear in it per
class (:class:`HeadingSizes`: the log size end-on and side-on, fitted by weighted least squares in the
same EM: for a crate, exp of the side-on log width is its length and the end-on one its width); |cos|
rather than cos 2θ, because near end-on a box's width grows with the angle itself (cos 2θ is flat there).
Tracks whose foot points travel less than :data:`MIN_HEADING_TRAVEL_M` (no heading) keep the plain
Gaussian, fitted on every track.

NOTE [ A slope only where the tracks show one ]
A class's slope (its side-on minus end-on log size) is fitted from whichever of its tracks are seen
side-on, and on seed 5 the round classes (barrel, dome) had two each: their slopes, fitted to two tracks'
noise, made barrels look like domes (labels 0.939 -> 0.879; docs/guide/insitu.md). A ridge or a pull of every
slope towards 0 fixed seed 5 but undid seeds 3 and 7, whose crates need theirs. So each class keeps its
slope only where the data earn it (:func:`_slope_lowers_bic`): the Gaussian log likelihood gain of the
line over one size at every view must exceed BIC's penalty, half a log of the sample size per slope.
The sample size is the class's effective number of tracks (Kish's (sum w)^2 / sum w^2 of its weights:
a track weighs its detections, but its detections share one median size), and the residual covariances
are unbiased in it, so two tracks never carry a slope and a handful seen side-on carry one only if they
sit well off the end-on size. A class that fails has one size at every view (the plain Gaussian of its
tracks with a heading).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .model import Outputs
from .world import Camera

__all__ = ["GateConfig", "Calibration", "log_aspect", "calibrate", "accepted", "vote", "propagate", "pseudo_labels",
           "PROPAGATION", "RULES", "elevation_deg", "competence_weights", "Alignment", "fit_alignment",
           "posterior_labels", "label_detections", "relabel_tracks", "box_size_m", "SizeModel", "fit_size_model",
           "TrackEvidence", "track_evidence", "size_scores", "size_labels", "min_margin", "StreamFit",
           "fit_stream", "fold_of_tracks", "HeldOutVote", "repeated_cross_fit", "cross_fitted_scores",
           "cross_fitted_labels", "score_margins", "ground_point_m", "heading_rad", "track_side_views",
           "HeadingSizes", "SIZE_OUTLIER_LOG_DENSITY", "MIN_HEADING_TRAVEL_M"]

PROPAGATION = ("track", "forward", "none")
# NOTE [ Object size from the mount: the size rule ]; NOTE [ Track posteriors: the steep camera's labelling rule ];
# NOTE [ Estimating the teacher's competence ]
RULES = ("size", "posterior", "gate")
# The cross-fitted round's floor under the size likelihoods (NOTE [ Cross-fitted self-training ]).
SIZE_OUTLIER_LOG_DENSITY = -4.0


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


def _members(ids: Sequence[int] | np.ndarray) -> dict[int, list[int]]:
    """Each track's rows in ``ids``, tracks in order of first appearance."""
    members: dict[int, list[int]] = {}
    for i, tid in enumerate(ids):
        members.setdefault(int(tid), []).append(i)
    return members


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
    for members in _members(ids).values():
        labels = propagate([int(teacher_labels[i]) for i in members], [bool(trusted[i]) for i in members],
                           config, backward=propagation == "track")
        for i, label in zip(members, labels, strict=True):
            pseudo[i] = label
    return pseudo


def elevation_deg(boxes: np.ndarray, camera: Camera) -> np.ndarray:
    """The camera's elevation (degrees) above each box's ground contact, from the node's mount alone.

    The contact is the box's bottom row; the ray through it leaves the camera ``tilt_deg`` plus
    atan(row offset / focal length) below the horizon, and that is the elevation of the camera
    seen from the contact point.
    """
    rows = np.asarray(boxes, dtype=float).reshape(-1, 4)[:, 3]
    return camera.tilt_deg + np.degrees(np.arctan((rows - camera.height_px / 2) / camera.focal_px))


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
    for members in _members(ids).values():
        votes = weighted[members]
        votes = votes.cumsum(axis=0) if propagation == "forward" else np.broadcast_to(votes.sum(axis=0), votes.shape)
        for i, label in zip(members, votes.argmax(axis=1), strict=True):
            labels[i] = int(label)
    return labels


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


def box_size_m(boxes: np.ndarray, camera: Camera) -> np.ndarray:
    """Each box's width and height (n, 2) in metres at the depth of its ground contact, from the mount alone.

    The ray through the bottom row leaves the camera at :func:`elevation_deg` below the horizon (at
    least 1°) and meets the ground ``height_m / sin`` of it away; its depth along the optical axis
    scales pixels to metres (pinhole: metres = pixels x depth / focal length).
    """
    boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
    below_rad = np.radians(np.maximum(elevation_deg(boxes, camera), 1.0))
    depth_m = camera.height_m / np.sin(below_rad) * np.cos(below_rad - np.radians(camera.tilt_deg))
    return (boxes[:, 2:] - boxes[:, :2]) * (depth_m / camera.focal_px)[:, None]


# A track whose foot points travel less than this along their principal axis has no heading (NOTE [ The size cue
# given the track's heading ]): walking pace is 0.18-0.35 m per frame, and a foot point jitters by ~0.1 m.
MIN_HEADING_TRAVEL_M = 1.0


def ground_point_m(boxes: np.ndarray, camera: Camera) -> np.ndarray:
    """Each box's foot point (its bottom row's centre) on the ground (n, 2): metres right of and ahead of the mount.

    The pixel's ray (forward + right x a - up x r, a and r its offsets from the image's centre in focal
    lengths) meets the ground ``height_m`` below the camera; rays less than 1° below the horizon are taken
    at 1° (as :func:`box_size_m` does).
    """
    boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
    across = ((boxes[:, 0] + boxes[:, 2]) / 2 - camera.width_px / 2) / camera.focal_px
    down = (boxes[:, 3] - camera.height_px / 2) / camera.focal_px
    tilt = np.radians(camera.tilt_deg)
    drop = np.maximum(np.sin(tilt) + down * np.cos(tilt), np.sqrt(1 + down**2) * np.sin(np.radians(1.0)))
    reach = camera.height_m / drop
    return np.stack([across * reach, (np.cos(tilt) - down * np.sin(tilt)) * reach], axis=1)


def heading_rad(points: np.ndarray) -> tuple[float, float]:
    """The heading of a track's ground points (k, 2), in [0, pi), and how far they travel along it (metres).

    The heading is the points' principal axis (the line they scatter least about), so the order of the
    points does not matter and a heading and its reverse are one (NOTE [ The size cue given the track's
    heading ]).
    """
    centred = points - points.mean(axis=0)
    axis = np.linalg.svd(centred, full_matrices=False)[2][0]
    along = centred @ axis
    return float(np.arctan2(axis[1], axis[0]) % np.pi), float(along.max() - along.min())


def track_side_views(ids: Sequence[int] | np.ndarray, boxes: np.ndarray, camera: Camera,
                     min_travel_m: float = MIN_HEADING_TRAVEL_M) -> np.ndarray:
    """Each track's side view (m,), in order of first appearance: 1 seen side-on, 0 end-on, NaN without a heading.

    Per box, |cos| of the angle between the track's heading (:func:`heading_rad` of its foot points) and
    the ground direction its box width measures ((1, -a cos tilt), a: the box's centre off the image's
    centre in focal lengths); the track's is the median over its boxes. Tracks whose foot points travel
    less than ``min_travel_m`` have none (NaN).
    """
    boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
    feet = ground_point_m(boxes, camera)
    across = ((boxes[:, 0] + boxes[:, 2]) / 2 - camera.width_px / 2) / camera.focal_px
    measured = np.arctan2(-across * np.cos(np.radians(camera.tilt_deg)), 1.0)
    views = []
    for rows in _members(ids).values():
        heading, travel = heading_rad(feet[rows])
        views.append(float(np.median(np.abs(np.cos(heading - measured[rows])))) if travel >= min_travel_m
                     else float("nan"))
    return np.array(views)


@dataclass(frozen=True)
class TrackEvidence:
    """Per track (in order of first appearance), what the size rule reads."""

    ids: list[int]
    posteriors: np.ndarray  # (m, classes): the summed votes of its frames, normalised
    log_sizes: np.ndarray  # (m, 2): the median of its frames' log box sizes
    frames: np.ndarray  # (m,): its number of detections
    side_views: np.ndarray | None = None  # (m,): track_side_views (NaN: no heading); None: the size cue ignores it


def track_evidence(ids: Sequence[int] | np.ndarray, votes: np.ndarray, log_sizes: np.ndarray,
                   side_views: np.ndarray | None = None) -> TrackEvidence:
    """The :class:`TrackEvidence` of detections: track ``ids`` (n,), ``votes`` (n, classes), ``log_sizes`` (n, 2),
    and each track's ``side_views`` (m,: :func:`track_side_views` of the same ``ids``; None: none)."""
    members = _members(ids)
    sums = np.stack([votes[rows].sum(axis=0) for rows in members.values()])
    return TrackEvidence(list(members), sums / np.maximum(sums.sum(axis=1, keepdims=True), 1e-12),
                         np.stack([np.median(log_sizes[rows], axis=0) for rows in members.values()]),
                         np.array([len(rows) for rows in members.values()], dtype=float), side_views)


@dataclass(frozen=True)
class HeadingSizes:
    """Per class, a Gaussian of a track's log box size about a mean linear in its side view s (NOTE [ The size cue
    given the track's heading ]): ``end_on`` at s = 0, ``side_on`` at s = 1."""

    end_on: np.ndarray  # (classes, 2)
    side_on: np.ndarray  # (classes, 2)
    covariances: np.ndarray  # (classes, 2, 2): of the log sizes about that mean

    def means(self, side_views: np.ndarray) -> np.ndarray:
        """The mean log size (m, classes, 2) of each class at each of ``side_views`` (m,)."""
        s = side_views[:, None, None]
        return (1 - s) * self.end_on[None] + s * self.side_on[None]


@dataclass(frozen=True)
class SizeModel:
    """Per class, a Gaussian of a track's log box size (log metres of width and height: :func:`box_size_m`)."""

    means: np.ndarray  # (classes, 2)
    covariances: np.ndarray  # (classes, 2, 2)
    # a uniform outlier density added under every class (per log metre squared; -inf: none): NOTE [ Cross-fitted
    # self-training ]
    outlier_log_density: float = float("-inf")
    heading: HeadingSizes | None = None  # the sizes given the side view, for the tracks that have one (else the above)

    def log_likelihood(self, log_sizes: np.ndarray, side_views: np.ndarray | None = None) -> np.ndarray:
        """log (N(log_sizes | class) + exp(outlier_log_density)) for each row of ``log_sizes`` (m, 2) and class.

        With ``side_views`` (m,) and a ``heading`` model, a row with a finite side view is judged by ``heading``.
        """
        gaussian = _log_gaussian(log_sizes[:, None, :] - self.means[None], self.covariances)
        if self.heading is not None and side_views is not None:
            known = np.isfinite(side_views)
            given = _log_gaussian(log_sizes[:, None, :] - self.heading.means(np.where(known, side_views, 0.0)),
                                  self.heading.covariances)
            gaussian = np.where(known[:, None], given, gaussian)
        return np.logaddexp(gaussian, self.outlier_log_density)


def _log_gaussian(diff: np.ndarray, covariances: np.ndarray) -> np.ndarray:
    """log N(diff | 0, covariance of its class) (m, classes) of ``diff`` (m, classes, 2)."""
    mahalanobis = np.einsum("mci,cij,mcj->mc", diff, np.linalg.inv(covariances), diff)
    return -0.5 * (mahalanobis + np.log(np.linalg.det(covariances)) + diff.shape[2] * np.log(2 * np.pi))


def fit_size_model(tracks: TrackEvidence, iterations: int = 20, ridge: float = 1e-3,
                   min_frames: int = 3) -> SizeModel:
    """The :class:`SizeModel` of ``tracks``, by EM.

    Each round fits every class's weighted mean and covariance (plus ``ridge`` on the diagonal) under
    the tracks' current assignments, each track weighing its number of detections (with the tracks'
    side views, also every class's :class:`HeadingSizes` on the tracks that have one), then sets each
    assignment to the track's posterior times the classes' likelihoods of its size (NOTE [ Object
    size from the mount: the size rule ]; NOTE [ The size cue given the track's heading ]). Tracks of fewer than
    ``min_frames`` detections (mostly false positives and fragments, whose median size is noisy) are
    labelled but not fitted, unless no track is longer.
    """
    posteriors, log_sizes = tracks.posteriors, tracks.log_sizes
    fitted = tracks.frames * (tracks.frames >= min_frames) if (tracks.frames >= min_frames).any() else tracks.frames
    assignment = posteriors
    model = SizeModel(np.zeros((posteriors.shape[1], 2)), np.tile(np.eye(2), (posteriors.shape[1], 1, 1)))
    for _ in range(iterations):
        model = _weighted_gaussians(assignment * fitted[:, None], log_sizes, ridge)
        if tracks.side_views is not None and np.isfinite(tracks.side_views).any():
            model = replace(model, heading=_heading_sizes(assignment * fitted[:, None], log_sizes, tracks.side_views,
                                                          ridge))
        joint = np.log(np.maximum(posteriors, 1e-12)) + model.log_likelihood(log_sizes, tracks.side_views)
        assignment = np.exp(joint - joint.max(axis=1, keepdims=True))
        assignment /= assignment.sum(axis=1, keepdims=True)
    return model


def _weighted_gaussians(weights: np.ndarray, points: np.ndarray, ridge: float) -> SizeModel:
    """One Gaussian of ``points`` (m, d) per column of ``weights`` (m, classes).

    The covariance is the unbiased one for reliability weights (``np.cov(..., aweights=w)``): a class
    that few tracks lean to gets a wider Gaussian, not a falsely sharp one.
    """
    means, covariances = [], []
    for w in weights.T + 1e-6:  # no class without weight
        mean = w @ points / w.sum()
        diff = points - mean
        scatter = (w[:, None] * diff).T @ diff
        dof = max(w.sum() - (w**2).sum() / w.sum(), 1e-12)  # 0 for one track alone
        covariances.append(scatter / dof + ridge * np.eye(points.shape[1]))
        means.append(mean)
    return SizeModel(np.array(means), np.array(covariances))


def _heading_sizes(weights: np.ndarray, points: np.ndarray, side_views: np.ndarray, ridge: float) -> HeadingSizes:
    """Per column of ``weights`` (m, classes), the weighted least-squares line of ``points`` (m, d) in
    ``side_views`` (m,), on the rows with a finite side view.

    The covariance is of the residuals, with the reliability weights' degrees of freedom less one for the
    slope (as :func:`_weighted_gaussians`, plus ``ridge`` on the diagonal). A class whose slope does not
    lower its BIC (:func:`_slope_lowers_bic`) gets a flat line: its weighted mean at every view.
    """
    known = np.isfinite(side_views)
    s, y = side_views[known], points[known]
    design = np.stack([1 - s, s], axis=1)  # the coefficients are the end-on and side-on log sizes
    end_on, side_on, covariances = [], [], []
    for w in weights[known].T + 1e-6:  # no class without weight
        root = np.sqrt(w)[:, None]
        coefficients = np.linalg.lstsq(design * root, y * root, rcond=None)[0]
        residual = y - design @ coefficients
        dof = w.sum() - (w**2).sum() / w.sum()
        mean = w @ y / w.sum()
        # one size at every view (NOTE [ A slope only where the tracks show one ])
        if not _slope_lowers_bic(w, y - mean, residual, ridge):
            coefficients, residual, dof = np.stack([mean, mean]), y - mean, dof + 1
        covariances.append((w[:, None] * residual).T @ residual / max(dof - 1, 1e-12) + ridge * np.eye(y.shape[1]))
        end_on.append(coefficients[0])
        side_on.append(coefficients[1])
    return HeadingSizes(np.array(end_on), np.array(side_on), np.array(covariances))


def _slope_lowers_bic(weights: np.ndarray, flat_residual: np.ndarray, line_residual: np.ndarray, ridge: float) -> bool:
    """Whether a class's size line in the side view earns its slope: its Gaussian log likelihood gain over one size at
    every view exceeds BIC's penalty, half a log of the sample size per slope (NOTE [ A slope only where the tracks
    show one ]).

    Rows are tracks weighing their detections, so the sample size is the weights' effective number of tracks
    ``(sum w)^2 / sum w^2`` (Kish); the residual covariances are unbiased in it (n - 1 flat, n - 2 the line, plus
    ``ridge``), so a class with two tracks or fewer has no slope.
    """
    tracks = weights.sum() ** 2 / (weights**2).sum()
    if tracks <= 2:
        return False

    def log_det_covariance(residual: np.ndarray, dof: float) -> float:
        scatter = (weights[:, None] * residual).T @ residual / weights.sum() * tracks / dof
        return float(np.linalg.slogdet(scatter + ridge * np.eye(residual.shape[1]))[1])

    gain = 0.5 * tracks * (log_det_covariance(flat_residual, tracks - 1)
                           - log_det_covariance(line_residual, tracks - 2))
    return bool(gain > 0.5 * flat_residual.shape[1] * np.log(tracks))


def size_scores(tracks: TrackEvidence, model: SizeModel | None = None) -> np.ndarray:
    """Each track's log posterior plus the log size likelihood of its median log size, per class (m, classes).

    ``model`` fitted on these tracks (:func:`fit_size_model`) when None.
    """
    model = fit_size_model(tracks) if model is None else model
    return np.log(np.maximum(tracks.posteriors, 1e-12)) + model.log_likelihood(tracks.log_sizes, tracks.side_views)


def size_labels(tracks: TrackEvidence, model: SizeModel | None = None) -> list[int]:
    """Each track's label: the arg-max of :func:`size_scores`."""
    return [int(label) for label in size_scores(tracks, model).argmax(axis=1)]


def score_margins(scores: np.ndarray) -> np.ndarray:
    """Each row's best score minus its second best (m,)."""
    top = np.sort(scores, axis=1)
    return top[:, -1] - top[:, -2]


def min_margin(scores: np.ndarray, frames: np.ndarray, coverage: float) -> float:
    """The smallest score margin a labelled track needs so that the surest tracks hold ``coverage`` of the detections.

    Tracks (rows of ``scores``, with ``frames`` detections each) are ranked by the margin of their two
    best scores; the labelled ones are the fewest surest that hold at least ``coverage`` of the detections
    (ties at the threshold labelled too). ``coverage`` 1 labels every track (-inf).
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"the labelled share of detections must be in (0, 1], got {coverage}")
    if coverage >= 1.0 or len(scores) == 0:
        return float("-inf")
    margins = score_margins(scores)
    order = np.argsort(-margins, kind="stable")
    held = np.cumsum(frames[order]) / frames.sum()
    return float(margins[order[int(np.searchsorted(held, coverage - 1e-12))]])


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


def fold_of_tracks(tracks: Sequence[int], folds: int, shuffle_seed: int | None = None) -> np.ndarray:
    """Each detection's fold (n,) for ``tracks`` (n,): tracks dealt round-robin in order of first appearance.

    A track lies in one fold whole, so a student trained on the other folds has seen none of its crops.
    ``shuffle_seed``: the tracks are dealt in a random order drawn from it instead (another deal).
    """
    if folds < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {folds}")
    order: dict[int, int] = {}
    for tid in tracks:
        order.setdefault(int(tid), len(order))
    if shuffle_seed is not None:
        places = np.random.default_rng(shuffle_seed).permutation(len(order))
        order = {tid: int(places[first]) for tid, first in order.items()}
    return np.array([order[int(tid)] % folds for tid in tracks], dtype=int)


# vote(train, held, repeat): a student trained on the rows ``train`` (bool mask) in this repeat, its probabilities
# (held rows, classes) for the rows ``held``.
HeldOutVote = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def repeated_cross_fit(tracks: Sequence[int], folds: int, deal_seeds: Sequence[int | None], classes: int,
                       vote: HeldOutVote) -> np.ndarray:
    """Each detection's probabilities (n, classes): their mean over one deal of the tracks per ``deal_seeds``.

    In each deal (:func:`fold_of_tracks` with that shuffle seed) every fold's rows get the ``vote`` of a student
    trained on the other folds, so every mean is over students that never saw the detection's track (NOTE
    [ Votes agreed over several fold orders ]). One deal is the single cross-fit, to the bit.
    """
    total = np.zeros((len(tracks), classes))
    for repeat, deal_seed in enumerate(deal_seeds):
        fold = fold_of_tracks(tracks, folds, deal_seed)
        probs = np.zeros((len(tracks), classes))
        for k in range(folds):
            held = fold == k
            probs[held] = vote(~held, held, repeat)
        total += probs
    return total / len(deal_seeds)


def cross_fitted_scores(tracks: Sequence[int], probs: np.ndarray, fit: StreamFit,
                        outlier_log_density: float = SIZE_OUTLIER_LOG_DENSITY) -> TrackEvidence:
    """The cross-fitted round's evidence: per track, three cues that err apart, multiplied and normalised.

    ``probs`` (n, classes) are each detection's probabilities from a student that never trained on its
    track (:func:`fold_of_tracks`). A track's posterior is the product of the students' summed votes
    (normalised), the stream fit's teacher posterior and the likelihoods of the track's size under the
    stream fit's size model with ``outlier_log_density`` under every class, normalised (NOTE [ Cross-fitted
    self-training ]).
    """
    if fit.sizes is None:
        raise ValueError("the cross-fitted round needs the size rule's stream fit")
    student = track_evidence(tracks, probs, np.zeros((len(tracks), 2)))
    log_sizes = np.array([fit.track_log_sizes[tid] for tid in student.ids])
    teacher = np.array([fit.track_posteriors[tid] for tid in student.ids])
    views = np.array([fit.track_side_views[tid] for tid in student.ids]) if fit.track_side_views else None
    sizes = replace(fit.sizes, outlier_log_density=outlier_log_density)
    joint = (np.log(np.maximum(student.posteriors, 1e-12)) + np.log(np.maximum(teacher, 1e-12))
             + sizes.log_likelihood(log_sizes, views))
    posteriors = np.exp(joint - joint.max(axis=1, keepdims=True))
    return replace(student, posteriors=posteriors / posteriors.sum(axis=1, keepdims=True), log_sizes=log_sizes,
                   side_views=views)


def cross_fitted_labels(evidence: TrackEvidence, coverage: float) -> dict[int, int]:
    """The labels of the surest tracks of :func:`cross_fitted_scores` holding ``coverage`` of their detections.

    Tracks are ranked by the difference of their two best posteriors (ties at the threshold kept); the
    others get no label (NOTE [ Cross-fitted self-training ]).
    """
    least = min_margin(evidence.posteriors, evidence.frames, coverage)
    sure = score_margins(evidence.posteriors) >= least
    return {tid: int(label) for tid, label, ok in zip(evidence.ids, evidence.posteriors.argmax(axis=1), sure,
                                                       strict=True) if ok}
