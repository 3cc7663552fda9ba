"""The node's camera as a stream of chunks: a generated world, a folder of frames or a video file.

A camera the service cannot read is refused before any work (NOTE [ An unattended node's service ]), and a stream
resumed inside a chunk gives the rest of that chunk first, so chunk k is always frames ``k * chunk_frames`` on.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import EdgetrainError
from .video import probe_video, read_frames
from .world import Camera, ObjectTruth, Video, node_camera, render_video

__all__ = ["check_camera", "camera_chunks", "clip"]


def check_camera(camera: str, *, truth: bool = True, preset: str = "steep") -> None:
    """Refuse, before any work, a camera the service cannot read (NOTE [ An unattended node's service ]).

    ``camera`` is a seed, a folder of ``frame_*.png`` (with ``truth.json`` where ``truth``: the stand-in detector
    reads it) or a video file whose first frame decodes at the mount's size (the motion detector only).

    Raises:
        EdgetrainError: naming ``--camera`` and what is wrong with it.
    """
    mount = node_camera(preset)
    if camera.isdigit():
        return
    if Path(camera).is_file():  # NOTE [ A video file as the camera ]
        if truth:
            raise EdgetrainError(f"--camera {camera!r} is a video file, which carries no truth for the stand-in "
                                 "detector: use --detector motion")
        probe_video(Path(camera), (mount.width_px, mount.height_px))
        return
    folder = Path(camera)
    if not any(folder.glob("frame_*.png")) or (truth and not (folder / "truth.json").exists()):
        raise EdgetrainError(f"--camera {camera!r} is neither a seed, a video file nor a folder of frame_*.png"
                             + (" with truth.json (from `edgetrain insitu world`; --detector motion needs none)"
                                if truth else ""))


def camera_chunks(camera: str, chunk_frames: int, start: int, *, stop: int | None = None, truth: bool = True,
                  preset: str = "steep", held: Callable[[int], None] | None = None) -> Iterator[Video]:
    """The camera stream from frame ``start`` to frame ``stop`` (None: its end) in chunks, as videos.

    Chunk k is frames ``k * chunk_frames`` to ``(k + 1) * chunk_frames``; a ``start`` inside a chunk gives the
    rest of that chunk first (NOTE [ An unattended node's service ]), and ``stop`` cuts the last one. A generated
    world's chunk k is ``render_video(camera, chunk_frames, seed * 1000 + 300 + k)`` with the preset ``preset``
    (:data:`~edgetrain.insitu.world.NODE_CAMERAS`; a folder without truth.json is taken to be seen from that
    mount) (the first ones are ``insitu simulate``'s node clips when ``chunk_frames`` is its ``node_frames``);
    endless. A folder (``edgetrain insitu world --out``) gives its frames in order; its ``truth.json`` feeds the
    stand-in detector only (NOTE [ The stand-in detector ]), and is not needed (``truth=False``) by the motion
    detector, the only one a video file can feed (NOTE [ A video file as the camera ]). ``held``: for a video
    file, called with the frames it holds once it is read to its end (NOTE [ A video file cut short ]).

    Raises:
        EdgetrainError: at the call, a camera that cannot be read (:func:`check_camera`).
    """
    check_camera(camera, truth=truth, preset=preset)
    bounds = _chunk_bounds(start, chunk_frames, stop)
    mount = node_camera(preset)
    if camera.isdigit():
        return _generated_chunks(int(camera), chunk_frames, bounds, mount)
    if Path(camera).is_file():
        return _video_chunks(Path(camera), start, bounds, mount, held)
    return _folder_chunks(Path(camera), bounds, mount)


def _chunk_bounds(start: int, chunk_frames: int, stop: int | None) -> Iterator[tuple[int, int]]:
    """(first, stop) of each chunk from frame ``start``: the rest of the chunk ``start`` is in, then whole ones,
    the last cut at ``stop``."""
    first = start
    while stop is None or first < stop:
        end = (first // chunk_frames + 1) * chunk_frames
        yield first, end if stop is None else min(end, stop)
        first = end


def _generated_chunks(seed: int, chunk_frames: int, bounds: Iterator[tuple[int, int]],
                      mount: Camera) -> Iterator[Video]:
    for first, end in bounds:
        k = first // chunk_frames
        video = render_video(mount, chunk_frames, seed * 1000 + 300 + k, rate=0.08)
        yield clip(video, first - k * chunk_frames, end - k * chunk_frames)


def _folder_chunks(folder: Path, bounds: Iterator[tuple[int, int]], mount: Camera) -> Iterator[Video]:
    from PIL import Image

    paths = sorted(folder.glob("frame_*.png"))
    truth: list[ObjectTruth] = []
    cam = mount  # the node's mount (the posterior rule reads it); truth.json's camera, where there is one
    if (folder / "truth.json").exists():
        meta = json.loads((folder / "truth.json").read_text())
        cam = Camera(**meta["camera"])
        truth = [ObjectTruth(**{**t, "box": tuple(t["box"])}) for t in meta["objects"]]
    for first, end in bounds:
        chunk = paths[first:end]
        if not chunk:
            return
        frames = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in chunk])
        yield Video(cam, frames, tuple(replace(t, frame=t.frame - first) for t in truth
                                       if first <= t.frame < first + len(chunk)))


def _video_chunks(path: Path, start: int, bounds: Iterator[tuple[int, int]], mount: Camera,
                  held: Callable[[int], None] | None) -> Iterator[Video]:
    frames = read_frames(path, start, (mount.width_px, mount.height_px), held)
    for first, end in bounds:
        chunk = list(itertools.islice(frames, end - first))
        if not chunk:
            return
        yield Video(mount, np.stack(chunk), ())


def clip(video: Video, first: int, stop: int) -> Video:
    """Frames ``first`` to ``stop`` (exclusive) of ``video``, its truth re-indexed to them."""
    return Video(video.camera, video.frames[first:stop],
                 tuple(replace(t, frame=t.frame - first) for t in video.truth if first <= t.frame < stop))
