"""Cross-fitted self-training: students that never saw a track vote on it, and their votes meet the other cues.

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
the floor such tracks can be among the surest (docs/guide/insitu.md). Under the floor a size unlike
every class has no say, and the students and the teacher decide. A second round (simulate's default
``rounds=2``) trains new fold students on the first round's labels of its surest tracks only (holding
``coverage`` of the detections); they vote on every track, and only the last round removes the least sure
tracks from the store.

NOTE [ Votes agreed over several fold orders ]
One deal of the tracks into folds is one draw: which tracks a fold student learns from, and the order
its batches come in, move its votes, and the fold students' seed alone can move the last round's kept labels
by several points (docs/guide/insitu.md). Repeated cross-fitting
(``insitu simulate --round-repeats M``, :func:`repeated_cross_fit`) deals the tracks M times (the first
deal in order of first appearance, as a single deal is; each later one in a random order of its own), trains each
deal's fold students with their own seed, and gives each detection the mean of the M votes it got, each
from a student that never saw its track; the round's cues then meet as with one deal. The students train one
after the other (each within the planned step memory); the round costs M times its fold students.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from .labels import StreamFit
from .sizes import TrackEvidence, min_margin, score_margins, track_evidence

__all__ = ["fold_of_tracks", "HeldOutVote", "repeated_cross_fit", "cross_fitted_scores", "cross_fitted_labels",
           "SIZE_OUTLIER_LOG_DENSITY"]

# The cross-fitted round's floor under the size likelihoods (NOTE [ Cross-fitted self-training ]).
SIZE_OUTLIER_LOG_DENSITY = -4.0


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
