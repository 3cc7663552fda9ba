"""A video file as the node's camera: frames decoded by PyAV (FFmpeg), and the generated world written as one.

NOTE [ A video file as the camera ]
A camera node records to a file as often as it hands out frames one by one, so ``insitu run --camera``
takes a video file too. PyAV (the ``video`` extra) decodes it with FFmpeg's own decoders, so any container
and codec FFmpeg reads will do; frames come out as RGB arrays in presentation order. A file carries no
ground truth, so only the motion detector can box its objects; its frames must have the node mount's
resolution, since the size rule reads boxes through that mount's geometry (a resampled frame would
misstate every size).

``insitu world --video`` writes the generated world the other way: ``.mkv`` as FFV1 in RGB (bgr0),
lossless (a test reads back every pixel), ``.mp4`` as H.264 (libx264, lossy, the size a camera records).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EdgetrainError
from ..fileio import write_atomic

__all__ = ["read_frames", "write_frames"]

# Containers written by `write_frames`, with their codec and pixel format.
_WRITERS = {".mkv": ("matroska", "ffv1", "bgr0", {}), ".mp4": ("mp4", "libx264", "yuv420p", {"crf": "18"})}


def _av() -> Any:
    try:
        import av
    except ImportError as error:  # the extra is not installed
        raise EdgetrainError("reading or writing video needs PyAV: pip install 'edgetrain[video]'") from error
    return av


def read_frames(path: Path, start: int = 0, size: tuple[int, int] | None = None) -> Iterator[np.ndarray]:
    """The frames of the video at ``path`` from frame ``start`` on, each (H, W, 3) uint8 RGB.

    ``size``: the (width, height) every frame must have; a frame of another size is refused. A file cut short
    (a recording stopped by a power cut) gives the frames it holds; one whose data cannot be decoded is refused.
    """
    av = _av()
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as error:
        raise EdgetrainError(f"--camera {str(path)!r}: not a video FFmpeg can read ({error})") from error
    with container:
        if not container.streams.video:
            raise EdgetrainError(f"--camera {str(path)!r} has no video stream")
        decoded = 0
        try:
            for frame in container.decode(video=0):
                decoded += 1
                if decoded <= start:
                    continue
                if size is not None and (frame.width, frame.height) != size:
                    raise EdgetrainError(f"--camera {str(path)!r} is {frame.width}x{frame.height}, the node's mount "
                                         f"sees {size[0]}x{size[1]}: record at the mount's resolution")
                yield frame.to_ndarray(format="rgb24")
        except av.FFmpegError as error:
            raise EdgetrainError(f"--camera {str(path)!r}: the data after frame {decoded} cannot be decoded "
                                 f"({error})") from error


def write_frames(frames: np.ndarray, path: Path, rate_hz: float) -> Path:
    """Write ``frames`` (T, H, W, 3) uint8 RGB to ``path`` (.mkv: lossless FFV1 in RGB; .mp4: H.264) atomically."""
    av = _av()
    suffix = path.suffix.lower()
    if suffix not in _WRITERS:
        raise EdgetrainError(f"a video is written as {' or '.join(_WRITERS)}, not {suffix or 'no suffix'!r}")
    container_format, codec, pixel_format, options = _WRITERS[suffix]
    encoded = io.BytesIO()
    with av.open(encoded, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=Fraction(rate_hz).limit_denominator(1000), options=options)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = pixel_format
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")))
        container.mux(stream.encode(None))  # flush the encoder's delayed frames
    return write_atomic(path, encoded.getvalue())
