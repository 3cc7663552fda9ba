"""A procedural camera world: objects of a few 3D shapes crossing a scene, seen by a mounted camera.

NOTE [ The camera world ]
No camera and no network here, so the in-situ pipeline is tested against rendered video whose
truth is known. The world is a flat ground (``z = 0``, metres; ``x`` right, ``y`` away from the
camera) with static clutter (ground patches, grey blocks that occlude) and moving objects of
:data:`CLASSES`, each a convex mesh with class-specific textures on its *sides* and a plain,
shared-looking roof. A pinhole camera at ``height_m`` pitched down by ``tilt_deg`` renders
each frame with Pillow polygons (painter's order, back faces culled, Lambert shading under a
light whose brightness drifts over the video).

The viewpoint problem comes from the geometry, not from a rule: a camera at eye level sees
the sides (elevation angle near 0°); a camera on a pole sees objects far away at shallow
elevations and near ones from above (elevation up to ~65°), where the roofs dominate and the
silhouettes change. A track crossing such a view passes from views like the teacher's
training views to views it never saw.

Each frame's truth (:class:`ObjectTruth`: class, visible box, track id, elevation and
azimuth of the view) is kept apart from the pixels: :class:`Video` holds ``frames`` for the
pipeline and ``truth`` for evaluation only; :func:`write_video` writes them as PNGs and a
``truth.json`` beside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..sysutil.fileio import write_json

__all__ = ["CLASSES", "Camera", "EYE_LEVEL", "POLE", "STEEP", "NODE_CAMERAS", "node_camera", "ObjectTruth", "Video",
           "render_video", "write_video", "FRAME_RATE_HZ"]

CLASSES = ("crate", "barrel", "pyramid", "dome")
FRAME_RATE_HZ = 5.0  # world time: a rendered frame is 0.2 s after the one before

_Face = tuple[np.ndarray, tuple[int, int, int]]  # vertices (k, 3) in object coordinates, RGB colour


@dataclass(frozen=True)
class Camera:
    """A pinhole camera at ``(0, 0, height_m)`` looking along +y, pitched down by ``tilt_deg``."""

    height_m: float
    tilt_deg: float
    width_px: int = 256
    height_px: int = 192
    hfov_deg: float = 60.0
    far_m: float = 24.0  # objects walk no further than this

    @property
    def focal_px(self) -> float:
        return (self.width_px / 2) / math.tan(math.radians(self.hfov_deg) / 2)

    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right, up and forward unit vectors in world coordinates."""
        t = math.radians(self.tilt_deg)
        return (np.array([1.0, 0.0, 0.0]), np.array([0.0, math.sin(t), math.cos(t)]),
                np.array([0.0, math.cos(t), -math.sin(t)]))

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pixel coordinates (n, 2) and depths (n,) of world points (n, 3)."""
        right, up, forward = self.basis()
        d = points - np.array([0.0, 0.0, self.height_m])
        depth = d @ forward
        safe = np.maximum(depth, 1e-3)
        px = self.width_px / 2 + self.focal_px * (d @ right) / safe
        py = self.height_px / 2 - self.focal_px * (d @ up) / safe
        return np.stack([px, py], axis=1), depth

    def ground_range_m(self) -> tuple[float, float]:
        """Nearest and furthest ground distance (along y) in view, the far end capped at ``far_m``."""
        half_vfov = math.atan((self.height_px / 2) / self.focal_px)
        low = math.radians(self.tilt_deg) + half_vfov
        high = math.radians(self.tilt_deg) - half_vfov
        near = self.height_m / math.tan(low) if low < math.pi / 2 else 0.0
        far = self.height_m / math.tan(high) if high > 0 else self.far_m
        return near + 0.5, min(far, self.far_m)

    def half_width_m(self, y_m: float) -> float:
        """Half the ground width in view at distance ``y_m`` (slightly generous: objects enter and leave)."""
        forward = self.basis()[2]
        depth = np.array([0.0, y_m, -self.height_m]) @ forward
        return float(depth * (self.width_px / 2) / self.focal_px)


# The teacher's world: hand-held and vehicle heights, looking almost level (elevations 0-20°).
EYE_LEVEL = (Camera(height_m=1.2, tilt_deg=2.0), Camera(height_m=1.8, tilt_deg=5.0), Camera(height_m=2.5, tilt_deg=8.0))
# The node: a camera on a 6 m pole pitched 45° down (elevations ~22° far away to ~58° below it).
POLE = Camera(height_m=6.0, tilt_deg=45.0)
# The deployed node by default: 8 m up, pitched 60° down (elevations ~33° far away to ~80° below it), where the
# teacher is right on ~44% of the crops (seed 0's first two clips; 0.674 on POLE).
STEEP = Camera(height_m=8.0, tilt_deg=60.0)
NODE_CAMERAS = {"steep": STEEP, "pole": POLE}


def node_camera(name: str) -> Camera:
    """The node's camera preset ``name`` (one of :data:`NODE_CAMERAS`)."""
    if name not in NODE_CAMERAS:
        raise ValueError(f"the node's camera must be one of {', '.join(NODE_CAMERAS)}, got {name!r}")
    return NODE_CAMERAS[name]


@dataclass(frozen=True)
class ObjectTruth:
    """One object in one frame, for evaluation only: never read by the pipeline."""

    frame: int
    track_id: int
    label: int
    box: tuple[int, int, int, int]  # visible pixels: x0, y0, x1, y1 (x1, y1 exclusive)
    visible_px: int
    visible_fraction: float  # of the silhouette it would have unoccluded (the frame's edge occludes too)
    elevation_deg: float  # angle of the camera above the object's centre, seen from the object
    azimuth_deg: float  # 0: the camera sees the object's side; 90: its front or back


@dataclass(frozen=True)
class Video:
    """Rendered frames (pipeline input) and their truth (evaluation only)."""

    camera: Camera
    frames: np.ndarray  # (T, H, W, 3) uint8
    truth: tuple[ObjectTruth, ...]


# --- meshes ---------------------------------------------------------------------------------------
_ROOF = (150, 150, 140)


def _prism(ring: np.ndarray, height_m: float, colours: Sequence[tuple[int, int, int]], bands: int) -> list[_Face]:
    """A vertical prism over a polygon ``ring`` (n, 2): side quads in ``bands`` horizontal bands, a roof."""
    faces: list[_Face] = []
    n = len(ring)
    for i in range(n):
        a, b = ring[i], ring[(i + 1) % n]
        for k in range(bands):
            z0, z1 = height_m * k / bands, height_m * (k + 1) / bands
            quad = np.array([[a[0], a[1], z0], [b[0], b[1], z0], [b[0], b[1], z1], [a[0], a[1], z1]])
            faces.append((quad, colours[(i + k) % len(colours)]))
    faces.append((np.column_stack([ring, np.full(n, height_m)]), _ROOF))
    return faces


_Colour = tuple[int, int, int]
# Side colours are drawn per object from one palette, so a class is its shape and its pattern
# (bands, stripes, rings, checks), never its colour.
PALETTE: tuple[_Colour, ...] = ((200, 40, 40), (235, 235, 235), (40, 90, 210), (230, 200, 40), (60, 170, 60),
                                (240, 150, 30), (150, 50, 190), (30, 30, 30))


def _crate(a: _Colour, b: _Colour) -> list[_Face]:
    ring = np.array([[-1.0, -0.5], [1.0, -0.5], [1.0, 0.5], [-1.0, 0.5]])
    return _prism(ring, 1.0, [a, b], bands=4)


def _barrel(a: _Colour, b: _Colour) -> list[_Face]:
    angles = np.linspace(0, 2 * math.pi, 12, endpoint=False)
    ring = 0.5 * np.column_stack([np.cos(angles), np.sin(angles)])
    return _prism(ring, 1.4, [a, b], bands=1)


def _pyramid(a: _Colour, b: _Colour) -> list[_Face]:
    base = np.array([[-0.7, -0.7], [0.7, -0.7], [0.7, 0.7], [-0.7, 0.7]])
    faces: list[_Face] = []
    bands = 3
    for i in range(4):
        u, v = base[i], base[(i + 1) % 4]
        for k in range(bands):
            s0, s1 = k / bands, (k + 1) / bands
            pts = [np.array([*(p * (1 - s)), 1.5 * s]) for p, s in ((u, s0), (v, s0), (v, s1), (u, s1))]
            colour = a if k % 2 == 0 else b
            faces.append((np.array(pts) if k < bands - 1 else np.array(pts[:3]), colour))
    return faces


def _dome(a: _Colour, b: _Colour) -> list[_Face]:
    faces: list[_Face] = []
    lats, lons = 4, 10
    for i in range(lats):
        t0, t1 = math.pi / 2 * i / lats, math.pi / 2 * (i + 1) / lats
        for j in range(lons):
            p0, p1 = 2 * math.pi * j / lons, 2 * math.pi * (j + 1) / lons

            def point(t: float, p: float) -> list[float]:
                return [0.75 * math.cos(t) * math.cos(p), 0.75 * math.cos(t) * math.sin(p), 0.9 * math.sin(t)]

            quad = [point(t0, p0), point(t0, p1), point(t1, p1), point(t1, p0)]
            if i == lats - 1:
                quad = quad[:3]
            colour = _ROOF if i >= 2 else (a if (i + j) % 2 == 0 else b)
            faces.append((np.array(quad), colour))
    return faces


_MESHES = (_crate, _barrel, _pyramid, _dome)


# --- scenes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Mover:
    track_id: int
    label: int
    start_frame: int
    start: np.ndarray  # (2,) ground position, m
    velocity: np.ndarray  # (2,) m per frame
    frames: int
    scale: float
    tint: float
    faces: list[_Face]


def _movers(camera: Camera, n_frames: int, rate: float, rng: np.random.Generator, first_id: int) -> list[_Mover]:
    """Objects arriving at ``rate`` per frame, each crossing the view on a straight path at walking pace."""
    near, far = camera.ground_range_m()
    movers: list[_Mover] = []
    t = 0.0
    while True:
        t += rng.exponential(1 / rate)
        if t >= n_frames:
            return movers
        ends = []
        for y in (rng.uniform(near, far), rng.uniform(near, far)):
            ends.append(np.array([rng.choice([-1, 1]) * camera.half_width_m(y) * 1.1, y]))
        if rng.random() < 0.5:  # half the paths run from far to near (or back) instead of side to side
            y0, y1 = far * 1.02, near * 0.9
            ends = [np.array([rng.uniform(-0.6, 0.6) * camera.half_width_m(y0), y0]),
                    np.array([rng.uniform(-0.6, 0.6) * camera.half_width_m(y1), y1])]
        if rng.random() < 0.5:
            ends.reverse()
        speed = rng.uniform(0.18, 0.35)  # m per frame: 1-2 m/s at 5 frames/s
        length = float(np.linalg.norm(ends[1] - ends[0]))
        label = int(rng.integers(len(CLASSES)))
        a, b = rng.choice(len(PALETTE), size=2, replace=False)
        movers.append(_Mover(first_id + len(movers), label, int(t), ends[0],
                             (ends[1] - ends[0]) / length * speed, max(2, int(length / speed)),
                             float(rng.uniform(0.85, 1.15)), float(rng.uniform(0.8, 1.2)),
                             _MESHES[label](PALETTE[a], PALETTE[b])))


@dataclass(frozen=True)
class _Placed:
    faces: list[_Face]
    origin: np.ndarray  # (3,)
    heading_rad: float
    scale: float
    tint: float
    key: int  # 0 for clutter, else track id


def _clutter(camera: Camera, rng: np.random.Generator) -> list[_Placed]:
    near, far = camera.ground_range_m()
    placed = []
    for _ in range(4):
        y = rng.uniform(near, far)
        x = rng.uniform(-1, 1) * camera.half_width_m(y)
        grey = int(rng.integers(70, 130))
        w, d, h = rng.uniform(0.3, 0.9), rng.uniform(0.3, 0.9), rng.uniform(0.6, 1.8)
        ring = np.array([[-w, -d], [w, -d], [w, d], [-w, d]])
        faces = _prism(ring, h, [(grey, grey + 20, grey)], bands=1)
        placed.append(_Placed(faces, np.array([x, y, 0.0]), float(rng.uniform(0, math.pi)), 1.0, 1.0, 0))
    return placed


def _background(camera: Camera, rng: np.random.Generator) -> Image.Image:
    """Sky above the horizon, a ground of random patches below it (static over the video)."""
    image = Image.new("RGB", (camera.width_px, camera.height_px), (120, 160, 200))
    draw = ImageDraw.Draw(image)
    near, far = camera.ground_range_m()
    ground = np.array([[-60.0, 0.3, 0.0], [60.0, 0.3, 0.0], [60.0, 80.0, 0.0], [-60.0, 80.0, 0.0]])
    draw.polygon([tuple(p) for p in camera.project(ground)[0]], fill=(95, 105, 80))
    for _ in range(25):
        y = rng.uniform(near, far * 1.5)
        x = rng.uniform(-1.3, 1.3) * camera.half_width_m(y)
        w, d = rng.uniform(0.3, 2.0), rng.uniform(0.3, 2.0)
        patch = np.array([[x - w, y - d, 0], [x + w, y - d, 0], [x + w, y + d, 0], [x - w, y + d, 0]])
        colour = tuple(int(c) for c in rng.integers(60, 150, size=3))
        draw.polygon([tuple(p) for p in camera.project(patch)[0]], fill=colour)
    return image


def _draw(camera: Camera, objects: Sequence[_Placed], image: Image.Image, ids: Image.Image,
          light: np.ndarray, brightness: float) -> dict[int, int]:
    """Paint objects far to near, culling back faces; ``ids`` gets each object's key (255 for clutter).

    Returns:
        each moving object's silhouette in pixels as if nothing occluded it.
    """
    draw, draw_ids = ImageDraw.Draw(image), ImageDraw.Draw(ids)
    silhouettes: dict[int, int] = {}
    eye = np.array([0.0, 0.0, camera.height_m])
    order = sorted(objects, key=lambda o: -float(np.linalg.norm(o.origin - eye)))
    for obj in order:
        alone = Image.new("1", image.size, 0)
        draw_alone = ImageDraw.Draw(alone)
        c, s = math.cos(obj.heading_rad), math.sin(obj.heading_rad)
        rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) * obj.scale
        centre = obj.origin + np.array([0.0, 0.0, 0.5 * obj.scale])
        for verts, colour in obj.faces:
            world = verts @ rot.T + obj.origin
            mid = world.mean(axis=0)
            normal = np.cross(world[1] - world[0], world[2] - world[0])
            if normal @ (mid - centre) < 0:
                normal = -normal
            if normal @ (eye - mid) <= 0:
                continue
            normal = normal / (np.linalg.norm(normal) + 1e-12)
            shade = brightness * obj.tint * (0.45 + 0.55 * max(0.0, float(normal @ light)))
            fill = tuple(min(255, int(ch * shade)) for ch in colour)
            pixels = [tuple(p) for p in camera.project(world)[0]]
            draw.polygon(pixels, fill=fill)
            draw_ids.polygon(pixels, fill=obj.key if obj.key else 255)
            if obj.key:
                draw_alone.polygon(pixels, fill=1)
        if obj.key:
            silhouettes[obj.key] = int(np.count_nonzero(np.asarray(alone)))
    return silhouettes


def _view_angles(camera: Camera, position: np.ndarray, heading_rad: float) -> tuple[float, float]:
    """Elevation of the camera above the object's centre, and azimuth (0: side view, 90: end-on)."""
    to_cam = np.array([-position[0], -position[1]])
    ground = float(np.linalg.norm(to_cam))
    elevation = math.degrees(math.atan2(camera.height_m - 0.6, ground))
    bearing = math.atan2(to_cam[1], to_cam[0]) - heading_rad
    azimuth = abs(math.degrees(math.asin(abs(math.cos(bearing))))) if ground > 0 else 0.0
    return elevation, azimuth


def render_video(camera: Camera, n_frames: int, seed: int, *, rate: float = 0.08, min_visible_px: int = 30) -> Video:
    """Render ``n_frames`` of the world seen by ``camera``; the same seed gives the same video.

    Args:
        camera: where the camera stands and how it is tilted.
        n_frames: frames to render (5 frames/s of world time).
        seed: the seed of everything random (paths, classes, clutter, light).
        rate: new objects per frame (several in view at once: ~``rate`` x frames a crossing takes).
        min_visible_px: an object with fewer visible pixels has no truth record in that frame.

    Returns:
        the frames and their truth.
    """
    if n_frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    rng = np.random.default_rng(seed)
    background = _background(camera, rng)
    clutter = _clutter(camera, rng)
    movers = _movers(camera, n_frames, rate, rng, first_id=1)
    if len(movers) > 250:
        raise ValueError(f"too many objects for one video ({len(movers)}): lower rate or n_frames")
    phase, period = rng.uniform(0, 2 * math.pi), rng.uniform(80, 200)
    frames = np.empty((n_frames, camera.height_px, camera.width_px, 3), dtype=np.uint8)
    truth: list[ObjectTruth] = []
    for f in range(n_frames):
        brightness = 1.0 + 0.3 * math.sin(2 * math.pi * f / period + phase)
        angle = 0.6 + 0.4 * math.sin(2 * math.pi * f / (2 * period))
        light = np.array([math.cos(angle) * 0.5, -0.5, math.sin(angle) + 0.4])
        light /= np.linalg.norm(light)
        placed = list(clutter)
        headings: dict[int, float] = {}
        for m in movers:
            k = f - m.start_frame
            if 0 <= k < m.frames:
                pos = m.start + m.velocity * k
                heading = math.atan2(m.velocity[1], m.velocity[0])
                headings[m.track_id] = heading
                placed.append(_Placed(m.faces, np.array([pos[0], pos[1], 0.0]), heading, m.scale, m.tint,
                                      m.track_id))
        image, ids = background.copy(), Image.new("L", background.size, 0)
        silhouettes = _draw(camera, placed, image, ids, light, brightness)
        frames[f] = _noisy(np.asarray(image), rng, brightness)
        truth += _frame_truth(camera, f, np.asarray(ids), movers, headings, silhouettes, min_visible_px)
    return Video(camera, frames, tuple(truth))


def _noisy(pixels: np.ndarray, rng: np.random.Generator, brightness: float) -> np.ndarray:
    """Sensor noise; the sky and ground dim and brighten with the light like the objects do."""
    lit = pixels.astype(np.float32) * (0.85 + 0.15 * brightness) + rng.normal(0, 4.0, size=pixels.shape)
    return np.clip(lit, 0, 255).astype(np.uint8)


def _frame_truth(camera: Camera, frame: int, ids: np.ndarray, movers: Sequence[_Mover],
                 headings: dict[int, float], silhouettes: dict[int, int], min_visible_px: int) -> list[ObjectTruth]:
    records = []
    by_id = {m.track_id: m for m in movers}
    for track_id, heading in headings.items():
        ys, xs = np.nonzero(ids == track_id)
        if len(xs) < min_visible_px:
            continue
        m = by_id[track_id]
        pos = m.start + m.velocity * (frame - m.start_frame)
        elevation, azimuth = _view_angles(camera, pos, heading)
        box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        visible = round(len(xs) / max(silhouettes[track_id], 1), 3)
        records.append(ObjectTruth(frame, track_id, m.label, box, len(xs), visible, round(elevation, 2),
                                   round(azimuth, 2)))
    return records


def write_video(video: Video, out: Path) -> Path:
    """Frames as ``frame_00000.png`` ... and ``truth.json`` (camera and per-object truth) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for f, pixels in enumerate(video.frames):
        Image.fromarray(pixels).save(out / f"frame_{f:05d}.png")
    write_json(out / "truth.json", {"camera": asdict(video.camera), "classes": list(CLASSES),
                                    "objects": [asdict(t) for t in video.truth]})
    return out
