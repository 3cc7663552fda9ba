"""A procedural image-classification dataset, drawn from a seed and written as real image files.

Why files and not tensors: the point of edgetrain's data tools is the real loading path (open,
read, decode, resize, normalise) on slow edge storage, so the built-in dataset goes through
exactly that path. Each class is one (shape, colour) pair -- eight shapes, eight colours, up
to 64 classes -- drawn at a random position, size and rotation, with colour jitter, over a
random gradient-and-stripes background, plus pixel noise. A small CNN learns it well above
chance in a few epochs; it is not trivially separable by mean colour because the backgrounds
vary more than the objects.

Layout under ``root``::

    manifest.json                   # seed, sizes, split, class names, file list
    train/<class name>/<index>.png  # every class folder exists in both splits, maybe empty
    val/<class name>/<index>.png

Generation is deterministic (sample ``i`` is drawn from ``numpy.random.default_rng([seed, i])``)
and idempotent: a complete dataset with the same manifest is reused; otherwise the whole tree
is written to a temporary sibling folder and renamed into place, after checking that disk and
memory hold it (see NOTE [ Generated datasets on a node nobody watches ] in ``generated.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DatasetSpecError
from .generated import MANIFEST_NAME, disk_bytes_of_files, ensure_generated, stratified_split, write_manifest
from .generated import read_manifest as read_generated_manifest

__all__ = ["COLOURS", "MANIFEST_NAME", "SHAPES", "SyntheticSpec", "generate_synthetic", "read_manifest"]

logger = logging.getLogger(__name__)

_MANIFEST_KIND = "edgetrain-synthetic"
_MANIFEST_VERSION = 1
SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond", "star", "bar")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 90, 230), "yellow": (235, 215, 40),
    "magenta": (205, 50, 205), "cyan": (40, 205, 215), "orange": (245, 140, 30), "white": (245, 245, 245),
}
MAX_CLASSES = len(SHAPES) * len(COLOURS)
_FORMATS = {"png": ("PNG", ".png"), "jpeg": ("JPEG", ".jpg"), "jpg": ("JPEG", ".jpg")}
_SUPERSAMPLE = 2  # draw at twice the size and downsample, for antialiased edges
_NOISE_STD = 6.0  # pixel noise, in 0..255 units
# Room estimates, measured at 64-256 px and rounded up: drawing peaks at ~355 bytes of numpy
# arrays per output pixel (float64 planes at twice the side); a noisy PNG takes ~2 bytes per pixel
# (raw RGB is 3), a quality-90 JPEG 0.1-0.5.
_DRAW_BYTES_PER_PIXEL = 400
_FILE_BYTES_PER_PIXEL = {"PNG": 3, "JPEG": 1}
_FILE_HEADER_BYTES = 1024


@dataclass(frozen=True)
class SyntheticSpec:
    """What determines a synthetic dataset; two equal specs give byte-identical image files."""

    samples: int = 1000
    image_size: int = 32
    classes: int = 10
    seed: int = 0
    image_format: str = "png"
    val_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.image_format not in _FORMATS:
            raise DatasetSpecError(f"image_format must be one of {sorted(_FORMATS)}, got {self.image_format!r}")
        if not 2 <= self.classes <= MAX_CLASSES:
            raise DatasetSpecError(f"classes must be in 2..{MAX_CLASSES}, got {self.classes}")
        if self.samples < 1:
            raise DatasetSpecError(f"samples must be at least 1, got {self.samples}")
        if self.samples < self.classes:
            raise DatasetSpecError(f"need at least one sample per class: samples={self.samples} < "
                                   f"classes={self.classes}")
        if self.image_size < 8:
            raise DatasetSpecError(f"image_size must be at least 8 pixels, got {self.image_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise DatasetSpecError(f"val_fraction must be in [0, 1), got {self.val_fraction}")

    @property
    def extension(self) -> str:
        return _FORMATS[self.image_format][1]

    def class_names(self) -> list[str]:
        """``"07-white-star"``-style names; the number keeps sorted order equal to label order."""
        colours = list(COLOURS)
        return [f"{k:02d}-{colours[_colour_of(k)]}-{SHAPES[_shape_of(k)]}" for k in range(self.classes)]


def _shape_of(label: int) -> int:
    return label % len(SHAPES)


def _colour_of(label: int) -> int:
    # (shape, colour) pairs stay distinct for all 64 labels, and the first 8 differ in both
    return (label % len(SHAPES) + label // len(SHAPES)) % len(COLOURS)


# -- drawing ----------------------------------------------------------------------------------
def _background(rng: np.random.Generator, side: int) -> np.ndarray:
    """A dim two-colour gradient with faint stripes, (side, side, 3) float in 0..255."""
    low, high = rng.uniform(0, 150, size=3), rng.uniform(0, 150, size=3)
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:side, 0:side] / max(side - 1, 1)
    ramp = (np.cos(angle) * xs + np.sin(angle) * ys)
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-9)  # (side, side) in [0, 1]
    image = low + ramp[..., None] * (high - low)
    period = rng.uniform(0.15, 0.5) * side
    stripe_angle = rng.uniform(0, math.pi)
    phase = (np.cos(stripe_angle) * xs + np.sin(stripe_angle) * ys) * side / period
    return image + rng.uniform(5, 25) * np.sin(2 * math.pi * phase)[..., None]


def _rotated(points: Sequence[tuple[float, float]], angle: float, centre: tuple[float, float],
             radius: float) -> list[tuple[float, float]]:
    """Unit-radius local points, rotated by ``angle``, scaled by ``radius``, moved to ``centre``."""
    cos_a, sin_a = math.cos(angle), math.sin(angle)
    cx, cy = centre
    return [(cx + radius * (x * cos_a - y * sin_a), cy + radius * (x * sin_a + y * cos_a)) for x, y in points]


def _star_points(tips: int, inner: float) -> list[tuple[float, float]]:
    return [((1.0 if k % 2 == 0 else inner) * math.cos(math.pi * k / tips),
             (1.0 if k % 2 == 0 else inner) * math.sin(math.pi * k / tips)) for k in range(2 * tips)]


def _regular(n: int) -> list[tuple[float, float]]:
    return [(math.cos(2 * math.pi * k / n), math.sin(2 * math.pi * k / n)) for k in range(n)]


_ARM = 0.35
_POLYGONS: dict[str, list[tuple[float, float]]] = {
    "square": _regular(4),
    "triangle": _regular(3),
    "diamond": [(1.0, 0.0), (0.0, 0.55), (-1.0, 0.0), (0.0, -0.55)],
    "star": _star_points(5, 0.45),
    "bar": [(1.0, 0.3), (-1.0, 0.3), (-1.0, -0.3), (1.0, -0.3)],
    "cross": [(_ARM, 1), (-_ARM, 1), (-_ARM, _ARM), (-1, _ARM), (-1, -_ARM), (-_ARM, -_ARM), (-_ARM, -1),
              (_ARM, -1), (_ARM, -_ARM), (1, -_ARM), (1, _ARM), (_ARM, _ARM)],
}


def _draw_object(canvas: Any, shape: str, colour: tuple[int, int, int], rng: np.random.Generator,
                 side: int) -> None:
    """Draw one ``shape`` in ``colour`` on the PIL image ``canvas`` at a random place, size and angle."""
    from PIL import ImageDraw

    draw = ImageDraw.Draw(canvas)
    radius = rng.uniform(0.22, 0.34) * side
    centre = (side / 2 + rng.uniform(-0.15, 0.15) * side, side / 2 + rng.uniform(-0.15, 0.15) * side)
    angle = rng.uniform(0, 2 * math.pi)
    box = (centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=max(2, round(0.3 * radius)))
    else:
        draw.polygon(_rotated(_POLYGONS[shape], angle, centre, radius), fill=colour)


def render_sample(spec: SyntheticSpec, index: int) -> tuple[Any, int]:
    """The PIL image and label of sample ``index``; a pure function of ``(spec.seed, index)``."""
    from PIL import Image

    label = index % spec.classes
    rng = np.random.default_rng([spec.seed, index])
    side = spec.image_size * _SUPERSAMPLE
    background = np.clip(_background(rng, side), 0, 255).astype(np.uint8)
    canvas = Image.fromarray(background)
    base = np.array(list(COLOURS.values())[_colour_of(label)])
    red, green, blue = (int(c) for c in np.clip(base + rng.integers(-25, 26, size=3), 0, 255))
    _draw_object(canvas, SHAPES[_shape_of(label)], (red, green, blue), rng, side)
    small = np.asarray(canvas.resize((spec.image_size, spec.image_size), Image.Resampling.BOX), dtype=np.float64)
    noisy = np.clip(small + rng.normal(0.0, _NOISE_STD, size=small.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy), label


# -- split and manifest -----------------------------------------------------------------------
def split_indices(spec: SyntheticSpec) -> dict[str, list[int]]:
    """Sample indices of the train and val splits: per class, a seeded ``val_fraction`` goes to val."""
    return stratified_split(spec.samples, spec.classes, spec.seed, spec.val_fraction)


def _relative_path(spec: SyntheticSpec, split: str, index: int, names: Sequence[str]) -> str:
    return f"{split}/{names[index % spec.classes]}/{index:06d}{spec.extension}"


def _manifest(spec: SyntheticSpec) -> dict[str, Any]:
    names = spec.class_names()
    splits = split_indices(spec)
    return {
        "kind": _MANIFEST_KIND,
        "version": _MANIFEST_VERSION,
        "spec": asdict(spec),
        "class_names": names,
        "split_sizes": {split: len(indices) for split, indices in splits.items()},
        "files": {split: [_relative_path(spec, split, i, names) for i in indices] for split, indices in splits.items()},
    }


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    """The manifest of a synthetic image dataset at ``root``, or None when there is none or it is unreadable."""
    return read_generated_manifest(root, _MANIFEST_KIND)


# -- writing ----------------------------------------------------------------------------------
def _write_tree(folder: Path, spec: SyntheticSpec, manifest: dict[str, Any]) -> None:
    """Render every sample into ``folder``; the manifest is written last."""
    pil_format = _FORMATS[spec.image_format][0]
    for split in manifest["files"]:
        for name in manifest["class_names"]:
            (folder / split / name).mkdir(parents=True, exist_ok=True)
    names = manifest["class_names"]
    for split, indices in split_indices(spec).items():
        for index in indices:
            image, _ = render_sample(spec, index)
            options = {"quality": 90} if pil_format == "JPEG" else {}
            image.save(folder / _relative_path(spec, split, index, names), format=pil_format, **options)
    write_manifest(folder, manifest)


def _room_needed(spec: SyntheticSpec) -> tuple[int, int]:
    """Upper estimates of the dataset's bytes on disk and of the memory drawing one image takes."""
    pixels = spec.image_size ** 2
    file_bytes = _FILE_BYTES_PER_PIXEL[_FORMATS[spec.image_format][0]] * pixels + _FILE_HEADER_BYTES
    return disk_bytes_of_files(spec.samples, file_bytes), _DRAW_BYTES_PER_PIXEL * pixels


def generate_synthetic(root: str | Path, *, samples: int = 1000, image_size: int = 32, classes: int = 10,
                       seed: int = 0, image_format: str = "png", val_fraction: float = 0.2) -> Path:
    """Write (or reuse) the synthetic dataset the arguments describe at ``root``; return ``root``.

    Args:
        root: the dataset folder; created if missing. An existing folder is only replaced when it
            is empty or holds a synthetic dataset (another spec, or incomplete).
        samples: images in total (train + val); labels cycle 0, 1, ..., so classes are balanced.
        image_size: side of the square images, in pixels.
        classes: number of classes (2..64).
        seed: everything drawn (backgrounds, objects, noise, split) follows from it.
        image_format: "png" (lossless, deterministic) or "jpeg" (smaller files, costlier decode).
        val_fraction: share of each class held out in ``val/``.

    Returns:
        ``root``, holding ``manifest.json``, ``train/<class>/`` and ``val/<class>/``.

    Raises:
        DatasetSpecError: impossible settings (a ValueError too). DatasetTooLargeError: the files
            would not fit the free disk space, or drawing one image the available memory.
            DataError: ``root`` is someone else's folder.

    Example:
        >>> path = generate_synthetic("/tmp/shapes", samples=200, image_size=32, classes=4)  # doctest: +SKIP
        >>> sorted(p.name for p in (path / "train").iterdir())                               # doctest: +SKIP
        ['00-red-circle', '01-green-square', '02-blue-triangle', '03-yellow-cross']
    """
    spec = SyntheticSpec(samples=samples, image_size=image_size, classes=classes, seed=seed,
                         image_format=image_format, val_fraction=val_fraction)
    disk_bytes, memory_bytes = _room_needed(spec)
    return ensure_generated(
        Path(root).expanduser(), asdict(spec), _MANIFEST_KIND, lambda: _manifest(spec),
        lambda folder, manifest: _write_tree(folder, spec, manifest),
        what=f"{samples} synthetic {image_size}x{image_size} images ({classes} classes, seed {seed})",
        disk_bytes=disk_bytes, memory_bytes=memory_bytes)
