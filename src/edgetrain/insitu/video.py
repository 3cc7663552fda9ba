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

NOTE [ Resuming inside a video ]
A service resumed after a power cut goes on from its cursor, a frame index. Decoding every frame before it
costs minutes on an hour of recording, so the reader seeks to the key frame at or before the cursor and
decodes from there. A frame's index is read from its timestamp at the stream's constant rate, which holds
only where the timestamps count the frames. So the packets up to the first key frame past the cursor are
read first (demuxing only: no decoding) and must hold each index from 0 exactly once: a variable rate or a
gap makes an index appear twice or not at all. After the seek, each decoded frame must carry the next index
from the key frame's on. Where any check fails (or the stream has no rate, no timestamps, or cannot seek)
the reader opens the file again and counts decoded frames from the first. Not covered: a decoder
that drops a frame it cannot decode before the cursor, where counting and timestamps part by that frame.

A rerun after the whole file is done starts at its end or past it: where the packets, read to the end of the
file, hold each index from 0 once and no index at or past the cursor, the file holds that many frames and
nothing is decoded.

NOTE [ A video file cut short ]
A recording stopped by a power cut keeps the frames written before it, and its header may still state the
length it was meant to have (Matroska writes the duration up front). The reader gives the frames the file
holds and, once it has read to the end, says how many that was (``held``); the service compares that with
the header's count (:func:`stated_frames`) and reports a file that ends early, in its status too. A file
with no frame it can decode (a header alone) is refused before any work (:func:`probe_video`).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EdgetrainError
from ..sysutil.fileio import write_atomic

__all__ = ["read_frames", "probe_video", "stated_frames", "write_frames"]

# Containers written by `write_frames`, with their codec and pixel format.
_WRITERS = {".mkv": ("matroska", "ffv1", "bgr0", {}), ".mp4": ("mp4", "libx264", "yuv420p", {"crf": "18"})}


def _av() -> Any:
    try:
        import av
    except ImportError as error:  # the extra is not installed
        raise EdgetrainError("reading or writing video needs PyAV: pip install 'edgetrain[video]'") from error
    return av


def read_frames(path: Path, start: int = 0, size: tuple[int, int] | None = None,
                held: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
    """The frames of the video at ``path`` from frame ``start`` on, each (H, W, 3) uint8 RGB.

    ``size``: the (width, height) every frame must have; a frame of another size is refused. A file cut short
    (a recording stopped by a power cut) gives the frames it holds; one whose data cannot be decoded is refused.
    A later ``start`` (a resumed service) seeks to the key frame before it (NOTE [ Resuming inside a video ]).
    ``held``: called with the number of frames the file holds once it is read to its end (NOTE [ A video file
    cut short ]).
    """
    av = _av()
    decoded = start  # frames decoded so far, for the error's message
    try:
        for frame in _decoded_from(av, path, start, held or (lambda count: None)):
            decoded += 1
            if size is not None and (frame.width, frame.height) != size:
                raise EdgetrainError(f"--camera {str(path)!r} is {frame.width}x{frame.height}, the node's mount "
                                     f"sees {size[0]}x{size[1]}: record at the mount's resolution")
            yield frame.to_ndarray(format="rgb24")
    except av.FFmpegError as error:
        raise EdgetrainError(f"--camera {str(path)!r}: the data after frame {decoded} cannot be decoded "
                             f"({error})") from error


def probe_video(path: Path, size: tuple[int, int] | None = None) -> None:
    """Refuse, before any work, a file that is no video FFmpeg reads, or whose first frame is missing or not of
    ``size`` (NOTE [ A video file cut short ])."""
    if next(read_frames(path, 0, size), None) is None:
        stated = stated_frames(path)
        raise EdgetrainError(f"--camera {str(path)!r} holds no frame that can be decoded"
                             + ("" if stated is None else f" (its header states {stated})"))


def stated_frames(path: Path) -> int | None:
    """The number of frames the header of the video at ``path`` states (its frame count, else its duration at
    its rate); None where it states neither."""
    av = _av()
    with _open(av, path) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        if container.duration is None or not stream.average_rate:
            return None
        return round(Fraction(container.duration, av.time_base) * stream.average_rate)


def _open(av: Any, path: Path) -> Any:
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as error:
        raise EdgetrainError(f"--camera {str(path)!r}: not a video FFmpeg can read ({error})") from error
    if not container.streams.video:
        container.close()
        raise EdgetrainError(f"--camera {str(path)!r} has no video stream")
    return container


def _decoded_from(av: Any, path: Path, start: int, held: Callable[[int], None]) -> Iterator[Any]:
    """The decoded frames of ``path`` from index ``start`` on: after a seek where the timestamps allow one, else
    every frame decoded from the first; ``held`` gets the file's frame count once the last is given."""
    if start:
        with _open(av, path) as container:
            frames = _sought(av, container, container.streams.video[0], start, held)
            if frames is not None:
                yield from frames
                return
    with _open(av, path) as container:
        count = 0
        for frame in container.decode(video=0):
            if count >= start:
                yield frame
            count += 1
        held(count)


def _sought(av: Any, container: Any, stream: Any, start: int, held: Callable[[int], None]) -> Iterator[Any] | None:
    """Frames ``start`` on after seeking to the key frame at or before it (none where the file ends before it),
    or None where the timestamps do not count the frames up to it (NOTE [ Resuming inside a video ])."""
    index_of = _frame_index(stream)
    if index_of is None:
        return None
    scan = _scan_to(container, stream, start, index_of)
    if scan is None:
        return None
    if scan.frames is not None:  # the file ends before the cursor: nothing to decode
        return _counted(iter(()), scan.frames, held)
    if scan.key is None:
        return None
    try:
        container.seek(scan.key, stream=stream, backward=True, any_frame=False)
    except av.FFmpegError:
        return None
    decoded = container.decode(stream)
    expected = index_of(scan.key)
    for frame in decoded:
        if frame.pts is None or index_of(frame.pts) != expected:
            return None
        if expected == start:
            return _counted(itertools.chain([frame], decoded), start, held)
        expected += 1
    return None


def _counted(frames: Iterator[Any], first: int, held: Callable[[int], None]) -> Iterator[Any]:
    """``frames``, from index ``first`` on, then ``held`` told the index they end at (the file's frame count)."""
    count = first
    for frame in frames:
        yield frame
        count += 1
    held(count)


def _frame_index(stream: Any) -> Callable[[int], int] | None:
    """A frame's index from its timestamp at the stream's constant rate, or None without a rate or a first
    timestamp."""
    rate, first, unit = stream.average_rate, stream.start_time, stream.time_base
    if not rate or first is None or not unit:
        return None
    return lambda pts: round((pts - first) * unit * rate)


@dataclass(frozen=True)
class _Scan:
    """What the packets up to frame ``start`` say: the last key frame at or before it (``key``), or, where the
    file ends first, how many frames it holds (``frames``); either is None where the packets do not tell."""

    key: int | None
    frames: int | None


def _scan_to(container: Any, stream: Any, start: int, index_of: Callable[[int], int]) -> _Scan | None:
    """The packets up to the first key frame past frame ``start`` read alone (no decoding), or None where they do
    not hold each index from 0 once (NOTE [ Resuming inside a video ]). The packets are read again from the first
    after this (the caller seeks)."""
    seen: set[int] = set()
    key = None
    ended = True
    for packet in container.demux(stream):
        if packet.pts is None:
            if packet.size:
                return None  # a frame without a timestamp: no index to read
            continue
        index = index_of(packet.pts)
        if packet.is_keyframe and index > start:
            ended = False
            break
        if index in seen:
            return None
        seen.add(index)
        if packet.is_keyframe:  # at or before start: a later one ended the loop
            key = packet.pts
    if seen != set(range(len(seen))):
        return None
    if len(seen) > start:
        return _Scan(key=key, frames=None)
    return _Scan(key=None, frames=len(seen)) if ended else None


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
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, encoded.getvalue())
