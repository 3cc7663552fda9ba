"""Pseudo-label precision and coverage over a grid of labelling rules, on one seed's node stream.

Trains seed 0's teacher as ``insitu simulate`` does, runs the stand-in detector, the tracker and the teacher over the
steep camera's node stream once, then applies every rule of three grids and scores the pseudo-labels with the truth:
the competence gate (calibration, trusted frames, track vote, propagation backward and forward) over its thresholds,
with the best coverage at precision >= 0.95; the track posterior (NOTE [ Track posteriors: the steep camera's
labelling rule ] in insitu/posterior.py) over its elevation weights and alignment bands; and the size rule (NOTE [
Object size from the mount: the size rule ]) against the posterior rule: precision at full coverage and, keeping the
tracks with the largest margin between their best two classes' scores first, at 0.8, 0.5 and 0.3 of the detections.
With the teacher's accuracy on the stream by the mount's elevation estimate, and its confusion. Choose on one seed
and score the others with ``insitu simulate``: the grid reads ground truth.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from edgetrain.insitu.detect import crop, detect
from edgetrain.insitu.gate import Calibration, GateConfig, calibrate
from edgetrain.insitu.geometry import box_size_m, elevation_deg
from edgetrain.insitu.labels import fit_stream, label_detections
from edgetrain.insitu.model import predict
from edgetrain.insitu.posterior import competence_weights, fit_alignment
from edgetrain.insitu.simulate import QUICK
from edgetrain.insitu.sizes import track_evidence
from edgetrain.insitu.teacher import TeacherConfig, crops_with_truth, render_clips, train_teacher
from edgetrain.insitu.tracker import TrackerConfig, track
from edgetrain.insitu.world import CLASSES, EYE_LEVEL, NODE_CAMERAS, Camera

SEED = 0
NODE_CAMERA = "steep"
GATE_GRID = {"min_confidence": (0.85, 0.9, 0.95, 0.98), "quantile": (0.5, 0.7, 0.9),
             "aspect_quantiles": ((0.2, 0.8), (0.1, 0.9), (0.3, 0.7)), "min_votes": (3, 5), "min_agreement": (0.8, 0.9)}
POSTERIOR_GRID = {"elevation_bands": (1, 3, 5), "weights_deg": ((40, 60), (45, 75), (50, 70), (90, 91))}
GOAL_PRECISION = 0.95

TITLE = "Labelling rules' precision and coverage on one node stream"


def node_stream(quick: bool) -> tuple[Any, Calibration, Any, Any, Any, list[Any]]:
    """The teacher, its calibration inputs and the scored clips of the node's stream (quick: a small teacher and
    two short clips)."""
    config = TeacherConfig(seed=SEED) if not quick else TeacherConfig(
        seed=SEED, videos=QUICK["teacher_videos"], frames=QUICK["teacher_frames"], epochs=QUICK["teacher_epochs"],
        replay_crops=QUICK["replay_crops"])
    teacher, train = train_teacher(config, lambda message: None)
    eye = render_clips(EYE_LEVEL, config.videos, config.frames, SEED * 1000 + 100, rate=0.25)
    held = predict(teacher.model, crops_with_truth(eye[-4:]).crops)
    train_out = predict(teacher.model, train.crops)
    count, frames = (2, 100) if quick else (6, 200)
    stream = render_clips((NODE_CAMERAS[NODE_CAMERA],), count, frames, SEED * 1000 + 300, rate=0.08)
    clips = []
    for k, video in enumerate(stream):
        detections, sources = detect(video, SEED * 7919 + k)
        ids = track(detections, TrackerConfig(seed=SEED + k))
        out = predict(teacher.model, np.array([crop(video.frames[d.frame], d.box) for d in detections]))
        truth = {t.track_id: t.label for t in video.truth}
        clips.append((ids, out, np.array([d.box for d in detections]), [truth.get(s) for s in sources]))
    return teacher, teacher.calibration, train, train_out, held, clips


def run(quick: bool) -> dict[str, Any]:
    """The three grids on seed 0's steep stream (quick: a small teacher, two short clips, a corner of each grid)."""
    torch.set_num_threads(1)
    _, shipped, train, train_out, held, clips = node_stream(quick)
    camera = NODE_CAMERAS[NODE_CAMERA]
    grid = {key: values[:2] if quick else values for key, values in GATE_GRID.items()}
    gate_rows = []
    for confidence, quantile, aspects, votes, agreement in itertools.product(*grid.values()):
        gate = GateConfig("gate", min_confidence=confidence, quantile=quantile, aspect_quantiles=aspects,
                          min_votes=votes, min_agreement=agreement)
        calibration = calibrate(train_out, train.labels, train.boxes, held, gate)
        gate_rows.append({"min_confidence": confidence, "quantile": quantile, "aspect_quantiles": list(aspects),
                          "min_votes": votes, "min_agreement": agreement,
                          **_score(clips, calibration, camera, gate)})
    passing = [row for row in gate_rows if row["precision"] >= GOAL_PRECISION]
    posterior_rows = []
    bands_grid = POSTERIOR_GRID["elevation_bands"][:1] if quick else POSTERIOR_GRID["elevation_bands"]
    for bands, (full_deg, none_deg) in itertools.product(bands_grid, POSTERIOR_GRID["weights_deg"]):
        gate = GateConfig(elevation_bands=bands, full_weight_below_deg=full_deg, no_weight_above_deg=none_deg)
        calibration = calibrate(train_out, train.labels, train.boxes, held, gate)
        posterior_rows.append({"elevation_bands": bands, "full_weight_below_deg": full_deg,
                               "no_weight_above_deg": none_deg, **_score(clips, calibration, camera, gate)})
    curves = [{"rule": rule, **_curve(clips, shipped, camera, GateConfig(rule=rule))} for rule in ("posterior", "size")]
    return {"seed": SEED, "camera": NODE_CAMERA, "clips": len(clips), "small_world": quick,
            "goal_precision": GOAL_PRECISION, **_teacher_by_view(clips, camera), "gate": gate_rows,
            "gate_best": max(passing, key=lambda row: row["coverage"]) if passing else None,
            "posterior": posterior_rows, "ranked": curves}


def render(result: dict[str, Any]) -> str:
    """The teacher by view, the size and posterior rules' ranked precision, the posterior grid, the gate's best."""
    bands = result["teacher_accuracy_by_estimated_elevation"]
    ranked = [f"| {r['rule']} | {r['tracks']} | " + " | ".join(f"{r[f'precision_at_{c}']:.3f}"
                                                              for c in ("1", "0.8", "0.5", "0.3")) + " |"
              for r in result["ranked"]]
    posterior = [f"| {r['elevation_bands']} | {r['full_weight_below_deg']} | {r['no_weight_above_deg']} | "
                 f"{r['precision']:.3f} | {r['coverage']:.3f} |" for r in result["posterior"]]
    best = result["gate_best"]
    top = max(result["gate"], key=lambda row: row["precision"])
    gate = (f"The best of the competence gate's {len(result['gate'])} settings at precision ≥ "
            f"{result['goal_precision']:g} covers {best['coverage']:.3f} of the objects' detections (precision "
            f"{best['precision']:.3f}; min confidence {best['min_confidence']}, quantile {best['quantile']}, aspect "
            f"quantiles {best['aspect_quantiles']}, {best['min_votes']} votes at {best['min_agreement']})."
            if best else f"No setting of the competence gate's {len(result['gate'])} reaches precision ≥ "
            f"{result['goal_precision']:g}: its most precise labels {top['precision']:.3f} at coverage "
            f"{top['coverage']:.3f}.")
    small = ("**A quick run**: a small teacher and two short clips; its figures mean little.\n\n"
             if result["small_world"] else "")
    return (f"{small}Seed {result['seed']}'s teacher and its {result['camera']} camera's node stream "
            f"({result['clips']} clips, the stand-in detector and the tracker), every rule scored against the "
            "truth.\n\n## The teacher on the stream\n\n| elevation (estimated) | "
            + " | ".join(f"{band}°" for band in bands) + " |\n|---|" + "---|" * len(bands) + "\n| accuracy | "
            + " | ".join(f"{v:.3f}" for v in bands.values()) + " |\n\n"
            "## Size rule against posterior rule\n\nLabel precision on the surest tracks (largest margin between "
            "their two best classes' scores first) holding this share of the detections:\n\n"
            "| rule | tracks | 1.0 | 0.8 | 0.5 | 0.3 |\n|---|---|---|---|---|---|\n" + "\n".join(ranked) + "\n\n"
            "## Posterior rule over its elevation weights and alignment bands\n\n"
            "| alignment bands | full weight below (°) | no weight above (°) | precision | coverage |\n"
            "|---|---|---|---|---|\n" + "\n".join(posterior) + "\n\n## The competence gate\n\n" + gate)


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
