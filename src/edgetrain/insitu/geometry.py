"""What the node's mount tells of a box without the teacher: the camera's elevation above its ground contact, its
size in metres, its foot point on the ground, and a track's heading and side view.

Each follows from the box's pixels and the camera's height, tilt and focal length alone (a pinhole over flat
ground): the posterior rule weighs a frame's vote by its elevation (NOTE [ Track posteriors: the steep camera's
labelling rule ]), the size rule compares sizes in metres (NOTE [ Object size from the mount: the size rule ]),
given the side a track shows the camera (NOTE [ The size cue given the track's heading ]).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tracker import track_rows
from .world import Camera

__all__ = ["elevation_deg", "box_size_m", "ground_point_m", "heading_rad", "track_side_views", "MIN_HEADING_TRAVEL_M"]


def elevation_deg(boxes: np.ndarray, camera: Camera) -> np.ndarray:
    """The camera's elevation (degrees) above each box's ground contact, from the node's mount alone.

    The contact is the box's bottom row; the ray through it leaves the camera ``tilt_deg`` plus
    atan(row offset / focal length) below the horizon, and that is the elevation of the camera
    seen from the contact point.
    """
    rows = np.asarray(boxes, dtype=float).reshape(-1, 4)[:, 3]
    return camera.tilt_deg + np.degrees(np.arctan((rows - camera.height_px / 2) / camera.focal_px))


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
    for rows in track_rows(ids).values():
        heading, travel = heading_rad(feet[rows])
        views.append(float(np.median(np.abs(np.cos(heading - measured[rows])))) if travel >= min_travel_m
                     else float("nan"))
    return np.array(views)
