"""The in-situ pipeline: camera world, tracker, label propagation, frame store, one short run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgetrain.insitu.crossfit import (
    SIZE_OUTLIER_LOG_DENSITY,
    cross_fitted_labels,
    cross_fitted_scores,
    fold_of_tracks,
    repeated_cross_fit,
)
from edgetrain.insitu.detect import Detection, crop, detect, detectable
from edgetrain.insitu.gate import Calibration, GateConfig, accepted, calibrate, log_aspect, propagate, vote
from edgetrain.insitu.geometry import (
    MIN_HEADING_TRAVEL_M,
    box_size_m,
    elevation_deg,
    ground_point_m,
    heading_rad,
    track_side_views,
)
from edgetrain.insitu.labels import StreamFit, fit_stream, label_detections, relabel_tracks
from edgetrain.insitu.model import Outputs
from edgetrain.insitu.posterior import Alignment, competence_weights, fit_alignment, posterior_labels
from edgetrain.insitu.sizes import (
    HeadingSizes,
    SizeModel,
    TrackEvidence,
    fit_size_model,
    min_margin,
    size_labels,
    track_evidence,
)
from edgetrain.insitu.store import MANIFEST_ENTRY_BYTES, MANIFEST_HEADER_BYTES, FrameStore, balance
from edgetrain.insitu.tracker import TrackerConfig, iou_matrix, jumped, track
from edgetrain.insitu.world import POLE, STEEP, Video, render_video

pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def pole_clip() -> Video:
    return render_video(POLE, 80, seed=3, rate=0.12)


# --- the camera world ------------------------------------------------------------------------------
def test_the_world_is_reproducible_and_its_truth_matches_its_frames(pole_clip: Video) -> None:
    again = render_video(POLE, 80, seed=3, rate=0.12)
    other = render_video(POLE, 80, seed=4, rate=0.12)

    assert np.array_equal(pole_clip.frames, again.frames) and pole_clip.truth == again.truth
    assert not np.array_equal(pole_clip.frames, other.frames)
    height, width = pole_clip.frames.shape[1:3]
    assert len({t.track_id for t in pole_clip.truth}) >= 5
    for t in pole_clip.truth:
        x0, y0, x1, y1 = t.box
        assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
        assert t.visible_px <= (x1 - x0) * (y1 - y0) and 0 < t.visible_fraction <= 1
        assert 0 < t.elevation_deg < 90 and 0 <= t.azimuth_deg <= 90
    # Several objects share frames, and some of them hide others.
    per_frame = np.bincount([t.frame for t in pole_clip.truth])
    assert per_frame.max() >= 3
    assert any(t.visible_fraction < 0.9 for t in pole_clip.truth)


def test_crops_are_square_windows_resized() -> None:
    frame = np.zeros((20, 30, 3), dtype=np.uint8)
    frame[5:15, 10:20] = 200  # a 10 px square

    out = crop(frame, (10, 5, 20, 15), size_px=12)

    # The 10 px box in a window 1.2x its side is 12 px: the object is the central 10x10, 1 px of margin around.
    assert out.shape == (12, 12, 3)
    assert (out[1:11, 1:11] == 200).all() and out[0].max() == 0 and out[:, 11].max() == 0


# --- the tracker -----------------------------------------------------------------------------------
def test_iou_is_exact_on_hand_made_boxes() -> None:
    a = np.array([[0, 0, 10, 10]], dtype=float)
    b = np.array([[5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 10, 10]], dtype=float)

    assert iou_matrix(a, b).tolist() == [[50 / 150, 0.0, 1.0]]


def test_two_objects_passing_each_other_keep_their_ids() -> None:
    detections = []
    for f in range(20):
        detections.append(Detection(f, (10 + 4 * f, 50, 30 + 4 * f, 70)))  # moving right
        detections.append(Detection(f, (200 - 4 * f, 10, 220 - 4 * f, 30)))  # moving left, higher up

    ids = track(detections)

    assert ids[0::2] == [1] * 20 and ids[1::2] == [2] * 20


def test_the_motion_gate_measures_the_jump_from_the_line_through_the_recent_detections() -> None:
    recent = [(0, np.array([0.0, 0.0])), (2, np.array([4.0, 0.0]))]  # 2 px a frame to the right

    # Frame 3 is expected at (6, 0); the gate is inclusive.
    assert jumped(recent, 3, np.array([6.0, 8.0]), 8.0)
    assert not jumped(recent, 3, np.array([6.0, 7.9]), 8.0)
    assert not jumped(recent, 5, np.array([10.0, 0.0]), 0.5)  # far on, but on the line
    assert not jumped(recent[1:], 3, np.array([100.0, 100.0]), 8.0)  # one detection: no velocity


def test_the_motion_gate_cuts_a_track_that_jumps_to_an_object_going_the_other_way() -> None:
    # A goes right for 10 frames and leaves; B comes in where A's box was headed, 10 px short of where A
    # would be, and goes left: IoU alone carries A's track on to B.
    detections = [Detection(f, (10 + 4 * f, 50, 40 + 4 * f, 80)) for f in range(10)]
    detections += [Detection(f, (40 - 4 * (f - 10), 50, 70 - 4 * (f - 10), 80)) for f in range(10, 20)]

    assert track(detections) == [1] * 20
    assert track(detections, TrackerConfig(max_jump_px=8.0)) == [1] * 10 + [2] * 10
    assert track(detections, TrackerConfig(max_jump_px=11.0)) == [1] * 20


def test_the_motion_gate_extrapolates_from_the_last_three_detections() -> None:
    # An accelerating box (centre x = f^2 + 30): the line through frames f-3 and f-1 misses frame f by 3 px
    # (through f-2 and f-1: by 2; through f-6 and f-1: by 6).
    detections = [Detection(f, (f * f, 50, 60 + f * f, 110)) for f in range(10)]

    assert track(detections, TrackerConfig(max_jump_px=3.5)) == [1] * 10
    assert track(detections, TrackerConfig(max_jump_px=2.5))[:4] == [1, 1, 1, 2]


def test_the_motion_gate_keeps_an_object_that_moves_on_with_jitter() -> None:
    jitter = np.random.default_rng(0).integers(-2, 3, size=(40, 2))
    detections = [Detection(f, (10 + 3 * f + int(dx), 40 + int(dy), 40 + 3 * f + int(dx), 70 + int(dy)))
                  for f, (dx, dy) in enumerate(jitter)]

    assert track(detections, TrackerConfig(max_jump_px=8.0)) == [1] * 40


def _mota(ids: list[int], sources: list[int], frames: list[int]) -> tuple[float, int]:
    """MOTA with the detector's output as given (no misses, no false positives): 1 - ID switches / truths."""
    last: dict[int, int] = {}
    switches = 0
    for i in sorted(range(len(ids)), key=lambda i: frames[i]):
        if sources[i] in last and last[sources[i]] != ids[i]:
            switches += 1
        last[sources[i]] = ids[i]
    return 1 - switches / len(ids), switches


def test_the_tracker_follows_generated_objects(pole_clip: Video) -> None:
    detections, sources = detect(pole_clip, seed=0)
    frames = [d.frame for d in detections]

    ids = track(detections)
    mota, switches = _mota(ids, sources, frames)
    degraded_mota, degraded = _mota(track(detections, TrackerConfig(switch_rate=0.05)), sources, frames)

    # Every detectable object is detected (no misses asked), so MOTA counts association errors only:
    # measured 0.966 (4 switches in 119 detections, each an object back after 3+ hidden frames).
    assert len(detections) == sum(detectable(t) for t in pole_clip.truth)
    assert mota >= 0.95, (mota, switches)
    assert degraded > switches and degraded_mota < mota


# --- label propagation -----------------------------------------------------------------------------
GATE = GateConfig(min_votes=2, min_agreement=0.75)


def test_a_track_with_agreeing_trusted_frames_is_labelled_everywhere() -> None:
    labels = [3, 1, 2, 2, 0, 2, 1]
    trusted = [False, False, True, True, False, True, False]

    assert propagate(labels, trusted, GATE) == [2] * 7
    assert propagate(labels, trusted, GATE, backward=False) == [None, None, 2, 2, 2, 2, 2]


def test_too_few_or_disagreeing_trusted_frames_label_nothing() -> None:
    assert propagate([1, 1, 1], [True, False, False], GATE) == [None] * 3  # one vote < min_votes
    assert vote([1, 2, 1, 2], [True] * 4, GATE) is None  # 50% agreement < 75%
    assert vote([1, 2, 1, 1], [True] * 4, GATE) == 1  # 75% agreement
    assert propagate([], [], GATE) == []


def test_forward_only_starts_at_the_first_trusted_frame_of_the_winning_label() -> None:
    labels = [0, 1, 1, 1, 1]
    trusted = [True, False, True, True, True]

    assert vote(labels, trusted, GATE) == 1  # 3 of 4 trusted votes
    assert propagate(labels, trusted, GATE, backward=False) == [None, None, 1, 1, 1]


def test_the_gate_trusts_confident_frames_only_where_the_box_looks_like_the_teachers_training_boxes() -> None:
    # Prepare: class 0 was trained on boxes twice as tall as wide, class 1 on boxes twice as wide as tall.
    train = Outputs(probs=np.array([[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 4),
                    features=np.array([[0.0, 0.0], [0.0, 2.0], [0.0, 0.0], [0.0, 2.0]] + [[4.0, 0.0], [4.0, 2.0]] * 2))
    tall, wide = [0, 0, 10, 20], [0, 0, 20, 10]
    boxes = np.array([tall] * 4 + [wide] * 4)
    calibration = calibrate(train, np.array([0] * 4 + [1] * 4), boxes, train, GateConfig(quantile=1.0))
    seen = Outputs(probs=np.array([[0.95, 0.05], [0.95, 0.05], [0.6, 0.4], [0.05, 0.95]]),
                   features=np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]))

    # Execute
    trusted = accepted(seen, np.array([tall, wide, tall, wide]), calibration, GateConfig(min_confidence=0.9))

    # Assert: log(20/10) exactly; a confident class-0 frame is trusted in a tall box, not in a wide one; an
    # unconfident frame is not; a confident class-1 frame in a wide box but far from class 1's features is not.
    assert log_aspect(np.array([tall, wide])).tolist() == [np.log(2.0), -np.log(2.0)]
    assert calibration.aspect_bounds.tolist() == [[np.log(2.0)] * 2, [-np.log(2.0)] * 2]
    assert trusted.tolist() == [True, False, False, False]


def test_the_elevation_of_a_box_comes_from_the_mount_alone() -> None:
    # A box whose bottom row is the image's middle row is seen along the optical axis: the tilt; one focal
    # length lower, 45 degrees more.
    f = STEEP.focal_px
    boxes = np.array([[10, 50, 30, 96], [10, 50, 30, 96 + f]])

    assert np.allclose(elevation_deg(boxes, STEEP), [60.0, 105.0])
    assert competence_weights(np.array([30.0, 40.0, 50.0, 60.0, 80.0]), GateConfig()).tolist() == \
        [1.0, 1.0, 0.5, 0.05, 0.05]


def test_the_view_from_the_mount_outvotes_a_track_of_confident_steep_mistakes() -> None:
    # Prepare: one track; three frames high in the image (38.8 degrees: the teacher's kind of view) say class 1
    # at 0.7; five frames low in it (73.7 degrees) say class 3 at 0.94, confidently wrong.
    shallow, steep = [40, 0, 60, 10], [40, 120, 60, 150]
    boxes = np.array([shallow] * 3 + [steep] * 5)
    probs = np.array([[0.1, 0.7, 0.1, 0.1]] * 3 + [[0.02, 0.02, 0.02, 0.94]] * 5)
    outputs = Outputs(probs, np.zeros((8, 64)))
    permissive = Calibration(np.zeros((4, 64)), np.ones(64), float("inf"), np.tile([-np.inf, np.inf], (4, 1)))

    # Execute: the first increment's gate and vote; the track posterior (alignment off: one band at the prior).
    gate_labels, _ = label_detections([7] * 8, outputs, boxes, permissive, STEEP, GateConfig(rule="gate"), "track")
    weights = competence_weights(elevation_deg(boxes, STEEP), GateConfig())

    # Assert: the gate trusts the five confident frames and labels the track 3; weighted by the view (1 and 0.05),
    # class 1 wins 2.1 to 0.535, over the whole track and, online, from the first frame on.
    assert gate_labels == [3] * 8
    assert weights.tolist() == [1.0] * 3 + [0.05] * 5
    assert posterior_labels([7] * 8, probs, weights, "track") == [1] * 8
    assert posterior_labels([7] * 8, probs, weights, "forward") == [1] * 8
    assert posterior_labels([7] * 8, probs, weights, "none") == [1] * 3 + [3] * 5


def test_alignment_to_the_class_prior_undoes_a_bands_bias_and_leaves_an_unbiased_band_alone() -> None:
    # Prepare: shallow views (30 degrees) whose mean is already the prior; steep ones (70 and 75 degrees) where
    # the teacher leans to class 2 on every crop.
    fair = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    biased = np.array([[0.4, 0.0, 0.6], [0.0, 0.4, 0.6], [0.1, 0.1, 0.8]])
    probs = np.concatenate([fair, biased, biased])
    elevations = np.array([30.0] * 3 + [70.0] * 3 + [75.0] * 3)
    prior = np.full(3, 1 / 3)

    # Execute: three quantile bands of elevation (three crops each).
    aligned = fit_alignment(probs, elevations, prior, bands=3).apply(probs, elevations)

    # Assert: the fair band is untouched; each steep band's mean is the prior, and its ambiguous crops now go to
    # classes 0 and 1 while the one that leaned hardest stays 2.
    assert np.allclose(aligned[:3], fair)
    for band in (aligned[3:6], aligned[6:]):
        assert np.allclose(band.mean(axis=0), prior, atol=1e-3)
        assert band.argmax(axis=1).tolist() == [0, 1, 2]


def test_a_box_size_in_metres_comes_from_the_mount_alone() -> None:
    # A box whose bottom row is the middle row is seen along the optical axis, 60 degrees down from 8 m: its
    # contact is 8 / sin(60) m deep, and a box f pixels wide and f / 2 high is that many metres wide and half high.
    f = STEEP.focal_px
    depth_m = 8.0 / np.sin(np.radians(60.0))

    assert np.allclose(box_size_m(np.array([[10.0, 96 - f / 2, 10 + f, 96.0]]), STEEP), [[depth_m, depth_m / 2]])


def test_the_size_rule_corrects_tracks_the_teacher_leans_wrong_on_by_their_size() -> None:
    # Prepare: eight small tracks (0.5 m, class 0) and eight large ones (2 m, class 1), three frames each with a
    # little size noise. The teacher's posterior is right (0.8) on six of each, and leans wrong (0.4 : 0.6) on two.
    rng = np.random.default_rng(0)
    truth = np.repeat([0, 1], 8)
    lean = np.where(np.isin(np.arange(16), [0, 1, 8, 9]), 0.4, 0.8)
    track_probs = np.where(truth[:, None] == np.arange(2), lean[:, None], 1 - lean[:, None])  # (16, 2)
    ids = np.repeat(np.arange(16), 3)
    probs = np.repeat(track_probs, 3, axis=0) / 3
    log_sizes = np.log(np.where(truth == 0, 0.5, 2.0))[ids, None] + rng.normal(0.0, 0.05, (48, 2))

    # Execute: the tracks' evidence; labels by the posterior alone, by the size rule, by its self-training round.
    tracks = track_evidence(ids, probs, log_sizes)
    by_size = size_labels(tracks)
    by_round = relabel_tracks(ids.tolist(), probs, dict(zip(tracks.ids, tracks.log_sizes, strict=True)))

    # Assert: the posterior is wrong on the four tracks it leans wrong on; their size puts every track right.
    assert tracks.ids == list(range(16)) and np.allclose(tracks.posteriors, track_probs)
    assert tracks.frames.tolist() == [3] * 16
    assert (tracks.posteriors.argmax(axis=1) != truth).nonzero()[0].tolist() == [0, 1, 8, 9]
    assert by_size == truth.tolist()
    assert by_round == dict(enumerate(truth.tolist()))


def _boxes_over(feet: np.ndarray) -> np.ndarray:
    """Boxes (n, 4) 10 px wide and 20 px high standing on the steep camera's image of ground points ``feet`` (n, 2)."""
    pixels = STEEP.project(np.column_stack([feet, np.zeros(len(feet))]))[0]
    return np.column_stack([pixels[:, 0] - 5, pixels[:, 1] - 20, pixels[:, 0] + 5, pixels[:, 1]])


def test_a_straight_track_along_x_has_heading_0_from_its_boxes_foot_points() -> None:
    # Prepare: a box whose foot moves along x from (-2, 6) to (2, 6) m, one along y, one at 120 degrees (9 boxes).
    steps = np.linspace(0.0, 4.0, 9)[:, None]
    along_x = np.array([-2.0, 6.0]) + steps * [1.0, 0.0]
    along_y = np.array([0.0, 3.0]) + steps * [0.0, 1.0]
    slanted = np.array([1.0, 4.0]) + steps * [np.cos(2 * np.pi / 3), np.sin(2 * np.pi / 3)]

    # Execute: the foot points back from the boxes alone, and their heading (mod pi) and travel.
    feet = ground_point_m(_boxes_over(along_x), STEEP)

    # Assert: the mount maps the boxes' bottom centres back to the ground points exactly; headings are the
    # paths' directions mod 180 degrees, whatever the order of the boxes, and each travels 4 m.
    assert np.allclose(feet, along_x)
    assert np.allclose(heading_rad(feet), (0.0, 4.0)) or np.allclose(heading_rad(feet), (np.pi, 4.0))
    assert np.allclose(heading_rad(ground_point_m(_boxes_over(along_y), STEEP)), (np.pi / 2, 4.0))
    assert np.allclose(heading_rad(ground_point_m(_boxes_over(slanted[::-1]), STEEP)), (2 * np.pi / 3, 4.0))


def test_a_tracks_side_view_is_1_side_on_0_end_on_and_unknown_when_it_barely_moves() -> None:
    # Prepare: track 1 crosses along x at 6 m, right of the image's centre (side-on), track 2 comes along y at
    # x = 0 (end-on), track 3 moves 0.9 m along x (under MIN_HEADING_TRAVEL_M); their boxes shuffled.
    steps = np.linspace(0.0, 4.0, 9)[:, None]
    side_on = np.array([1.0, 6.0]) + steps * [1.0, 0.0]
    end_on = np.array([0.0, 3.0]) + steps * [0.0, 1.0]
    still = np.array([1.0, 5.0]) + np.linspace(0.0, 0.9, 3)[:, None] * [1.0, 0.0]
    boxes = np.concatenate([_boxes_over(side_on), _boxes_over(end_on), _boxes_over(still)])
    ids = np.array([1] * 9 + [2] * 9 + [3] * 3)
    order = np.random.default_rng(0).permutation(len(ids))

    # Execute
    views = track_side_views(ids[order], boxes[order], STEEP)

    # Assert: a box a focal lengths right of the centre measures the ground along (1, -a cos 60 deg): side-on,
    # |cos| of that angle is 1 / sqrt(1 + (a / 2)^2), the median over the track's boxes; end-on at x = 0, 0.
    across = ((boxes[:9, 0] + boxes[:9, 2]) / 2 - STEEP.width_px / 2) / STEEP.focal_px
    assert MIN_HEADING_TRAVEL_M == 1.0
    assert len(views) == 3
    by_track = dict(zip(dict.fromkeys(ids[order].tolist()), views, strict=True))
    assert np.isclose(by_track[1], np.median(1 / np.sqrt(1 + (across / 2) ** 2)))
    assert by_track[1] < 0.99  # the box width measures the ground slantwise off the image's centre
    assert np.isclose(by_track[2], 0.0, atol=1e-9)
    assert np.isnan(by_track[3])


def _crates_and_pyramids(noise: float, pyramid_height_m: float, lean: float) -> tuple[TrackEvidence, np.ndarray]:
    """Forty tracks (three frames each, side views 0, 0.25, ..., 1, four of each per class): crates (class 0, 2 m x
    1 m, 1 m high) and pyramids (class 1, 1.1 m wide whatever the view, ``pyramid_height_m`` high), log sizes with
    ``noise``; the teacher leans ``lean`` on the truth of the four crates seen end-on, 0.7 on the others'.
    Returns the evidence and the true classes."""
    rng = np.random.default_rng(0)
    views = np.tile([0.0, 0.25, 0.5, 0.75, 1.0], 8)
    truth = np.repeat([0, 1], 20)
    width = np.where(truth == 0, np.log(1.0) + (np.log(2.0) - np.log(1.0)) * views, np.log(1.1))
    log_sizes = np.column_stack([width, np.where(truth == 0, 0.0, np.log(pyramid_height_m))])
    log_sizes += rng.normal(0.0, noise, (40, 2))
    lean = np.where((truth == 0) & (views == 0.0), lean, 0.7)
    posteriors = np.where(truth[:, None] == np.arange(2), lean[:, None], 1 - lean[:, None])
    return TrackEvidence(list(range(40)), posteriors, log_sizes, np.full(40, 3.0), views), truth


def test_the_heading_size_model_recovers_a_classs_length_and_width_from_tracks_at_several_headings() -> None:
    # Execute: the size model's EM given the side views, on exact sizes and on sizes with 2% noise (pyramids 1.5 m
    # high: the classes' sizes apart at every view).
    exact = fit_size_model(_crates_and_pyramids(0.0, 1.5, 0.7)[0]).heading
    noisy = fit_size_model(_crates_and_pyramids(0.02, 1.5, 0.7)[0]).heading

    # Assert: side-on the crate is its length (2 m) wide, end-on its width (1 m); the pyramid 1.1 m both ways; the
    # heights do not change with the view.
    assert exact is not None and noisy is not None
    assert np.allclose(np.exp(exact.side_on), [[2.0, 1.0], [1.1, 1.5]], rtol=1e-6)
    assert np.allclose(np.exp(exact.end_on), [[1.0, 1.0], [1.1, 1.5]], rtol=1e-6)
    assert np.allclose(np.exp(noisy.side_on), [[2.0, 1.0], [1.1, 1.5]], rtol=0.03)
    assert np.allclose(np.exp(noisy.end_on), [[1.0, 1.0], [1.1, 1.5]], rtol=0.03)


def test_a_class_seen_at_many_views_by_many_tracks_keeps_its_least_squares_slope() -> None:
    from edgetrain.insitu.sizes import _heading_sizes

    # Prepare: one class, 40 tracks (3 to 12 frames each) at side views spread over [0, 1], log width 0 + 0.7 s
    # (a crate), height flat, 5% noise.
    rng = np.random.default_rng(1)
    views = rng.uniform(0.0, 1.0, 40)
    frames = rng.integers(3, 13, 40).astype(float)
    log_sizes = np.column_stack([0.7 * views, np.zeros(40)]) + rng.normal(0.0, 0.05, (40, 2))

    # Execute
    heading = _heading_sizes(frames[:, None], log_sizes, views, 1e-3)

    # Assert: the slope is the weighted least-squares line's, to the rounding (the 1e-6 floor on the weights aside).
    line = np.polyfit(views, log_sizes, 1, w=np.sqrt(frames))  # rows: slope, intercept
    assert np.allclose(heading.end_on[0], line[1], atol=1e-6)
    assert np.allclose(heading.side_on[0] - heading.end_on[0], line[0], atol=1e-6)
    assert abs(heading.side_on[0, 0] - heading.end_on[0, 0] - 0.7) < 0.05


def test_a_class_with_two_tracks_or_two_seen_side_on_near_its_end_on_size_has_no_slope() -> None:
    from edgetrain.insitu.sizes import _heading_sizes

    # Prepare: (a) a class with two tracks, 10 and 30 frames, end-on 1 m and side-on 2 m wide (a line fits them
    # exactly); (b) 20 tracks seen end-on (views 0-0.1) and two side-on (0.9, 1.0), sizes with 5% noise, the two
    # side-on ones 5% wider (one noise's width) or 0.7 wider (a crate's length), 10 frames each.
    two_views, two_sizes = np.array([0.0, 1.0]), np.log([[1.0, 1.0], [2.0, 1.0]])
    two_frames = np.array([10.0, 30.0])
    rng = np.random.default_rng(0)
    views = np.concatenate([np.linspace(0.0, 0.1, 20), [0.9, 1.0]])
    noisy = rng.normal(0.0, 0.05, (22, 2))
    wider = {offset: noisy + np.outer(views > 0.5, [offset, 0.0]) for offset in (0.05, 0.7)}
    frames = np.full((22, 1), 10.0)

    # Execute
    two = _heading_sizes(two_frames[:, None], two_sizes, two_views, 1e-3)
    near = _heading_sizes(frames, wider[0.05], views, 1e-3)
    far = _heading_sizes(frames, wider[0.7], views, 1e-3)

    # Assert: two tracks, and two side-on ones a noise's width off, get one size at every view: the weighted mean,
    # with the weighted scatter over the reliability weights' degrees of freedom (plus the ridge); two side-on ones
    # a crate's length off keep a slope.
    mean = two_frames @ two_sizes / two_frames.sum()
    scatter = ((two_sizes - mean).T * two_frames) @ (two_sizes - mean)
    dof = two_frames.sum() - (two_frames**2).sum() / two_frames.sum()
    assert np.allclose(two.end_on[0], mean) and np.allclose(two.side_on[0], mean)
    assert np.allclose(two.covariances[0], scatter / dof + 1e-3 * np.eye(2))
    assert np.allclose(near.end_on[0], wider[0.05].mean(axis=0)) and np.allclose(near.side_on[0], near.end_on[0])
    assert far.side_on[0, 0] - far.end_on[0, 0] > 0.6


def test_a_slope_is_kept_where_its_likelihood_gain_in_effective_tracks_beats_half_a_log_of_their_number() -> None:
    from edgetrain.insitu.sizes import _slope_lowers_bic

    # Prepare: four tracks of equal weight, one size dimension, residual sums of squares flat / line of 2.0 and 2.3
    # (either side of the closed-form threshold below), and the same with frames 1, 1, 1, 5 (Kish: 64 / 28 tracks).
    line = np.array([[1.0], [-1.0], [1.0], [-1.0]]) / 2

    def kept(ratio: float, frames: list[float]) -> bool:
        return _slope_lowers_bic(np.array(frames), line * np.sqrt(ratio), line, 0.0)

    # Assert: n = 4: 0.5 * 4 * log((S_flat / 3) / (S_line / 2)) > 0.5 * log 4 iff S_flat / S_line > 1.5 sqrt 2
    # = 2.12; n = 64 / 28 = 2.29 tracks: n / 2 * log((S_flat / (n - 1)) / (S_line / (n - 2))) > log(n) / 2 iff the
    # ratio > (n - 1) / (n - 2) * n ** (1 / n) (= 6.1), on the weighted sums of squares (weights' share of each row).
    assert not kept(2.0, [1, 1, 1, 1]) and kept(2.3, [1, 1, 1, 1])
    tracks = 64 / 28
    threshold = (tracks - 1) / (tracks - 2) * tracks ** (1 / tracks)
    assert not kept(threshold * 0.98, [1, 1, 1, 5]) and kept(threshold * 1.02, [1, 1, 1, 5])


def test_the_heading_puts_end_on_crates_the_teacher_leans_wrong_on_right_where_one_size_per_class_does_not() -> None:
    # Prepare: the tracks above with 2% noise, pyramids 1 m high like the crates and the teacher leaning 0.45 : 0.55
    # wrong on the end-on crates; and the same without their side views (one Gaussian per class).
    given, truth = _crates_and_pyramids(0.02, 1.0, 0.45)
    plain = replace(given, side_views=None)
    ids = np.repeat(np.arange(40), 3)
    probs = np.repeat(given.posteriors, 3, axis=0)
    log_sizes = dict(enumerate(given.log_sizes))
    views = dict(enumerate(given.side_views.tolist()))

    # Execute: the size rule's labels and its self-training round's, with and without the views.
    with_heading, without = size_labels(given), size_labels(plain)
    round_with = relabel_tracks(ids.tolist(), probs, log_sizes, views)
    round_without = relabel_tracks(ids.tolist(), probs, log_sizes)

    # Assert: 1 m wide, the end-on crates lie nearer the pyramids' 1.1 m than the crates' mean (~1.4 m): one size
    # per class follows the teacher onto them; given the view, every track is right.
    end_on = [i for i in range(40) if truth[i] == 0 and given.side_views[i] == 0.0]
    assert with_heading == truth.tolist() and round_with == dict(enumerate(truth.tolist()))
    assert [without[i] for i in end_on] == [1] * 4 and [round_without[i] for i in end_on] == [1] * 4


def test_the_cross_fitted_round_judges_a_tracks_size_given_its_side_view_and_without_one_by_one_size() -> None:
    # Prepare: two classes; given the view, class 0 is log width 0 end-on and 1 side-on, class 1 0.5 both ways
    # (unit covariances); one size per class: log sizes centred on (0.5, 0) and (0, 0). Three tracks of log size
    # (0, 0): end-on, side-on, no heading; students and teacher undecided.
    heading = HeadingSizes(np.array([[0.0, 0.0], [0.5, 0.0]]), np.array([[1.0, 0.0], [0.5, 0.0]]),
                           np.tile(np.eye(2), (2, 1, 1)))
    sizes = SizeModel(np.array([[0.5, 0.0], [0.0, 0.0]]), np.tile(np.eye(2), (2, 1, 1)), heading=heading)
    undecided = np.array([0.5, 0.5])
    fit = StreamFit(Alignment(np.array([0.0, 90.0]), np.ones((1, 2))), sizes, dict.fromkeys([1, 2, 3], np.zeros(2)),
                    track_posteriors=dict.fromkeys([1, 2, 3], undecided),
                    track_side_views={1: 0.0, 2: 1.0, 3: float("nan")})

    # Execute
    evidence = cross_fitted_scores([1, 2, 3], np.tile(undecided, (3, 1)), fit, outlier_log_density=float("-inf"))

    # Assert: end-on the track is class 0's (log widths 0 off against 0.5), side-on class 1's (1 against 0.5),
    # with no heading class 1's (0.5 against 0): likelihood ratios exp(0.125), exp(-0.375), exp(-0.125).
    def odds(log_ratio: float) -> list[float]:
        return [1 / (1 + np.exp(-log_ratio)), 1 / (1 + np.exp(log_ratio))]

    assert np.allclose(evidence.posteriors, [odds(0.125), odds(-0.375), odds(-0.125)])
    assert evidence.side_views is not None and evidence.side_views[:2].tolist() == [0.0, 1.0]


def test_the_stream_fit_judges_size_given_the_heading_by_default_and_not_with_the_flag_off() -> None:
    # Prepare: the steep camera's stream of three tracks crossing along x and three along y (9 boxes each),
    # the teacher's probabilities a fixed mix.
    steps = np.linspace(0.0, 4.0, 9)[:, None]
    paths = [np.array([-2.0 + k, 4.0 + k]) + steps * [1.0, 0.0] for k in range(3)]
    paths += [np.array([-1.0 + k, 2.0]) + steps * [0.0, 1.0] for k in range(3)]
    boxes = np.concatenate([_boxes_over(path) for path in paths])
    tracks = np.repeat(np.arange(6), 9)
    probs = np.tile([0.4, 0.3, 0.2, 0.1], (54, 1))
    prior = np.full(4, 0.25)

    # Execute
    on = fit_stream(tracks, probs, boxes, STEEP, prior, GateConfig(rule="size"))
    off = fit_stream(tracks, probs, boxes, STEEP, prior, GateConfig(rule="size", size_heading=False))

    # Assert: by default each track has its side view (~1 across, ~0 along y) and the size model a heading part.
    assert GateConfig().size_heading and GateConfig(rule="size").size_heading
    assert on.sizes is not None and on.sizes.heading is not None
    assert [round(view) for view in on.track_side_views.values()] == [1, 1, 1, 0, 0, 0]
    assert off.sizes is not None and off.sizes.heading is None and off.track_side_views == {}


def test_a_clips_size_labels_judge_each_track_given_its_heading_unless_the_flag_is_off() -> None:
    # Prepare: a clip of two tracks of 10 x 20 px boxes, one crossing along x (side-on), one coming along y
    # (end-on); an undecided teacher; a size model whose one-size part cannot tell the classes apart while its
    # heading part puts class 0 at log size (0, 0) end-on and (5, 5) side-on, class 1 the other way round.
    steps = np.linspace(0.0, 4.0, 9)[:, None]
    boxes = np.concatenate([_boxes_over(np.array([-2.0, 6.0]) + steps * [1.0, 0.0]),
                            _boxes_over(np.array([0.0, 3.0]) + steps * [0.0, 1.0])])
    ids = [1] * 9 + [2] * 9
    outputs = Outputs(np.full((18, 2), 0.5), np.zeros((18, 4)))
    calibration = Calibration(np.zeros((2, 4)), np.ones(4), 1.0, np.zeros((2, 2)), np.array([0.5, 0.5]))
    flat = Alignment(np.array([0.0, 90.0]), np.ones((1, 2)))
    wide = np.tile(10 * np.eye(2), (2, 1, 1))
    sizes = SizeModel(np.zeros((2, 2)), wide, heading=HeadingSizes(np.array([[0.0, 0.0], [5.0, 5.0]]),
                                                                   np.array([[5.0, 5.0], [0.0, 0.0]]), wide))

    def labels(size_heading: bool) -> list[int | None]:
        config = GateConfig(rule="size", size_heading=size_heading)
        return label_detections(ids, outputs, boxes, calibration, STEEP, config, "track", flat, sizes)[0]

    # Assert: the boxes (~0.5 m) are nearer class 1's side-on size and class 0's end-on one; without the heading
    # both tracks tie (class 0 first).
    assert labels(True) == [1] * 9 + [0] * 9
    assert labels(False) == [0] * 18


def test_the_labelled_share_keeps_the_surest_tracks_holding_that_share_of_detections() -> None:
    # Four tracks with score margins 3, 2, 1, 0.5 (two classes) and 10, 1, 1, 8 detections.
    scores = np.array([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 0.5]])
    frames = np.array([10.0, 1.0, 1.0, 8.0])

    assert min_margin(scores, frames, 1.0) == float("-inf")
    assert min_margin(scores, frames, 0.5) == 3.0  # the surest track holds 10 of 20 detections
    assert min_margin(scores, frames, 0.55) == 2.0  # 11 of 20
    assert min_margin(scores, frames, 0.6) == 1.0  # 12 of 20
    assert min_margin(scores, frames, 0.61) == 0.5
    with pytest.raises(ValueError, match="labelled share"):
        min_margin(scores, frames, 0.0)


def test_the_size_rule_leaves_its_least_sure_and_its_shortest_tracks_unlabelled() -> None:
    # Four tracks of three same-sized boxes each, under a size model that cannot tell the two classes apart:
    # the margins are the teacher's log odds alone, |log 9|, |log 4|, |log 1.5| and |log 1.22|; a fifth track
    # is one box long, the surest of all (log 99).
    probs = np.repeat([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.45, 0.55], [0.99, 0.01]], [3, 3, 3, 3, 1], axis=0)
    ids = [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5]
    boxes = np.tile([100.0, 80.0, 120.0, 100.0], (13, 1))
    calibration = Calibration(np.zeros((2, 4)), np.ones(4), 1.0, np.zeros((2, 2)), np.array([0.5, 0.5]))
    flat = Alignment(np.array([0.0, 90.0]), np.ones((1, 2)))
    same = SizeModel(np.zeros((2, 2)), np.tile(np.eye(2), (2, 1, 1)))

    def labels(coverage: float, margin: float | None = None) -> list[int | None]:
        return label_detections(ids, Outputs(probs, np.zeros((13, 4))), boxes, calibration, STEEP,
                                GateConfig(rule="size", coverage=coverage), "track", flat, same, margin)[0]

    assert labels(1.0) == [0] * 3 + [1] * 3 + [0] * 3 + [1] * 3 + [None]  # under 3 boxes: not labelled
    # The margin from this clip's own tracks: the surest tracks (5, 1, 2) hold 7 of 13 detections.
    assert labels(0.5) == [0] * 3 + [1] * 3 + [None] * 7
    assert labels(0.75) == [0] * 3 + [1] * 3 + [0] * 3 + [None] * 4
    assert labels(0.5, margin=0.3) == [0] * 3 + [1] * 3 + [0] * 3 + [None] * 4  # a margin fitted elsewhere


def test_folds_take_whole_tracks_dealt_in_order_of_first_appearance() -> None:
    assert fold_of_tracks([7, 7, 3, 9, 3, 5, 7], 2).tolist() == [0, 0, 1, 0, 1, 1, 0]
    assert fold_of_tracks([7, 3, 9, 5], 3).tolist() == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="at least 2 folds"):
        fold_of_tracks([1, 2], 1)


def _stream_tracks(n_tracks: int = 12) -> list[int]:
    """Track ids of a stream's detections: track t (ids 100 + t) has t % 4 + 1 detections, interleaved."""
    rows = [(i, 100 + t) for t in range(n_tracks) for i in range(t % 4 + 1)]
    return [tid for _, tid in sorted(rows)]


def test_another_deal_shuffles_whole_tracks_into_balanced_folds() -> None:
    tracks = _stream_tracks()
    deals = [fold_of_tracks(tracks, 3, seed) for seed in (None, 1, 2)]

    for fold in deals:
        by_track = {tid: {int(f) for f, t in zip(fold, tracks, strict=True) if t == tid} for tid in set(tracks)}
        assert all(len(folds) == 1 for folds in by_track.values())  # a track lies in one fold whole
        assert sorted(np.bincount([f.pop() for f in by_track.values()])) == [4, 4, 4]  # 12 tracks dealt round-robin
    assert deals[0].tolist() == fold_of_tracks(tracks, 3).tolist()  # no seed: the order of first appearance
    assert deals[0].tolist() != deals[1].tolist() != deals[2].tolist() != deals[0].tolist()
    assert fold_of_tracks(tracks, 3, 1).tolist() == deals[1].tolist()  # a seed's deal is reproducible


def test_each_crops_mean_vote_comes_from_students_that_never_saw_its_track_one_per_deal() -> None:
    tracks = _stream_tracks()
    track_of = np.array(tracks)
    calls: list[tuple[np.ndarray, np.ndarray, int]] = []

    def vote(train: np.ndarray, held: np.ndarray, repeat: int) -> np.ndarray:
        calls.append((train, held, repeat))
        seen = np.array([(track_of[train] == tid).any() for tid in track_of[held]], dtype=float)
        # columns: did the student see this crop's track, the deal's number, the crop's row, 1
        return np.stack([seen, np.full(held.sum(), repeat), np.flatnonzero(held), np.ones(held.sum())], axis=1)

    probs = repeated_cross_fit(tracks, 2, [None, 5, 6], 4, vote)

    assert [repeat for _, _, repeat in calls] == [0, 0, 1, 1, 2, 2]  # two fold students per deal
    for train, held, _ in calls:
        assert (train == ~held).all()
    for repeat in range(3):  # each deal holds every crop out exactly once
        assert sum(held.astype(int) for _, held, r in calls if r == repeat).tolist() == [1] * len(tracks)
    assert probs.tolist() == [[0.0, 1.0, float(row), 1.0] for row in range(len(tracks))]  # the mean of 3 votes
    assert {tuple(held) for _, held, _ in calls[:2]} != {tuple(held) for _, held, _ in calls[2:4]}  # deals differ


def test_one_deal_is_the_single_cross_fit_to_the_bit() -> None:
    tracks = _stream_tracks()
    rng = np.random.default_rng(0)
    votes = rng.dirichlet(np.ones(4), size=(2, len(tracks)))  # fold k's student's votes on every crop

    def vote(train: np.ndarray, held: np.ndarray, repeat: int) -> np.ndarray:
        fold = int(held.argmax() != 0)  # fold 0 holds the first crop (dealt in order of first appearance)
        return votes[fold][held]

    fold = fold_of_tracks(tracks, 2)
    single = np.where((fold == 0)[:, None], votes[0], votes[1])
    assert np.array_equal(repeated_cross_fit(tracks, 2, [None], 4, vote), single)


def test_the_cross_fitted_round_multiplies_students_teacher_and_size_and_keeps_the_surest_share() -> None:
    # Prepare: two classes whose log sizes centre on (0, 0) and (1, 1), unit covariance. Track 1 (3 detections):
    # the students say 0.9 : 0.1, the teacher 0.5 : 0.5, its size halfway (no say). Track 2 (2): the students
    # 0.3 : 0.7, the teacher 0.8 : 0.2 -> 0.24 : 0.14. Track 3 (5): students and teacher undecided, its size on
    # class 1's mean, a likelihood ratio of e.
    sizes = SizeModel(np.array([[0.0, 0.0], [1.0, 1.0]]), np.tile(np.eye(2), (2, 1, 1)))
    fit = StreamFit(Alignment(np.array([0.0, 90.0]), np.ones((1, 2))), sizes,
                    {1: np.array([0.5, 0.5]), 2: np.array([0.5, 0.5]), 3: np.array([1.0, 1.0])},
                    track_posteriors={1: np.array([0.5, 0.5]), 2: np.array([0.8, 0.2]), 3: np.array([0.5, 0.5])})
    tracks = [1, 1, 2, 3, 1, 2, 3, 3, 3, 3]
    probs = np.array([{1: [0.9, 0.1], 2: [0.3, 0.7], 3: [0.5, 0.5]}[t] for t in tracks])

    # Execute (no floor under the size likelihoods)
    evidence = cross_fitted_scores(tracks, probs, fit, outlier_log_density=float("-inf"))

    # Assert: the posteriors are the normalised products; the surest tracks (margins 0.8, 0.46, 0.26) are kept.
    one = 1 / (1 + np.exp(-1.0))
    assert evidence.ids == [1, 2, 3] and evidence.frames.tolist() == [3, 2, 5]
    assert np.allclose(evidence.posteriors, [[0.9, 0.1], [0.24 / 0.38, 0.14 / 0.38], [1 - one, one]])
    assert cross_fitted_labels(evidence, 1.0) == {1: 0, 2: 0, 3: 1}
    assert cross_fitted_labels(evidence, 0.8) == {1: 0, 3: 1}  # 8 of 10 detections
    assert cross_fitted_labels(evidence, 0.3) == {1: 0}
    with pytest.raises(ValueError, match="size rule"):
        cross_fitted_scores(tracks, probs, StreamFit(fit.alignment, None, {}))


def test_a_size_unlike_every_class_has_no_say_under_the_cross_fitted_rounds_floor() -> None:
    # Prepare: two classes whose log sizes centre on (0, 0) and (1, 1), unit covariance. Track 1 (3 detections):
    # the students say 0.6 : 0.4, the teacher 0.5 : 0.5, its log size (10, 10) far from both classes (a fragment's
    # odd box), where class 1 is e^19 times likelier than class 0 but both below e^-80. Track 2 (2): students and
    # teacher undecided, its size on class 1's mean.
    sizes = SizeModel(np.array([[0.0, 0.0], [1.0, 1.0]]), np.tile(np.eye(2), (2, 1, 1)))
    fit = StreamFit(Alignment(np.array([0.0, 90.0]), np.ones((1, 2))), sizes,
                    {1: np.array([10.0, 10.0]), 2: np.array([1.0, 1.0])},
                    track_posteriors={1: np.array([0.5, 0.5]), 2: np.array([0.5, 0.5])})
    tracks = [1, 2, 1, 2, 1]
    probs = np.array([{1: [0.6, 0.4], 2: [0.5, 0.5]}[t] for t in tracks])

    # Execute
    bare = cross_fitted_scores(tracks, probs, fit, outlier_log_density=float("-inf"))
    floored = cross_fitted_scores(tracks, probs, fit, outlier_log_density=-4.0)

    # Assert: without the floor the odd size decides track 1 with certainty and it is the surest; with it, track 1
    # is the students' and teacher's 0.6 : 0.4 and track 2 (densities 1/2pi and 1/2pie, each plus e^-4) the surer.
    near, far, floor = 1 / (2 * np.pi), 1 / (2 * np.pi * np.e), np.exp(-4.0)
    assert np.allclose(bare.posteriors, [[0.0, 1.0], [far / (near + far), near / (near + far)]])
    assert np.allclose(floored.posteriors, [[0.6, 0.4], [(far + floor) / (near + far + 2 * floor),
                                                         (near + floor) / (near + far + 2 * floor)]])
    assert cross_fitted_labels(bare, 0.4) == {1: 1}
    assert cross_fitted_labels(floored, 0.4) == {2: 1}
    assert cross_fitted_labels(floored, 1.0) == {1: 0, 2: 1}
    assert SIZE_OUTLIER_LOG_DENSITY == -4.0  # the round's default floor


def test_a_self_training_round_relabels_whole_tracks_in_the_store(tmp_path: Path) -> None:
    # The student's summed probabilities per track: track 5 is class 1 (0.9 + 0.4 > 0.1 + 0.6), track 6 class 0.
    probs = np.array([[0.1, 0.9], [0.6, 0.4], [0.8, 0.2]])
    assert relabel_tracks([5, 5, 6], probs) == {5: 1, 6: 0}
    store = FrameStore(tmp_path / "s", 10_000)
    store.add([(b"x" * 100, 0, 5), (b"y" * 100, 0, 5), (b"z" * 100, 1, 6), (b"w" * 100, 1, 9)])
    used = store.charged_bytes

    assert store.relabel({5: 1, 6: 0}) == 3
    reopened = FrameStore(tmp_path / "s", 10_000)
    assert [(f.track, f.label) for f in reopened.frames] == [(5, 1), (5, 1), (6, 0), (9, 1)]
    assert reopened.charged_bytes == used and store.relabel({5: 1}) == 0

    # A cross-fitted round keeps only its surest tracks: the others leave the manifest and the disk.
    assert store.keep_tracks({5, 9}) == 1 and store.keep_tracks({5, 9}) == 0
    reopened = FrameStore(tmp_path / "s", 10_000)
    assert [f.track for f in reopened.frames] == [5, 5, 9] and len(list((tmp_path / "s").glob("*.png"))) == 3


# --- the student's recipe --------------------------------------------------------------------------
def test_every_student_fine_tunes_the_teacher_at_the_configured_peak_learning_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import edgetrain.insitu.simulate as sim
    from edgetrain.insitu.gate import Calibration
    from edgetrain.insitu.model import FitConfig, Unlabelled, classifier
    from edgetrain.insitu.teacher import Teacher

    calls: list[tuple[np.ndarray, np.ndarray, FitConfig, np.ndarray, Unlabelled | None]] = []

    def spy(model: object, crops: np.ndarray, labels: np.ndarray, config: FitConfig, weights: np.ndarray,
            unlabelled: Unlabelled | None) -> object:
        calls.append((crops, labels, config, weights, unlabelled))
        return model

    monkeypatch.setattr(sim, "fit", spy)
    teacher = classifier(4, seed=0)
    replay = np.zeros((3, 32, 32, 3), np.uint8), np.array([2, 2, 3])
    shipped = Teacher(teacher, Calibration(np.zeros((4, 64)), np.ones(64), 1.0, np.zeros((4, 2))), *replay)
    stored = np.ones((2, 32, 32, 3), np.uint8), np.array([0, 1])

    student = sim._student(teacher, *stored, shipped, sim.SimulateConfig(seed=5, student_lr=3e-3, replay_weight=4))

    assert student is not teacher  # a copy of the teacher is fine-tuned
    crops, labels, config, weights, unlabelled = calls[0]
    assert config == FitConfig(epochs=12, lr=3e-3, seed=6, memory="19MiB")
    assert labels.tolist() == [0, 1, 2, 2, 3] and len(crops) == 5 and weights.tolist() == [1, 1, 4, 4, 4]
    assert unlabelled is None  # the rounds' students and the oracle learn labelled crops only
    assert sim.SimulateConfig().student_lr == 4e-3  # NOTE [ The student's learning rate ]
    sim._student(teacher, *stored, shipped, sim.SimulateConfig(seed=5, student_seed_offset=3))
    assert calls[1][2].seed == 8  # another offset, another order of the same crops
    dropped = Unlabelled(np.zeros((1, 32, 32, 3), np.uint8), np.array([9]), weight=1.0)
    sim._student(teacher, *stored, shipped, sim.SimulateConfig(), dropped)
    assert calls[2][1].tolist() == [0, 1, 2, 2, 3] and calls[2][4] is dropped  # labels unchanged, no label for it


def test_a_tracks_target_is_its_crops_sharpened_mean_prediction() -> None:
    from edgetrain.insitu.model import track_targets

    probs = np.array([[0.6, 0.4], [0.5, 0.5], [0.8, 0.2]])  # rows 0 and 2: track 7; row 1: track 2
    mean = [0.7, 0.3]
    sharpened = [0.49 / 0.58, 0.09 / 0.58]  # mean ** 2, renormalised (temperature 0.5)

    np.testing.assert_allclose(track_targets(probs, np.array([7, 2, 7]), 1.0), [mean, [0.5, 0.5], mean])
    np.testing.assert_allclose(track_targets(probs, np.array([7, 2, 7]), 0.5), [sharpened, [0.5, 0.5], sharpened])
    # Crops that agree are their own target at temperature 1: the term's excess over its floor (the KL) is zero.
    agree = np.array([[0.2, 0.8], [0.2, 0.8]])
    np.testing.assert_allclose(track_targets(agree, np.array([4, 4]), 1.0), agree)


def test_the_consistency_term_adds_to_the_labelled_loss_and_gives_no_crop_a_hard_label() -> None:
    import torch

    from edgetrain.insitu.model import _batch_loss

    out = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    logp = torch.log_softmax(out, dim=1)
    weights = torch.tensor([1.0, 4.0, 0.0])  # row 2 is unlabelled: no weight in the labelled loss
    targets = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.9, 0.1]])
    term_weights = torch.tensor([0.0, 0.0, 0.5])
    labelled = -(logp[0, 0] + 4 * logp[1, 1]) / 5

    for unlabelled_row_label in (0, 1):  # whatever class an unlabelled row carries, it is never learnt
        labels = torch.tensor([0, 1, unlabelled_row_label])
        assert torch.isclose(_batch_loss(out, labels, weights), labelled)
        term = -0.5 * (0.9 * logp[2, 0] + 0.1 * logp[2, 1]) / 5
        assert torch.isclose(_batch_loss(out, labels, weights, targets, term_weights), labelled + term)


def test_fit_learns_a_labelled_crop_by_its_label_and_an_unlabelled_one_by_the_term_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import edgetrain.insitu.model as model_module
    from edgetrain.insitu.model import FitConfig, Unlabelled, classifier, fit

    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    real_loss = model_module._batch_loss

    def spy(out: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, *term: torch.Tensor) -> torch.Tensor:
        batches.append((weights.clone(), term[1].clone()))
        return real_loss(out, labels, weights, *term)

    monkeypatch.setattr(model_module, "_batch_loss", spy)
    rng = np.random.default_rng(0)
    crops = rng.integers(0, 255, (64, 32, 32, 3), dtype=np.uint8)
    unlabelled = Unlabelled(rng.integers(0, 255, (64, 32, 32, 3), dtype=np.uint8), np.arange(64) // 8, weight=0.5,
                            ramp_epochs=1)
    fit(classifier(4, seed=0), crops, rng.integers(0, 4, 64), FitConfig(epochs=2), np.full(64, 2.0), unlabelled)

    assert len(batches) == 4  # 128 rows: two full batches an epoch
    for epoch, term_weight in ((0, 0.0), (1, 0.5)):
        weights = torch.cat([w for w, _ in batches[2 * epoch:2 * epoch + 2]])
        term_weights = torch.cat([u for _, u in batches[2 * epoch:2 * epoch + 2]])
        assert sorted(weights.tolist()) == [0.0] * 64 + [2.0] * 64  # 64 labelled rows, 64 with no label weight
        assert (term_weights[weights > 0] == 0).all() and (term_weights[weights == 0] == term_weight).all()


def test_the_consistency_terms_weight_ramps_in_and_spares_the_labelled_rows() -> None:
    from edgetrain.insitu.model import Unlabelled, _track_consistency, classifier, predict, track_targets

    model = classifier(4, seed=0)
    crops = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3), dtype=np.uint8)
    unlabelled = Unlabelled(crops, np.array([1, 1, 2]), weight=2.0, temperature=0.5, ramp_epochs=4)
    expected = track_targets(predict(model, crops).probs, np.array([1, 1, 2]), 0.5)

    for epoch, weight in ((0, 0.0), (2, 1.0), (4, 2.0), (7, 2.0)):
        targets, weights = _track_consistency(model, unlabelled, epoch, batch=2, n_labelled=5)
        assert weights.tolist() == [0.0] * 5 + [weight] * 3
        assert targets[:5].eq(0).all()
        np.testing.assert_allclose(targets[5:].numpy(), expected, rtol=1e-5)


def test_the_final_student_learns_the_dropped_tracks_crops_without_a_label() -> None:
    import edgetrain.insitu.simulate as sim

    crops = np.arange(5)[:, None, None, None] * np.ones((1, 32, 32, 3), np.uint8)
    dropped = sim._dropped(crops, [3, 4, 3, 5, 6], kept={3: 0, 6: 1}, weight=0.5)

    assert dropped is not None and dropped.weight == 0.5
    assert dropped.tracks.tolist() == [4, 5] and dropped.crops[:, 0, 0, 0].tolist() == [1, 3]
    assert sim._dropped(crops, [3, 4, 3, 5, 6], kept={3: 0, 6: 1}, weight=0.0) is None  # off
    assert sim._dropped(crops, [3, 3], kept={3: 0}, weight=0.5) is None  # nothing dropped


def test_each_deal_trains_its_own_fold_students_and_one_deal_is_the_single_cross_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import edgetrain.insitu.simulate as sim

    tracks = _stream_tracks()
    n = len(tracks)
    crops = 2.0 ** np.arange(n)  # a fake student's "weights": the sum of its training crops (which rows)
    learnt = np.arange(n) % 5 != 0  # the rows the round's students may learn
    trained: list[tuple[float, int, str]] = []

    def student(teacher: object, train_crops: np.ndarray, labels: np.ndarray, shipped: object,
                config: sim.SimulateConfig) -> tuple[float, int]:
        trained.append((float(train_crops.sum()), config.student_seed_offset, config.student_memory))
        return float(train_crops.sum()), config.student_seed_offset

    monkeypatch.setattr(sim, "_student", student)
    monkeypatch.setattr(sim, "predict", lambda model, x: SimpleNamespace(
        probs=np.tile([model[0], model[1], len(x), 0.0], (len(x), 1))))

    def single(fold: np.ndarray, offset: int) -> np.ndarray:
        """The single cross-fit by hand: each fold's crops voted on by the student of the others' learnt rows."""
        out = np.zeros((n, 4))
        for k in (0, 1):
            out[fold == k] = [crops[(fold != k) & learnt].sum(), offset, (fold == k).sum(), 0.0]
        return out

    def probs(repeats: int) -> np.ndarray:
        config = sim.SimulateConfig(seed=3, student_seed_offset=2, round_repeats=repeats)
        return sim._cross_fitted_probs(None, crops, np.zeros(n), tracks, learnt, None, config)  # type: ignore[arg-type]

    first = single(fold_of_tracks(tracks, 2), 2)
    assert np.array_equal(probs(1), first)
    again = single(fold_of_tracks(tracks, 2, 3 + 2 + sim.REPEAT_SEED_STRIDE), 2 + sim.REPEAT_SEED_STRIDE)
    assert np.array_equal(probs(2), (first + again) / 2)
    assert [offset for _, offset, _ in trained] == [2, 2, 2, 2, 1002, 1002]  # M=1, then M=2
    assert {memory for _, _, memory in trained} == {sim.SimulateConfig.student_memory}  # the planned step, always


def test_simulates_student_learning_rate_epochs_seed_offset_and_track_consistency_come_from_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import edgetrain.insitu.simulate as sim
    from edgetrain.cli import app

    configs: list[sim.SimulateConfig] = []
    monkeypatch.setattr(sim, "simulate", lambda config, store, progress: configs.append(config) or {})
    for flags in ([], ["--student-lr", "0.002", "--student-seed-offset", "4", "--track-consistency", "0.5",
                       "--round-repeats", "3", "--no-size-heading", "--student-epochs", "5"]):
        result = CliRunner().invoke(app, ["insitu", "simulate", "--json", "--store", str(tmp_path / "s"), *flags])
        assert result.exit_code == 0, result.output

    assert [c.student_lr for c in configs] == [sim.SimulateConfig.student_lr, 0.002]
    assert [c.student_seed_offset for c in configs] == [1, 4]
    assert [c.track_consistency for c in configs] == [sim.SimulateConfig.track_consistency, 0.5]
    assert [c.round_repeats for c in configs] == [1, 3]
    assert [c.student_epochs for c in configs] == [sim.SimulateConfig.student_epochs, 5]
    assert [c.gate.size_heading for c in configs] == [True, False]
    for rate in ("0", "-0.001", "nan"):   # a student that cannot learn is refused in one line, before any work
        result = CliRunner().invoke(app, ["insitu", "simulate", "--store", str(tmp_path / "s"), "--student-lr", rate])
        assert result.exit_code == 2 and "--student-lr" in result.output and "> 0" in result.output, result.output
    assert len(configs) == 2


# --- the frame store -------------------------------------------------------------------------------
def _on_disk(root: Path) -> int:
    """Bytes of the frame files in a store's directory."""
    return sum(p.stat().st_size for p in root.glob("*.png"))


def _quota(frames: int) -> int:
    """The quota that holds exactly ``frames`` frames of 100 bytes, with the manifest's charge."""
    return MANIFEST_HEADER_BYTES + frames * (100 + MANIFEST_ENTRY_BYTES)


def test_the_store_never_exceeds_its_quota_and_evicts_the_biggest_class(tmp_path: Path) -> None:
    store = FrameStore(tmp_path, quota_bytes=_quota(10))

    store.add([(b"a" * 100, 0, 1)] * 6)  # class 0: 6 frames
    store.add([(b"b" * 100, 1, 2)] * 3)  # class 1: 3 frames; 9 in all
    evicted = store.add([(b"c" * 100, 2, 3)] * 3)  # 3 more: 2 must go, from class 0, oldest first

    assert [(f.label, f.seq) for f in evicted] == [(0, 0), (0, 1)]
    assert store.bytes_used == _on_disk(tmp_path) == 1000
    assert store.charged_bytes == store.quota_bytes
    # The manifest takes less than it is charged, so frames and manifest together fit the quota.
    assert _on_disk(tmp_path) + (tmp_path / "manifest.json").stat().st_size <= store.quota_bytes
    assert sorted(np.bincount([f.label for f in store.frames]).tolist()) == [3, 3, 4]
    reopened = FrameStore(tmp_path, quota_bytes=_quota(10))
    assert reopened.frames == store.frames
    with pytest.raises(ValueError, match="larger than the store's whole quota"):
        store.add([(b"x" * (store.quota_bytes - MANIFEST_ENTRY_BYTES - MANIFEST_HEADER_BYTES + 1), 0, 9)])
    alone = FrameStore(tmp_path / "alone", quota_bytes=_quota(10))
    alone.add([(b"x" * (alone.quota_bytes - MANIFEST_ENTRY_BYTES - MANIFEST_HEADER_BYTES), 0, 9)])  # just fits
    assert len(alone.frames) == 1 and alone.charged_bytes == alone.quota_bytes


def test_a_batch_larger_than_the_quota_keeps_its_newest_frames(tmp_path: Path) -> None:
    store = FrameStore(tmp_path, quota_bytes=_quota(2) + 50)

    store.add([(bytes([k]) * 100, 0, 1) for k in range(4)])

    assert [(tmp_path / f.name).read_bytes()[0] for f in store.frames] == [2, 3]
    assert _on_disk(tmp_path) == store.bytes_used == 200


def test_eviction_takes_the_oldest_frames_of_the_biggest_class_and_spares_the_others(tmp_path: Path) -> None:
    store = FrameStore(tmp_path, quota_bytes=_quota(6))
    store.add([(b"a" * 100, 0, 1)] * 3 + [(b"b" * 100, 1, 2)] * 2)  # 3 + 2 frames

    evicted = store.add([(b"c" * 100, 0, 3)] * 3)  # 3 more of class 0: 2 must go, both of class 0

    # The two oldest class-0 frames go (stored ones first), class 1 is untouched: 4 + 2 frames.
    assert [f.seq for f in evicted] == [0, 1]
    assert [(f.label, f.seq) for f in store.frames] == [(0, 2), (1, 3), (1, 4), (0, 5), (0, 6), (0, 7)]
    assert _on_disk(tmp_path) == store.bytes_used == 600
    assert balance(store.frames, _quota(4))[1] == [store.frames[0], store.frames[3]]  # class 0 until 2 + 2


WRITER = """
import sys
from pathlib import Path
from edgetrain.insitu.store import MANIFEST_ENTRY_BYTES, MANIFEST_HEADER_BYTES, FrameStore, balance
store = FrameStore(Path(sys.argv[1]), quota_bytes=20_000)
print("ready", flush=True)
k = 0
while True:
    k += 1
    store.add([(bytes([k % 251]) * (300 + 37 * (k % 7)), k % 3, k)] * 4)
"""


def test_a_kill_at_any_moment_loses_no_listed_frame(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "store"
    rng = np.random.default_rng(0)
    for _ in range(4):
        # Execute: a writer adds batches (evicting as it goes) until killed -9 at a random moment.
        writer = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.05, 0.4)))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        # Assert: the manifest parses, lists only whole files, and the quota held on disk.
        manifest = json.loads((root / "manifest.json").read_text())
        for frame in manifest["frames"]:
            data = (root / frame["name"]).read_bytes()
            assert len(data) == frame["nbytes"] and data == bytes([frame["track"] % 251]) * frame["nbytes"]
        assert _on_disk(root) + (root / "manifest.json").stat().st_size <= 20_000
        store = FrameStore(root, quota_bytes=20_000)  # opening removes what the manifest does not list
        assert {p.name for p in root.glob("*.png")} == {f.name for f in store.frames}
    assert len(store.frames) > 0


# --- one short run ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_quick_simulation_reports_every_figure(tmp_path: Path, one_thread: None) -> None:
    from typer.testing import CliRunner

    from edgetrain.cli import app

    result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--json", "--store", str(tmp_path / "s"),
                                      "--quota", "200KiB", "--miss-rate", "0.1", "--false-positives", "0.2"])

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("teacher_accuracy", "student_accuracy", "oracle_student_accuracy", "teacher_accuracy_eye_level",
                "student_accuracy_eye_level", "pseudo_label_precision", "pseudo_label_coverage",
                "tracker_id_switches_per_detection"):
        assert 0.0 <= report[key] <= 1.0, key
    # The latency probe ran the inference path alone and beside a training student process.
    assert report["inference_p95_alone_s"] > 0 and report["inference_p95_beside_student_s"] > 0
    assert report["inference_p95_ratio"] == report["inference_p95_beside_student_s"] / report["inference_p95_alone_s"]
    assert report["student_cpu_share"] >= 0 and isinstance(report["student_training"], bool)
    assert report["store_quota_bytes"] == 200 * 1024
    assert report["store_bytes"] == _on_disk(tmp_path / "s")
    assert report["store_bytes"] + (tmp_path / "s" / "manifest.json").stat().st_size <= report["store_quota_bytes"]
    assert report["stored_frames"] == len(json.loads((tmp_path / "s" / "manifest.json").read_text())["frames"])
    # Two cross-fitted rounds by default: the first relabels every stored track (no student of its own), the last
    # keeps its surest share and trains the student.
    first, second = report["self_training"][1:]
    assert first["pseudo_label_coverage"] == report["self_training"][0]["pseudo_label_coverage"]
    assert "student_accuracy" not in first and second["student_accuracy"] == report["student_accuracy"]
    assert second["pseudo_label_coverage"] <= first["pseudo_label_coverage"]


def test_an_unknown_propagation_is_refused_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgetrain.cli import app

    result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--store", str(tmp_path / "s"),
                                      "--propagation", "sideways"])

    assert result.exit_code == 2
    assert result.stderr.strip() == "error: propagation must be one of track, forward, none, got 'sideways'"


def test_self_training_rounds_without_whole_tracks_are_refused_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgetrain.cli import app

    result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--store", str(tmp_path / "s"),
                                      "--propagation", "none"])

    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: self-training rounds relabel whole tracks: use --rounds 0 with "
                                     "--propagation none")
    result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--store", str(tmp_path / "s"),
                                      "--propagation", "forward", "--rounds", "0"])

    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: the size rule labels whole tracks: use --labels posterior with "
                                     "--propagation forward")
    result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--store", str(tmp_path / "s"),
                                      "--labels", "posterior", "--label-coverage", "0.8"])

    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: the labelled share of detections must be in (0, 1], below 1 with "
                                     "--labels size only, got 0.8 with --labels posterior")
    for flags, message in ((["--round-folds", "1"], "needs at least 2 folds and --labels size, got 1 fold(s) with "
                                                    "--labels size"),
                           (["--round-folds", "2", "--labels", "posterior"], "got 2 fold(s) with --labels posterior"),
                           (["--round-folds", "0", "--round-coverage", "0.8"], "below 1 with --round-folds only, "
                                                                                 "got 0.8"),
                           (["--round-repeats", "0"], "must be 1, or more with --round-folds, got 0"),
                           (["--round-folds", "0", "--round-repeats", "2"], "or more with --round-folds, got 2")):
        result = CliRunner().invoke(app, ["insitu", "simulate", "--quick", "--store", str(tmp_path / "s"), *flags])

        assert result.exit_code == 2 and result.stderr.strip().startswith("error: ")
        assert result.stderr.strip().endswith(message) and "\n" not in result.stderr.strip()


def test_the_labelling_path_reads_no_true_class(pole_clip: Video) -> None:
    # Prepare: the same clip with every object's true class and view (azimuth, elevation) changed; an untrained
    # network as the teacher.
    import dataclasses

    from edgetrain.insitu.model import classifier, predict

    relabelled = Video(pole_clip.camera, pole_clip.frames,
                       tuple(dataclasses.replace(t, label=(t.label + 1) % 4, azimuth_deg=90 - t.azimuth_deg,
                                                 elevation_deg=90 - t.elevation_deg) for t in pole_clip.truth))
    teacher = classifier(4, seed=0)
    calibration = Calibration(np.zeros((4, 64)), np.ones(64), float("inf"), np.tile([-np.inf, np.inf], (4, 1)))

    # Execute: detect, track, classify and label both clips, with either rule.
    def labels(video: Video, rule: str) -> list[int | None]:
        detections, _ = detect(video, seed=1)
        ids = track(detections)
        outputs = predict(teacher, np.array([crop(video.frames[d.frame], d.box) for d in detections]))
        boxes = np.array([d.box for d in detections])
        return label_detections(ids, outputs, boxes, calibration, video.camera, GateConfig(rule=rule), "track")[0]

    # Assert: the pseudo-labels are the same: the true classes and views never reach them (the size rule judges
    # tracks given the heading their boxes show: most have one).
    for rule in ("size", "posterior", "gate"):
        assert labels(pole_clip, rule) == labels(relabelled, rule)
    assert any(label is not None for label in labels(pole_clip, "posterior"))
    detections, _ = detect(pole_clip, seed=1)
    views = track_side_views(track(detections), np.array([d.box for d in detections]), pole_clip.camera)
    assert GateConfig().size_heading and np.isfinite(views).mean() > 0.5


def _goal_report(teacher: float, student: float, oracle: float, *, precision: float = 0.98, coverage: float = 0.81,
                 eye: tuple[float, float] = (0.9, 0.9), bands: dict[str, tuple[float, float]] | None = None,
                 ) -> dict[str, object]:
    """The keys of an ``insitu simulate --json`` report that the goals table reads."""
    bands = bands or {"0-40": (student, oracle)}
    return {"teacher_accuracy": teacher, "student_accuracy": student, "oracle_student_accuracy": oracle,
            "pseudo_label_precision": precision, "pseudo_label_coverage": coverage,
            "teacher_accuracy_eye_level": eye[0], "student_accuracy_eye_level": eye[1],
            "student_accuracy_by_elevation": {band: s for band, (s, _) in bands.items()},
            "oracle_student_accuracy_by_elevation": {band: o for band, (_, o) in bands.items()}}


def test_the_goals_table_judges_the_mean_of_the_offsets_and_bounds_the_student_by_its_oracle() -> None:
    from edgetrain.insitu import goals as table

    # A seed whose oracle is 24 points above the teacher: no student equal to it would meet +25.
    first = _goal_report(0.6, 0.83, 0.84, eye=(0.90, 0.915), bands={"0-40": (0.8, 0.9), "60-90": (0.7, 0.75)})
    second = _goal_report(0.3, 0.55, 0.56, precision=0.95, coverage=0.80, eye=(0.90, 0.87),
                          bands={"0-40": (0.9, 0.85), "40-60": (0.8, 0.8)})
    figures = table.goal_figures(first)
    assert figures["student_points"] == pytest.approx(23.0) and figures["oracle_points"] == pytest.approx(24.0)
    assert figures["ratio"] == pytest.approx(0.83 / 0.84) and figures["eye_points"] == pytest.approx(1.5)
    assert figures["student_minus_oracle_0-40"] == pytest.approx(-10.0)
    assert figures["student_minus_oracle_60-90"] == pytest.approx(-5.0)
    assert table.goals_met(figures) == {"labels": True, "points": False, "ratio": True, "eye": True,
                                        "oracle_reaches_points": False}
    second_met = table.goals_met(table.goal_figures(second))  # the thresholds themselves meet the goals ...
    assert second_met["labels"] and second_met["points"] and second_met["oracle_reaches_points"]
    assert not second_met["eye"]  # ... 3 points below the teacher at eye level does not (forgetting)
    mean = table.mean_figures([figures, table.goal_figures(second)])
    assert mean["student_points"] == pytest.approx(24.0) and mean["oracle_points"] == pytest.approx(25.0)
    assert mean["ratio"] == pytest.approx((0.83 / 0.84 + 0.55 / 0.56) / 2)  # the mean of the runs' ratios,
    assert mean["ratio"] != pytest.approx((0.83 + 0.55) / (0.84 + 0.56))  # not the ratio of the mean accuracies
    assert mean["student_minus_oracle_0-40"] == pytest.approx(-2.5)  # both rows have the band ...
    assert mean["student_minus_oracle_60-90"] == pytest.approx(-5.0)  # ... one row only: its own figure
    assert mean["precision"] == pytest.approx(0.965) and mean["coverage"] == pytest.approx(0.805)
    assert table.goals_met(mean) == {"labels": True, "points": False, "ratio": True, "eye": True,
                                     "oracle_reaches_points": True}

    rows = table.goals_table([("o1", first), ("o2", second)]).splitlines()
    assert len(rows) == 2 + 3 and rows[-1].startswith("| mean | 0.965 @ 0.805 | +24.0 | +25.0 |")
    assert rows[2].endswith("| labels, ratio, eye | no |") and rows[-1].endswith("| labels, ratio, eye | yes |")
    assert rows[0].index("0-40°") < rows[0].index("40-60°") < rows[0].index("60-90°")  # the bands in order
    assert "| -10.0 |  | -5.0 |" in rows[2] and "| +5.0 | +0.0 |  |" in rows[3]  # a band a run lacks: no figure


def test_the_simulate_commands_defaults_are_the_simulation_configs() -> None:
    """`insitu simulate` states its defaults in --help; each must be the library's, or the two would drift."""
    import typer

    from edgetrain.cli.insitu import insitu_app
    from edgetrain.insitu.simulate import SimulateConfig
    from edgetrain.units import parse_bytes

    command = typer.main.get_command(insitu_app).commands["simulate"]  # type: ignore[attr-defined]
    given = {param.name: param.default for param in command.params if param.default is not None}
    config = SimulateConfig()
    renamed = {"memory": config.student_memory, "false_positives": config.false_positives_per_frame,
               "labels": config.gate.rule, "label_coverage": config.gate.coverage,
               "size_heading": config.gate.size_heading}
    compared = {name: renamed[name] if name in renamed else getattr(config, name)
                for name in given if name in renamed or hasattr(config, name)}
    compared["quota"] = config.quota_bytes
    given["quota"] = parse_bytes(given["quota"])
    assert len(compared) >= 18
    assert {name: given[name] for name in compared} == compared


def test_the_guides_results_table_is_the_stored_reports_table() -> None:
    """docs/guide/insitu.md's seed table is what the insitu_table benchmark renders from the stored reports."""
    from benchmarks.insitu_table import OFFSETS, SEEDS, render

    root = Path(__file__).resolve().parents[1]
    runs = [{"seed": s, "offset": k, "wall_s": 0.0,
             "report": json.loads((root / f"benchmarks/results/insitu/seed{s}_offset{k}.json").read_text())}
            for s in SEEDS for k in OFFSETS]
    page = render({"camera": "steep", "detector": "standin", "small_world": False, "seeds": list(SEEDS),
                   "offsets": list(OFFSETS), "runs": runs})
    guide = (root / "docs/guide/insitu.md").read_text().replace("\u2212", "-")
    seed_table = page.split("## Every run")[0].splitlines()
    rows = [line for line in seed_table if line.startswith(("| 0 |", "| 1 |", "| 2 |", "| mean |"))]
    assert len(rows) == 4
    for row in rows:
        assert row in guide
