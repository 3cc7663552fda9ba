"""Pseudo-label precision and coverage over a grid of labelling rules, on one seed's node stream.

Usage::

    python benchmarks/insitu_gate.py --seed 0 [--node-camera steep|pole] [--rule gate|posterior|size]

Trains the seed's teacher as ``insitu simulate`` does, runs the stand-in detector, the tracker and
the teacher over the node's stream once, then applies every rule of the grid and scores the
pseudo-labels with the truth: ``--rule gate`` (the default) the first increment's competence gate
(calibration, trusted frames, track vote, propagation backward and forward), ``--rule posterior``
the track posterior (NOTE [ Track posteriors: the steep camera's labelling rule ] in insitu/posterior.py) over
its elevation weights and alignment bands, ``--rule size`` the size rule (NOTE [ Object size from the mount: the
size rule ])
against the posterior rule: precision at full coverage and, keeping the tracks with the largest
margin between their best two classes' scores first, at 0.8, 0.5 and 0.3 of the detections.
Prints one JSON line per rule, for the gate the best coverage at precision >= 0.95 last. Choose
on one seed and score the others with ``insitu simulate``: the grid reads ground truth.
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import torch

from edgetrain.insitu.detect import crop, detect
from edgetrain.insitu.gate import Calibration, GateConfig, calibrate
from edgetrain.insitu.geometry import box_size_m, elevation_deg
from edgetrain.insitu.labels import fit_stream, label_detections
from edgetrain.insitu.model import predict
from edgetrain.insitu.posterior import competence_weights, fit_alignment
from edgetrain.insitu.sizes import track_evidence
from edgetrain.insitu.teacher import TeacherConfig, crops_with_truth, render_clips, train_teacher
from edgetrain.insitu.tracker import TrackerConfig, track
from edgetrain.insitu.world import CLASSES, EYE_LEVEL, NODE_CAMERAS, Camera


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node-camera", choices=list(NODE_CAMERAS), default="steep")
    parser.add_argument("--rule", choices=("gate", "posterior", "size"), default="gate")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = TeacherConfig(seed=args.seed)
    teacher, train = train_teacher(config, lambda message: None)
    eye = render_clips(EYE_LEVEL, config.videos, config.frames, args.seed * 1000 + 100, rate=0.25)
    held = predict(teacher.model, crops_with_truth(eye[-4:]).crops)
    train_out = predict(teacher.model, train.crops)
    stream = render_clips((NODE_CAMERAS[args.node_camera],), 6, 200, args.seed * 1000 + 300, rate=0.08)
    clips = []
    for k, video in enumerate(stream):
        detections, sources = detect(video, args.seed * 7919 + k)
        ids = track(detections, TrackerConfig(seed=args.seed + k))
        out = predict(teacher.model, np.array([crop(video.frames[d.frame], d.box) for d in detections]))
        truth = {t.track_id: t.label for t in video.truth}
        clips.append((ids, out, np.array([d.box for d in detections]), [truth.get(s) for s in sources]))
    camera = NODE_CAMERAS[args.node_camera]
    print(json.dumps(_teacher_by_view(clips, camera)))
    if args.rule == "size":
        for rule in ("posterior", "size"):
            print(json.dumps({"rule": rule, **_curve(clips, teacher.calibration, camera, GateConfig(rule=rule))}))
        return
    if args.rule == "posterior":
        for bands, (full_deg, none_deg) in itertools.product((1, 3, 5), ((40, 60), (45, 75), (50, 70), (90, 91))):
            gate = GateConfig(elevation_bands=bands, full_weight_below_deg=full_deg, no_weight_above_deg=none_deg)
            calibration = calibrate(train_out, train.labels, train.boxes, held, gate)
            print(json.dumps({"elevation_bands": bands, "full_weight_below_deg": full_deg,
                              "no_weight_above_deg": none_deg, **_score(clips, calibration, camera, gate)}))
        return
    best = None
    grid = itertools.product((0.85, 0.9, 0.95, 0.98), (0.5, 0.7, 0.9), ((0.2, 0.8), (0.1, 0.9), (0.3, 0.7)),
                             (3, 5), (0.8, 0.9))
    for confidence, quantile, aspects, votes, agreement in grid:
        gate = GateConfig("gate", min_confidence=confidence, quantile=quantile, aspect_quantiles=aspects,
                          min_votes=votes, min_agreement=agreement)
        calibration = calibrate(train_out, train.labels, train.boxes, held, gate)
        row = {"min_confidence": confidence, "quantile": quantile, "aspect_quantiles": aspects, "min_votes": votes,
               "min_agreement": agreement, **_score(clips, calibration, camera, gate)}
        print(json.dumps(row))
        if row["precision"] >= 0.95 and (best is None or row["coverage"] > best["coverage"]):
            best = row
    print(json.dumps({"best": best}))


def _teacher_by_view(clips: list, camera: Camera) -> dict[str, object]:
    """The teacher on the stream: accuracy by the mount's elevation estimate, and its confusion (rows: truth)."""
    labels = np.array([-1 if label is None else label for _, _, _, clip_labels in clips for label in clip_labels])
    predicted = np.concatenate([out.labels for _, out, _, _ in clips])
    elevations = np.concatenate([elevation_deg(boxes, camera) for _, _, boxes, _ in clips])
    right, real = predicted == labels, labels >= 0
    by_view = {}
    for lo, hi in ((30, 40), (40, 50), (50, 60), (60, 70), (70, 90)):
        band = real & (elevations >= lo) & (elevations < hi)
        if band.any():
            by_view[f"{lo}-{hi}"] = round(float(right[band].mean()), 3)
    confusion = np.zeros((len(CLASSES), len(CLASSES)), dtype=int)
    np.add.at(confusion, (labels[real], predicted[real]), 1)
    return {"teacher_accuracy_by_estimated_elevation": by_view, "teacher_confusion": confusion.tolist()}


def _curve(clips: list, calibration: Calibration, camera: Camera, gate: GateConfig) -> dict[str, float]:
    """Label precision of the tracks with the largest score margins covering 1.0, 0.8, 0.5, 0.3 of the detections.

    A track's scores: its posterior (normalised weighted aligned probabilities), times its size
    likelihoods under the stream's size model for the size rule. Reads the truth (scoring).
    """
    tracks = np.concatenate([np.asarray(ids) + 100000 * k for k, (ids, _, _, _) in enumerate(clips)])
    probs = np.concatenate([out.probs for _, out, _, _ in clips])
    boxes = np.concatenate([b for _, _, b, _ in clips])
    truth = np.array([-1 if label is None else label for _, _, _, labels in clips for label in labels])
    fit = fit_stream(tracks, probs, boxes, camera, calibration.prior, gate)
    elevations = elevation_deg(boxes, camera)
    votes = fit.alignment.apply(probs, elevations) * competence_weights(elevations, gate)[:, None]
    evidence = track_evidence(tracks, votes, np.log(box_size_m(boxes, camera)))
    ids = evidence.ids
    scores = np.log(np.maximum(evidence.posteriors, 1e-12))
    if fit.sizes is not None:
        scores = scores + fit.sizes.log_likelihood(evidence.log_sizes)
    scores = np.exp(scores - scores.max(axis=1, keepdims=True))
    scores /= scores.sum(axis=1, keepdims=True)
    top = np.sort(scores, axis=1)
    order = np.argsort(-(top[:, -1] - top[:, -2]), kind="stable")
    row = {tid: i for i, tid in enumerate(ids)}
    members = [np.flatnonzero(tracks == ids[i]) for i in order]
    right = np.cumsum([(truth[m] == scores[row[ids[i]]].argmax()).sum() for i, m in zip(order, members, strict=True)])
    counts = np.cumsum([len(m) for m in members])
    at = {f"precision_at_{c:g}": round(float(right[k] / counts[k]), 4)
          for c in (1.0, 0.8, 0.5, 0.3) for k in [min(int(np.searchsorted(counts / counts[-1], c)), len(counts) - 1)]}
    return {"tracks": len(ids), **at}


def _score(clips: list, calibration: Calibration, camera: Camera, gate: GateConfig) -> dict[str, float]:
    """Precision and coverage of one rule's pseudo-labels over the clips (reads the truth).

    The posterior rule's alignment is fitted on the whole stream, as ``insitu simulate`` fits it.
    """
    alignment = fit_alignment(np.concatenate([out.probs for _, out, _, _ in clips]),
                              np.concatenate([elevation_deg(boxes, camera) for _, _, boxes, _ in clips]),
                              calibration.prior, gate.elevation_bands)
    right = labelled = labelled_objects = objects = 0
    for ids, out, boxes, labels in clips:
        pseudo, _ = label_detections(ids, out, boxes, calibration, camera, gate, "track", alignment)
        objects += sum(label is not None for label in labels)
        labelled += sum(p is not None for p in pseudo)
        labelled_objects += sum(p is not None and label is not None for p, label in zip(pseudo, labels, strict=True))
        right += sum(p is not None and p == label for p, label in zip(pseudo, labels, strict=True))
    return {"precision": round(right / max(labelled, 1), 4), "coverage": round(labelled_objects / max(objects, 1), 4)}


if __name__ == "__main__":
    main()
