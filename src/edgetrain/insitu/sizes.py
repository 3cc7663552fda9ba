"""The size rule's model: per class, a Gaussian of a track's log box size in metres, learnt from the stream by EM.

NOTE [ Object size from the mount: the size rule ]
The steep camera's worst confusions (crates and barrels called "dome", docs/guide/insitu.md) are between
objects of different physical size, and the node can measure size without the teacher: the ground
contact's depth follows from the mount (as its elevation does), so a box's width and height in
pixels become metres at that depth (:func:`~edgetrain.insitu.geometry.box_size_m`; the height mixes the object's
height and footprint seen from above, which is fine: it is compared only with other boxes of this camera). No
size is known per class in advance, so the rule ``GateConfig.rule = "size"`` learns one from the
stream (:func:`fit_size_model`): each track's posterior from the posterior rule (normalised) is a
soft class assignment; a Gaussian of log width and log height per class is fitted to the tracks'
median log sizes under those weights, each track weighing its number of detections and tracks of
fewer than 3 left out of the fit (with false boxes most tracks are one false box long, and weighed like
the others they draw the Gaussians to random sizes); each track's assignment becomes its posterior times the
classes' size likelihoods, and the fit repeats (EM with the teacher's posterior as a fixed prior per track,
20 rounds). A track's label is the arg-max of posterior times size likelihood (:func:`size_labels`): size
overrules the teacher on a track only where the track's size is far likelier under another class than the
teacher's posterior is sure. The self-training round combines the student's track probabilities with the same
cue (:func:`~edgetrain.insitu.labels.relabel_tracks` with ``log_sizes``). Tracks only: a frame's size is noisy
(occlusion, the frame's edge), a track's median much less.

With ``GateConfig.coverage`` below 1 the rule labels only the tracks it is surest of: tracks ranked
by the margin of their two best scores (log posterior plus log size likelihood), the surest holding
``coverage`` of the stream's detections are labelled and the rest are not stored (:func:`min_margin`).
Tracks of fewer than ``GateConfig.min_track_frames`` detections are not labelled either: false boxes make
nearly all of them (with ``--false-positives 0.5``, a fifth of the detections), and labelling them costs label
precision (docs/guide/insitu.md); without false positives such tracks hold few detections.

NOTE [ The size cue given the track's heading ]
A box's width depends on which side of the object the camera sees: a crate (2 m x 1 m footprint) is ~2 m
wide seen side-on and ~1 m end-on, so one Gaussian of log size per class (NOTE [ Object size from the
mount: the size rule ]) is wide for crates and puts end-on crates near pyramids, where every cue can call them
pyramids (docs/guide/insitu.md). The generator moves every object along its long axis on a straight path, and
the node sees that path without ground truth: each box's foot point (bottom centre) maps to the ground
through the mount (:func:`~edgetrain.insitu.geometry.ground_point_m`), and the principal axis of a track's foot
points is its heading (:func:`~edgetrain.insitu.geometry.heading_rad`, modulo 180°: a footprint looks the same
from the front and the back). A box's width in pixels measures the footprint along the ground direction that
moves the image's x the most ((1, -a cos tilt) for a box centred a focal lengths off the image's centre), so per
box |cos| of the angle between the heading and that direction is 1 side-on and 0 end-on, and the track's *side
view* is its median (:func:`~edgetrain.insitu.geometry.track_side_views`). With ``GateConfig.size_heading`` the
size model's mean is linear in it per class (:class:`HeadingSizes`: the log size end-on and side-on, fitted by
weighted least squares in the same EM: for a crate, exp of the side-on log width is its length and the end-on
one its width); |cos| rather than cos 2θ, because near end-on a box's width grows with the angle itself (cos 2θ
is flat there). Tracks whose foot points travel less than
:data:`~edgetrain.insitu.geometry.MIN_HEADING_TRAVEL_M` (no heading) keep the plain Gaussian, fitted on every
track.

NOTE [ A slope only where the tracks show one ]
A class's slope (its side-on minus end-on log size) is fitted from whichever of its tracks are seen
side-on, and a class with only a couple of those gets a slope fitted to their noise, which can turn one round
class into another (docs/guide/insitu.md). A ridge, or any pull of every slope towards 0, also takes the slope
from the crates that need theirs. So each class keeps its slope only where the data earn it
(:func:`_slope_lowers_bic`): the Gaussian log likelihood gain of the line over one size at every view must exceed
BIC's penalty, half a log of the sample size per slope.
The sample size is the class's effective number of tracks (Kish's (sum w)^2 / sum w^2 of its weights:
a track weighs its detections, but its detections share one median size), and the residual covariances
are unbiased in it, so two tracks never carry a slope and a handful seen side-on carry one only if they
sit well off the end-on size. A class that fails has one size at every view (the plain Gaussian of its
tracks with a heading).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .tracker import track_rows

__all__ = ["TrackEvidence", "track_evidence", "HeadingSizes", "SizeModel", "fit_size_model", "size_scores",
           "size_labels", "score_margins", "min_margin"]


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
    members = track_rows(ids)
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
