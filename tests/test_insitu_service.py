"""The in-situ service: kill -9 and resume, the student's process, promotion, the camera sources."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgetrain.errors import EdgetrainError
from edgetrain.insitu.camera import camera_chunks
from edgetrain.insitu.detect import Detection
from edgetrain.insitu.gate import Calibration
from edgetrain.insitu.inference import Serving
from edgetrain.insitu.model import classifier
from edgetrain.insitu.motion import MotionConfig, detect_motion, match_sources, score_boxes
from edgetrain.insitu.store import FrameStore, encode_png
from edgetrain.insitu.student import StudentConfig, held_out, load_promoted, write_config
from edgetrain.insitu.teacher import Teacher, load_teacher, save_teacher
from edgetrain.insitu.world import CLASSES, POLE, STEEP, ObjectTruth, Video, render_video, write_video

pytest.importorskip("scipy")

RUN = ["--camera", "0", "--memory", "1GiB", "--frames", "100", "--chunk-frames", "25", "--student-steps", "30",
       "--round-steps", "5"]


def _sure_teacher(path: Path, label: int = 0, logit: float = 3.0) -> Path:
    """A teacher sure of ``label`` (0.87 at ``logit`` 3) on every crop, with a gate that trusts whatever is sure: every
    track labelled.

    It stands in for a trained teacher (tens of seconds to train) where the test is about the
    service's mechanics, not accuracy.
    """
    model = classifier(len(CLASSES), 0)
    with torch.no_grad():
        model[-1].weight.zero_()
        model[-1].bias.copy_(torch.tensor([logit if c == label else 0.0 for c in range(len(CLASSES))]))
    n = len(CLASSES)
    calibration = Calibration(np.zeros((n, 64)), np.ones(64), float("inf"),
                              np.tile([-np.inf, np.inf], (n, 1)))
    rng = np.random.default_rng(0)
    replay = rng.integers(0, 256, size=(128, 32, 32, 3), dtype=np.uint8)
    return save_teacher(Teacher(model.eval(), calibration, replay, np.arange(128) % n), path)


def _service(store: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "edgetrain", "insitu", "run", "--store", str(store), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def _events(lines: list[str], event: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, lines) if r["event"] == event]


def _manifest(store: Path) -> dict[str, Any]:
    return dict(json.loads((store / "frames" / "manifest.json").read_text()))


def _wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still running {timeout_s} s after its service was killed")


def _run_until(store: Path, seen_enough: Any) -> list[str]:
    """Run the service until ``seen_enough(lines)``, then kill -9 it; waits for its student to die too."""
    service = _service(store, *RUN)
    assert service.stdout is not None
    seen: list[str] = []
    for line in service.stdout:
        seen.append(line)
        if seen_enough(seen):
            break
    os.kill(service.pid, signal.SIGKILL)
    service.wait()
    for start in _events(seen, "student_start"):
        _wait_gone(start["pid"])  # the kernel kills the student with its parent (PR_SET_PDEATHSIG)
    return seen


def _whole(store: Path, manifest: dict[str, Any]) -> dict[str, int]:
    listed = {f["name"]: f["nbytes"] for f in manifest["frames"]}
    for name, nbytes in listed.items():
        assert (store / "frames" / name).stat().st_size == nbytes
    return listed


@pytest.mark.slow
def test_a_service_killed_9_resumes_where_it_stopped(tmp_path: Path) -> None:
    # Prepare: a store with its teacher, so the run starts at the stream at once.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")

    # Execute: kill -9 mid-stream (2 chunks stored), rerun and kill -9 mid-training (a state saved), rerun to the end.
    first = _run_until(store, lambda seen: len(_events(seen, "chunk")) == 2)
    after_first = _manifest(store)
    second = _run_until(store, lambda seen: len(_events(seen, "student")) >= 1)
    after_second = _manifest(store)
    third = _service(store, *RUN)
    out, _ = third.communicate(timeout=300)
    lines = out.splitlines()

    # Assert: every listed frame whole after each kill, and still listed at the end (the quota is far from full).
    assert third.returncode == 0
    final = _manifest(store)
    listed = [_whole(store, m) for m in (after_first, after_second, final)]
    assert listed[0].items() <= listed[1].items() <= listed[2].items() and len(listed[0]) > 0
    # The stream continues at the manifest's cursor: every chunk once, in order, over the three runs.
    assert _events(second, "start")[0]["resumed_frames"] == after_first["cursor"] >= 50
    assert _events(lines, "start")[0]["resumed_frames"] == after_second["cursor"] == final["cursor"] == 100
    chunks = [c["first_frame"] for run in (first, second, lines) for c in _events(run, "chunk")]
    assert chunks == [0, 25, *range(after_first["cursor"], 100, 25)]
    # The student continues at its saved step.
    killed_step = _events(second, "student")[-1]["step"]
    resumed = _events(lines, "student_start")[0]["resumed_step"]
    assert resumed >= killed_step and resumed % 5 == 0
    assert [s["step"] for s in _events(lines, "student")] == list(range(resumed + 5, 31, 5))
    done = _events(lines, "done")[0]
    assert done["frames"] == 100 and done["stored_frames"] == len(final["frames"])
    # The student ran at idle priority on one thread, its plan inside the budget its share of --memory left.
    start = _events(lines, "student_start")[0]
    assert start["priority"] in ("SCHED_IDLE", "nice 19") and start["threads"] == 1
    assert start["process_bytes"] == 2**29 == _events(lines, "start")[0]["inference_bytes"]
    assert start["planned_step_peak_bytes"] <= start["tensor_budget_bytes"]
    assert all(s["peak_rss_bytes"] <= s["process_bytes"] for s in _events(lines, "student"))
    # The first chunk of a run goes before the student starts, the next one beside it.
    assert [c["student_running"] for c in _events(first, "chunk")] == [False, True]
    # Status lines of both processes and all runs are in status.jsonl, whole.
    status = (store / "status.jsonl").read_text().splitlines()
    assert len(_events(status, "start")) == 3 and _events(status, "done") == [done]


def test_a_student_budget_below_its_least_step_is_its_refusal_and_the_service_reports_its_cause(
        tmp_path: Path) -> None:
    from edgetrain.insitu.service_config import ServiceConfig
    from edgetrain.insitu.supervisor import start_student, student_failed

    # Prepare: a store with its teacher; a student started as the service starts it, on 100 MiB, which the
    # service's floor (NOTE [ An unattended node's service ]) is too coarse to refuse at the start.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")
    config = ServiceConfig(camera="0", memory_bytes=2**30)

    student = start_student(store, config, 100 * 2**20, quiet=True)
    try:
        student.wait(timeout=300)
    finally:
        student.kill()

    # The student's 100 MiB cannot hold PyTorch's runtime: its refusal is a status line, exit status 2, and the
    # service's one line carries it.
    assert student.returncode == 2
    refusal = _events((store / "status.jsonl").read_text().splitlines(), "student_error")
    assert [r["pid"] for r in refusal] == [student.pid]
    assert refusal[0]["error"].startswith("budget 100.00 MiB (104857600 bytes) is below what training needs in "
                                          "this process: runtime baseline ")
    assert str(student_failed(student, store)) == \
        f"the student process exited with status 2: {refusal[0]['error']}"


def test_a_student_that_beats_the_teacher_is_promoted_then_served(tmp_path: Path) -> None:
    # Prepare: a teacher sure of class 1 on everything; a store of bright crops its tracks labelled 0 (held out:
    # the tracks held_out() picks), and a student process of its own (no service: parent_pid 0).
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt", label=1)
    frames = FrameStore(store / "frames", quota_bytes=2**20)
    rng = np.random.default_rng(1)
    frames.add([(encode_png(rng.integers(180, 256, size=(32, 32, 3), dtype=np.uint8)), 0, track)
                for track in range(40) for _ in range(3)])
    held = sum(3 for track in range(40) if held_out(track))
    config = write_config(StudentConfig(store_dir=str(store), process_bytes=2**30, quota_bytes=2**20, steps=40,
                                        round_steps=20, lr=0.01, margin=0.5), store / "student.json")

    result = subprocess.run([sys.executable, "-m", "edgetrain.insitu.background", str(config)], capture_output=True,
                            text=True, timeout=300)

    # Assert: scored on the held-out tracks' frames against their (teacher-consistent) labels: the teacher is
    # wrong on all, the student learns them and is promoted.
    assert result.returncode == 0, result.stderr
    rounds = _events(result.stdout.splitlines(), "student")
    assert [(r["step"], r["held_out_frames"], r["train_frames"]) for r in rounds] == [(20, held, 120 - held),
                                                                                     (40, held, 120 - held)]
    assert 0 < held < 120 and all(r["teacher_accuracy"] == 0.0 for r in rounds)
    promoted = [r for r in rounds if r["promoted"]]
    assert promoted and all(r["student_accuracy"] >= 0.5 for r in promoted)
    _, step, accuracy = load_promoted(store / "model.pt")
    assert (step, accuracy) == (promoted[-1]["step"], promoted[-1]["student_accuracy"])
    # The inference path serves it from the next chunk on (and a rerun from its first frame).
    serving = Serving(classifier(len(CLASSES), 0))
    assert serving.reload_if_promoted(store / "model.pt") and serving.name == f"student@{step}"
    assert not serving.reload_if_promoted(store / "model.pt")  # unchanged: not loaded again


@pytest.mark.slow   # over 20 s on 2 cores
def test_a_student_promoted_after_the_last_chunk_is_what_the_service_serves_at_its_end(tmp_path: Path) -> None:
    # Prepare: a stream already stored (cursor at --frames) whose tracks are labelled 0, and a teacher that leans to 1:
    # the student learns them and is promoted after the last chunk.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt", label=1, logit=0.5)
    rng = np.random.default_rng(1)
    FrameStore(store / "frames", quota_bytes=2**20).add(
        [(encode_png(rng.integers(180, 256, size=(32, 32, 3), dtype=np.uint8)), 0, track)
         for track in range(40) for _ in range(3)], cursor=25)

    service = _service(store, "--camera", "0", "--memory", "1GiB", "--frames", "25", "--chunk-frames", "25",
                       "--student-steps", "20", "--round-steps", "10")
    out, _ = service.communicate(timeout=300)
    lines = out.splitlines()

    # No chunk left to take it at: the service takes it once the student is done, and says so.
    assert service.returncode == 0
    promoted = [s["step"] for s in _events(lines, "student") if s["promoted"]]
    assert _events(lines, "chunk") == [] and _events(lines, "start")[0]["serving"] == "teacher" and promoted
    assert _events(lines, "done")[0]["serving"] == f"student@{promoted[-1]}"


def test_a_folder_camera_gives_its_frames_in_chunks_from_the_cursor(tmp_path: Path) -> None:
    video = render_video(POLE, 30, seed=5, rate=0.12)
    write_video(video, tmp_path / "cam")

    chunks = list(camera_chunks(str(tmp_path / "cam"), 12, start=12))

    # Frames 12-23 and 24-29, truth re-indexed to each chunk's frames.
    assert [len(c.frames) for c in chunks] == [12, 6]
    assert np.array_equal(np.concatenate([c.frames for c in chunks]), video.frames[12:])
    assert [(t.frame + 12 + 12 * k, t.track_id) for k, c in enumerate(chunks) for t in c.truth] == \
        [(t.frame, t.track_id) for t in video.truth if t.frame >= 12]
    # A generated world's chunks are the simulation's node clips (the steep camera unless told).
    assert np.array_equal(next(camera_chunks("2", 20, start=20)).frames, render_video(STEEP, 20, 2301).frames)
    assert np.array_equal(next(camera_chunks("2", 20, start=0, preset="pole")).frames,
                          render_video(POLE, 20, 2300).frames)


def test_a_video_file_camera_gives_its_frames_in_chunks_from_the_cursor(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from typer.testing import CliRunner

    from edgetrain.cli import app

    # The generated world written by `insitu world --video` as lossless FFV1 and as H.264.
    runs = [CliRunner().invoke(app, ["insitu", "world", "--out", str(tmp_path / "cam"), "--frames", "30", "--seed",
                                     "5", "--video", str(tmp_path / name)]) for name in ("clip.mkv", "clip.mp4")]
    folder = np.concatenate([c.frames for c in camera_chunks(str(tmp_path / "cam"), 30, start=0)])

    lossless = list(camera_chunks(str(tmp_path / "clip.mkv"), 12, start=12, truth=False))
    lossy = np.concatenate([c.frames for c in camera_chunks(str(tmp_path / "clip.mp4"), 30, start=0, truth=False)])

    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    # Frames 12-23 and 24-29, every pixel as rendered (RGB, in order); seen from the node's mount, with no truth.
    assert [len(c.frames) for c in lossless] == [12, 6]
    assert np.array_equal(np.concatenate([c.frames for c in lossless]), folder[12:])
    assert all(c.camera == STEEP and c.truth == () for c in lossless)
    # H.264 is lossy: every frame there, within 30 dB of the rendered one (a channel swap or a shifted frame is not).
    assert lossy.shape == folder.shape
    mse = ((lossy.astype(float) - folder) ** 2).mean(axis=(1, 2, 3))
    assert (10 * np.log10(255**2 / mse)).min() > 30


def _numbered_frames(count: int) -> np.ndarray:
    """``count`` small RGB frames, each told apart by its red level and a bar that moves."""
    frames = np.zeros((count, 48, 64, 3), dtype=np.uint8)
    for t in range(count):
        frames[t, :, :, 0] = 2 * t
        frames[t, 5:20, t % 40:t % 40 + 10] = 255
    return frames


def _variable_rate_mkv(frames: np.ndarray, path: Path) -> None:
    """``frames`` as lossless FFV1 whose timestamps skip: frame ``i`` at ``i + i // 10`` fifteenths of a second."""
    import av

    with av.open(str(path), mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=15)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = index + index // 10, Fraction(1, 15)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def test_a_resumed_video_seeks_to_a_key_frame_and_gives_the_frames_a_full_decode_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("av")
    import edgetrain.insitu.video as video_module

    # Prepare: 120 frames as FFV1 and H.264 (constant rate: timestamps count frames) and as FFV1 whose timestamps
    # skip every tenth frame; a spy on the seek (NOTE [ Resuming inside a video ]).
    frames = _numbered_frames(120)
    files = [video_module.write_frames(frames, tmp_path / name, 15.0) for name in ("cam.mkv", "cam.mp4")]
    _variable_rate_mkv(frames, tmp_path / "vfr.mkv")
    sought: list[bool] = []
    seek = video_module._sought
    monkeypatch.setattr(video_module, "_sought", lambda *a: sought.append((got := seek(*a)) is not None) or got)
    # Execute / Assert: from each cursor, the frames of a decode from the first frame, every pixel, after a seek
    # where the rate is constant and by counting frames where it is not; past the end, none.
    for path in [*files, tmp_path / "vfr.mkv"]:
        whole = np.stack(list(video_module.read_frames(path)))
        assert len(whole) == 120
        for start in (1, 13, 50, 119):
            sought.clear()
            resumed = np.stack(list(video_module.read_frames(path, start)))
            assert np.array_equal(resumed, whole[start:]), (path.name, start)
            assert sought == [path.name != "vfr.mkv"], (path.name, start)
        assert list(video_module.read_frames(path, 120)) == []
    assert np.array_equal(np.stack(list(video_module.read_frames(files[0]))), frames)  # FFV1: lossless


def test_a_video_file_the_service_cannot_read_is_refused_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from edgetrain.insitu.video import write_frames

    small = write_frames(np.zeros((3, 96, 128, 3), dtype=np.uint8), tmp_path / "small.mkv", 5.0)
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    whole = write_frames(render_video(STEEP, 20, seed=1, rate=0.08).frames, tmp_path / "whole.mkv", 5.0).read_bytes()
    (tmp_path / "garbled.mkv").write_bytes(whole[:4000] + bytes(len(whole) - 8000) + whole[-4000:])

    with pytest.raises(EdgetrainError, match=r"video file, which carries no truth .* use --detector motion"):
        next(camera_chunks(str(small), 10, start=0))
    with pytest.raises(EdgetrainError, match="is 128x96, the node's mount sees 256x192"):
        next(camera_chunks(str(small), 10, start=0, truth=False))
    with pytest.raises(EdgetrainError, match="not a video FFmpeg can read"):
        next(camera_chunks(str(tmp_path / "junk.mp4"), 10, start=0, truth=False))
    with pytest.raises(EdgetrainError, match=r"garbled.mkv': the data after frame \d+ cannot be decoded"):
        next(camera_chunks(str(tmp_path / "garbled.mkv"), 10, start=0, truth=False))


@pytest.mark.slow   # over 20 s on 2 cores
def test_the_service_runs_on_a_video_file_with_the_motion_detector(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from edgetrain.insitu.video import write_frames

    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")
    video = write_frames(render_video(STEEP, 50, seed=2300, rate=0.08).frames, tmp_path / "cam.mkv", 5.0)

    service = _service(store, "--camera", str(video), "--detector", "motion", "--memory", "1GiB", "--chunk-frames",
                       "25", "--student-steps", "10", "--round-steps", "5")
    out, _ = service.communicate(timeout=300)
    lines = out.splitlines()

    # The whole file, in two chunks, its moving objects boxed, tracked, labelled and stored; then the end of the file.
    assert service.returncode == 0
    assert [c["first_frame"] for c in _events(lines, "chunk")] == [0, 25]
    done = _events(lines, "done")[0]
    assert done["frames"] == 50 and done["stored_frames"] == len(_manifest(store)["frames"]) > 0


def test_a_bad_camera_is_refused_at_once_and_a_cursor_inside_a_chunk_gives_the_rest_of_it_first(
        tmp_path: Path) -> None:
    with pytest.raises(EdgetrainError, match="neither a seed, a video file nor a folder"):
        camera_chunks(str(tmp_path), 10, start=0)  # at the call: before the service does any work

    chunks = list(camera_chunks("0", 10, start=15, stop=32))

    # Frames 15-19 (the rest of chunk 1), 20-29 and 30-31 (chunk 3 cut at the stop): chunk k stays frames 10k on.
    assert [len(c.frames) for c in chunks] == [5, 10, 2]
    assert np.array_equal(chunks[0].frames, render_video(STEEP, 10, 301).frames[5:])
    assert np.array_equal(chunks[1].frames, render_video(STEEP, 10, 302).frames)
    assert np.array_equal(chunks[2].frames, render_video(STEEP, 10, 303).frames[:2])


# --- the motion detector ---------------------------------------------------------------------------
def _moving_square(frames: int = 30) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Noisy grey frames (60x80), a static block slowly brightening, a 16x12 square moving right 2 px a frame."""
    rng = np.random.default_rng(0)
    video = np.clip(100 + rng.normal(0, 2, size=(frames, 60, 80, 1)), 0, 255).repeat(3, axis=3)
    boxes = []
    for f in range(frames):
        video[f, 40:55, 60:75] = 60 + f  # a static block, 1 grey level brighter each frame (the light turning)
        x = -16 + 2 * f
        video[f, 10:22, max(x, 0):max(x + 16, 0)] = 200
        boxes.append((x, 10, x + 16, 22))
    return video.astype(np.uint8), boxes


def test_the_motion_detector_boxes_what_moves_and_not_what_brightens() -> None:
    frames, truth = _moving_square()

    detections = detect_motion(frames, MotionConfig(dilate_px=2))

    # From the frame the square is whole in the image: exactly one box, the square grown by the dilation (2 px).
    whole = [f for f in range(len(frames)) if truth[f][0] >= 2 and truth[f][2] <= 78]
    by_frame = {f: [d.box for d in detections if d.frame == f] for f in whole}
    assert whole and all(by_frame[f] == [(truth[f][0] - 2, 8, truth[f][2] + 2, 24)] for f in whole)
    assert all(d.box[1] < 30 for d in detections)  # nothing on the brightening block


def test_boxes_are_scored_one_to_one_at_iou_half() -> None:
    truth = (ObjectTruth(0, 7, 1, (0, 0, 10, 14), 140, 1.0, 45.0, 0.0),
             ObjectTruth(0, 8, 2, (20, 0, 30, 14), 140, 1.0, 45.0, 0.0))
    video = Video(POLE, np.zeros((1, 40, 40, 3), dtype=np.uint8), truth)
    detections = [Detection(0, (0, 0, 10, 16)),  # IoU 140/160 with 7
                  Detection(0, (1, 0, 11, 14)),  # IoU 126/154 with 7, but 7 is taken: a duplicate
                  Detection(0, (25, 0, 35, 14))]  # IoU 70/210 with 8: below 0.5

    sources = match_sources(detections, video)

    assert sources == [7, 0, 0]
    assert score_boxes(detections, sources, video) == {"detections": 3, "true_positives": 1,
                                                       "detectable_objects": 2, "detectable_found": 1}


# --- the report --------------------------------------------------------------------------------------
def test_the_report_plots_teacher_and_student_over_time(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from edgetrain.cli import app

    records = [{"event": "chunk", "time": 100.0, "cursor": 200, "stored_frames": 150},
               {"event": "student", "time": 130.0, "step": 25, "teacher_accuracy": 0.8, "student_accuracy": 0.7,
                "promoted": False},
               {"event": "student", "time": 160.0, "step": 50, "teacher_accuracy": 0.8, "student_accuracy": 0.9,
                "promoted": True}]
    (tmp_path / "status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    result = CliRunner().invoke(app, ["insitu", "report", str(tmp_path), "-o", str(tmp_path / "plot.png")])
    (tmp_path / "early.jsonl").write_text(json.dumps(records[0]) + "\n")
    early = CliRunner().invoke(app, ["insitu", "report", str(tmp_path / "early.jsonl"), "-o", str(tmp_path / "x.png")])

    assert result.exit_code == 0, result.output
    assert "2 student rounds, last at step 50: student 0.900, teacher 0.800, 1 promotion(s)" in result.stdout
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert early.exit_code == 2 and not (tmp_path / "x.png").exists()
    assert early.stderr.strip() == f"error: {tmp_path / 'early.jsonl'} has no student status lines (has the student " \
                                   f"trained a round yet?)"


def _state(pid: int) -> str:
    """The process's scheduler state from /proc (``T``: stopped by a signal)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _state_within(pid: int, wanted: str, timeout_s: float = 2.0) -> str:
    """The state once it is ``wanted`` or after ``timeout_s``: a signal is delivered asynchronously."""
    deadline = time.monotonic() + timeout_s
    while (state := _state(pid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    return state


@pytest.mark.parametrize("pause_per_frame", [True, False])
def test_the_student_is_stopped_while_a_frame_is_inferred_and_runs_between(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pause_per_frame: bool) -> None:
    from collections import deque

    from edgetrain.insitu import inference
    from edgetrain.insitu.service_config import ServiceConfig

    teacher = load_teacher(_sure_teacher(tmp_path / "teacher.pt"))
    video = render_video(STEEP, 12, seed=1, rate=0.3)  # detections on frames 4-11
    student = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
    states_in_frames: list[str] = []
    real_predict = inference.predict

    def predict_noting_the_student(model: torch.nn.Sequential, crops: np.ndarray) -> Any:
        states_in_frames.append(_state_within(student.pid, "T") if pause_per_frame else _state(student.pid))
        return real_predict(model, crops)

    monkeypatch.setattr(inference, "predict", predict_noting_the_student)
    config = ServiceConfig(camera="0", memory_bytes=2**30, chunk_frames=12, pause_per_frame=pause_per_frame)
    try:
        _, latencies_s, _ = inference.infer_chunk(video, 0, teacher, Serving(teacher.model), config, deque(), student)
        after = _state_within(student.pid, "S")
    finally:
        student.kill()
        student.wait()

    # Two classifications (the serving model's, the teacher's) a frame with detections.
    assert len(states_in_frames) == 2 * len(latencies_s) > 0
    if pause_per_frame:
        assert set(states_in_frames) == {"T"}
    else:
        assert "T" not in states_in_frames
    assert after == "S"  # continued once the frames are answered (it sleeps in its loop)


@pytest.mark.parametrize(("rate_hz", "work_s", "arrivals_s"), [
    (10.0, [0.03] * 4, [0.0, 0.1, 0.2, 0.3]),  # faster than the camera: each frame waits for its time
    (10.0, [0.15] * 4, [0.0, 0.15, 0.3, 0.45]),  # slower: frames are there at once, none is waited for
    (10.0, [0.25, 0.01, 0.01, 0.01], [0.0, 0.25, 0.26, 0.3]),  # late once: the queued frames, then on time again
    (None, [0.03] * 4, [0.0, 0.03, 0.06, 0.09]),  # no rate: as fast as the path goes
])
def test_frames_arrive_at_the_cameras_times_or_at_once_when_late(
        monkeypatch: pytest.MonkeyPatch, rate_hz: float | None, work_s: list[float], arrivals_s: list[float]) -> None:
    from edgetrain.insitu import inference

    now = [0.0]

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            now[0] += seconds

    monkeypatch.setattr(inference, "time", Clock)
    arrivals = inference._arrivals(rate_hz)
    seen = []
    for work in work_s:
        next(arrivals)
        seen.append(now[0])
        now[0] += work
    assert seen == pytest.approx(arrivals_s, abs=1e-12)


@pytest.mark.slow
def test_the_whole_service_stays_inside_its_memory_as_the_kernel_counts_it(tmp_path: Path) -> None:
    from test_process_budget import memory_cgroup, run_in

    # A cgroup whose limit is --memory holds the inference process and the student it starts (a child
    # inherits its parent's cgroup); the kernel kills the service if both together go above it.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")  # a node ships with its teacher: no training inside the budget
    memory_bytes = 2**30
    with memory_cgroup(memory_bytes) as cgroup:
        result = run_in(cgroup, "insitu", "run", "--store", str(store), *RUN)
        kernel_peak_bytes = cgroup.peak_bytes()

    assert result.returncode == 0, result.stderr[-2000:]
    done = _events(result.stdout.splitlines(), "done")[-1]
    assert done["frames"] == 100 and done["within_memory"]
    assert done["service_peak_rss_bytes"] <= memory_bytes
    # The kernel's count (page cache included) stayed under the limit too, or the run would have been killed.
    assert kernel_peak_bytes is None or kernel_peak_bytes <= memory_bytes
    # The same service in a cgroup of half what it used is killed: the limit binds. The kernel's OOM killer takes
    # the larger process: the service itself, or its student, whose death the service then reports (not a refusal).
    shutil.rmtree(store / "frames")
    shutil.rmtree(store / "student", ignore_errors=True)
    with memory_cgroup(done["service_peak_rss_bytes"] // 2) as cgroup:
        starved = run_in(cgroup, "insitu", "run", "--store", str(store), *RUN)
    student_killed = starved.returncode == 2 and \
        f"the student process exited with status {-signal.SIGKILL}" in starved.stderr
    assert starved.returncode == -signal.SIGKILL or student_killed, (starved.returncode, starved.stderr[-2000:])


@pytest.mark.parametrize("gate_px", [8.0, 0.0])
def test_the_services_tracker_cuts_tracks_at_the_configured_motion_gate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate_px: float) -> None:
    from collections import deque

    from edgetrain.insitu import inference
    from edgetrain.insitu.service_config import ServiceConfig

    teacher = load_teacher(_sure_teacher(tmp_path / "teacher.pt"))
    video = render_video(STEEP, 12, seed=1, rate=0.3)
    gates: list[float] = []
    real_track = inference.track

    def track_noting_the_gate(detections: Any, config: Any) -> Any:
        gates.append(config.max_jump_px)
        return real_track(detections, config)

    monkeypatch.setattr(inference, "track", track_noting_the_gate)
    config = ServiceConfig(camera="0", memory_bytes=2**30, chunk_frames=12, motion_gate_px=gate_px)
    inference.infer_chunk(video, 0, teacher, Serving(teacher.model), config, deque())
    assert gates == [gate_px]
    from edgetrain.insitu.simulate import SimulateConfig
    assert ServiceConfig(camera="0", memory_bytes=2**30).motion_gate_px == SimulateConfig.motion_gate_px
