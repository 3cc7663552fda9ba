"""`edgetrain insitu run` on an unattended node: no orphan, one writer, the same command continues, refusal
before work (NOTE [ An unattended node's service ]).

The service runs as a service manager runs it (a subprocess of the real command line) where its processes,
its exit code or its stderr are what is checked; refusals run in-process (CliRunner), since they end before
any work. A store "unchanged" is byte for byte what it was, or still absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_insitu_service import RUN, _events, _manifest, _sure_teacher
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.insitu import service, supervisor
from edgetrain.insitu.inference import TRACKS_PER_CHUNK
from edgetrain.insitu.service_config import ServiceConfig
from edgetrain.insitu.store import FrameStore, encode_png
from edgetrain.insitu.teacher import load_teacher
from edgetrain.insitu.world import STEEP, render_video
from edgetrain.train.rundir import RunLockedError
from edgetrain.train.state import StateStore, TrainingState

ORPHAN_DEADLINE_S = 10.0


def _service(store: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgetrain", "insitu", "run", "--store", str(store), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _run(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", "insitu", "run", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _snapshot(directory: Path, *, leave_out: tuple[str, ...] = ()) -> dict[str, str] | None:
    """Every file and folder under ``directory`` with its SHA-256 (folders: ""); None where it does not exist."""
    if not directory.exists():
        return None
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            for p in sorted(directory.rglob("*")) if p.name not in leave_out}


def _trained_student(store: Path, steps: int) -> None:
    """A student state saved at ``steps``: with --student-steps ``steps`` no student process is started."""
    model = load_teacher(store / "teacher.pt").model
    StateStore(store / "student").save(TrainingState.capture(
        step=steps, epoch=0, model=model, optimizer=torch.optim.Adam(model.parameters()), rng=False,
        metadata={"promoted_accuracy": 0.0}))


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` now (children, their children, ...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return below


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _seconds_until_gone(pids: set[int], deadline_s: float) -> float:
    started = time.monotonic()
    while any(_alive(pid) for pid in pids):
        if time.monotonic() - started > deadline_s:
            raise AssertionError(f"{sorted(p for p in pids if _alive(p))} still running {deadline_s} s after "
                                 "their service was killed")
        time.sleep(0.01)
    return time.monotonic() - started


def _lines_until(process: subprocess.Popen[str], seen_enough: Any) -> list[str]:
    assert process.stdout is not None
    seen: list[str] = []
    for line in process.stdout:
        seen.append(line)
        if seen_enough(seen):
            return seen
    raise AssertionError(f"the service ended (status {process.wait()}) before it got there: {seen[-3:]}")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate()


# --- kill -9, and the same command again ------------------------------------------------------------
@pytest.mark.slow
def test_kill_9_leaves_no_process_and_the_same_command_then_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    # Prepare: two stores with the same teacher; one runs RUN uninterrupted.
    stores = {name: tmp_path / name for name in ("whole", "killed")}
    for store in stores.values():
        store.mkdir()
        _sure_teacher(store / "teacher.pt")
    whole = _run(stores["whole"], *RUN)
    assert whole.returncode == 0, whole.stderr

    # Execute: kill -9 the other once every chunk is stored and its student is training; the same command again.
    service_process = _service(stores["killed"], *RUN)
    try:
        seen = _lines_until(service_process, lambda lines: len(_events(lines, "chunk")) == 4
                            and _events(lines, "student"))
        tree = _descendants(service_process.pid)
        os.kill(service_process.pid, signal.SIGKILL)
        gone_s = _seconds_until_gone(tree | {service_process.pid}, ORPHAN_DEADLINE_S)
    finally:
        _stop(service_process)
    again = _run(stores["killed"], *RUN)

    # Assert: its student (the only child) was gone within the deadline.
    assert tree == {_events(seen, "student_start")[0]["pid"]}
    assert gone_s < ORPHAN_DEADLINE_S
    print(f"no process of the killed service left {gone_s:.3f} s after kill -9")
    # The rerun stored nothing (the stream was done) and trained the student on from its saved step to the end.
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert _events(lines, "chunk") == [] and _events(lines, "start")[0]["resumed_frames"] == 100
    resumed = _events(lines, "student_start")[0]["resumed_step"]
    assert resumed >= _events(seen, "student")[-1]["step"]
    assert [s["step"] for s in _events(lines, "student")] == list(range(resumed + 5, 31, 5))
    # What an uninterrupted run ends with: the same stored frames and cursor, the student at its last step.
    assert _manifest(stores["killed"]) == _manifest(stores["whole"])
    for store in stores.values():
        latest = StateStore(store / "student").load_latest()
        assert latest is not None and latest.step == 30
    done = [_events(run.splitlines(), "done")[-1] for run in (whole.stdout, again.stdout)]
    assert [(d["frames"], d["stored_frames"]) for d in done] == [(100, len(_manifest(stores["whole"])["frames"]))] * 2


# --- one writer ---------------------------------------------------------------------------------------
def test_a_second_service_on_a_live_store_is_refused_in_one_line_naming_the_holder(tmp_path: Path) -> None:
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")
    _trained_student(store, 5)  # no student process: the first service only infers, at a camera's pace

    first = _service(store, "--camera", "0", "--memory", "1GiB", "--chunk-frames", "25", "--frame-rate", "5",
                     "--student-steps", "5")
    try:
        _lines_until(first, lambda lines: _events(lines, "start"))
        second = _run(store, "--camera", "0", "--memory", "1GiB", "--chunk-frames", "25", "--student-steps", "5")
        first_still_running = first.poll() is None
    finally:
        _stop(first)

    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.splitlines() == [f"error: --store {store} is in use by another edgetrain process (pid "
                                          f"{first.pid}, or its student): wait for it to end or use another --store"]
    assert first_still_running


def test_the_student_holds_the_stores_lock_until_it_exits_and_a_new_service_waits_for_it(tmp_path: Path) -> None:
    # Prepare: the store locked as the service locks it, and a student started as it starts one.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")
    lock = supervisor.StoreLock(store).__enter__()
    lock.claim()
    student = supervisor.start_student(store, ServiceConfig(camera="0", memory_bytes=2**30), 2**29,
                                       lock=lock, quiet=True)
    try:
        # Execute: this process lets go of its descriptor without unlocking, as a killed service does.
        os.close(lock.lock_fd)
        with pytest.raises(RunLockedError, match=rf"pid {os.getpid()}, or its student"):
            supervisor.StoreLock(store).__enter__()  # the holder (this process) is alive: refused at once
        (store / ".lock").write_text("999999999\n")  # the holder named is gone: its student is exiting
        threading.Timer(1.0, student.kill).start()
        waited = time.monotonic()
        successor = supervisor.StoreLock(store).__enter__()
        waited = time.monotonic() - waited
    finally:
        student.kill()
        student.wait()

    # Assert: the store stayed locked while the student lived, and a successor got it once the student was gone.
    assert student.returncode == -signal.SIGKILL
    assert 1.0 <= waited < supervisor.STUDENT_EXIT_WAIT_S
    successor.__exit__(None, None, None)


# --- the same command again continues -------------------------------------------------------------
@pytest.mark.slow
def test_a_video_cut_short_is_reported_and_the_same_command_continues_mid_chunk_and_then_finishes_at_once(
        tmp_path: Path) -> None:
    pytest.importorskip("av")
    from edgetrain.insitu.video import write_frames

    # Prepare: a 50-frame recording and a copy of it cut short; a store whose student has done its steps.
    store = tmp_path / "node"
    store.mkdir()
    _sure_teacher(store / "teacher.pt")
    _trained_student(store, 5)
    video = write_frames(render_video(STEEP, 50, seed=2300, rate=0.08).frames, tmp_path / "cam.mkv", 5.0)
    whole = video.read_bytes()
    video.write_bytes(whole[:len(whole) * 29 // 50])
    command = ("--camera", str(video), "--detector", "motion", "--memory", "1GiB", "--chunk-frames", "20",
               "--student-steps", "5")

    # Execute: the cut file; the whole file in its place; the same command once more.
    cut = _run(store, *command)
    video.write_bytes(whole)
    rest = _run(store, *command)
    before = _snapshot(store, leave_out=("status.jsonl", ".lock"))
    again = _run(store, *command)

    # Assert: the cut file's frames in chunks 0 and 1 (its end), reported on stderr and in the status.
    assert cut.returncode == 0, cut.stderr
    chunks = _events(cut.stdout.splitlines(), "chunk")
    held = sum(c["frames"] for c in chunks)
    assert [(c["first_frame"], c["frames"]) for c in chunks] == [(0, 20), (20, held - 20)] and 20 < held < 40
    assert cut.stderr.splitlines() == [f"--camera {str(video)!r} ends after {held} frames; its header states 50: "
                                       "the file was cut short"]
    assert _events((store / "status.jsonl").read_text().splitlines(), "video_cut_short") == [
        {"event": "video_cut_short", "camera": str(video), "decoded_frames": held, "stated_frames": 50,
         "time": _events(cut.stdout.splitlines(), "video_cut_short")[0]["time"]}]
    # The whole file continues from the cursor: the rest of chunk 1, then chunk 2; nothing reported.
    assert rest.returncode == 0 and rest.stderr == "", rest.stderr
    assert [(c["first_frame"], c["frames"]) for c in _events(rest.stdout.splitlines(), "chunk")] == [
        (held, 40 - held), (40, 10)]
    assert _manifest(store)["cursor"] == 50
    # Done: the same command again stores nothing and starts no student; the store is as it was.
    assert again.returncode == 0 and again.stderr == "", again.stderr
    lines = again.stdout.splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["start", "done"]
    assert _events(lines, "done")[0]["frames"] == 50
    assert _snapshot(store, leave_out=("status.jsonl", ".lock")) == before


def test_the_rest_of_a_chunk_numbers_its_tracks_on_from_the_chunks_stored_ones(tmp_path: Path) -> None:
    store = FrameStore(tmp_path / "frames", 2**20)
    crop = encode_png(np.zeros((32, 32, 3), dtype=np.uint8))
    per_chunk = TRACKS_PER_CHUNK
    store.add([(crop, 0, track) for track in (3, per_chunk + 4, per_chunk + 1, 2 * per_chunk)], cursor=29)

    # Chunk 1's stored tracks are its tracker ids 1 and 4: its rest starts at 5; a chunk not begun at 0.
    assert [service._first_free_track(store, chunk) for chunk in (0, 1, 2, 3)] == [4, 5, 1, 0]


# --- refusal before work --------------------------------------------------------------------------
def _camera(kind: str, folder: Path) -> Path:
    """A camera the service cannot read, of ``kind`` (a key of :data:`BAD_CAMERAS`), made in ``folder``."""
    from edgetrain.insitu.video import write_frames

    if kind == "a missing folder":
        return folder / "no-such-folder"
    path = folder / ("cam.mp4" if kind == "random bytes" else "cam.mkv")
    if kind == "a text file named .mkv":
        path.write_text("not a video\n")
    elif kind == "an empty file":
        path.write_bytes(b"")
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    else:  # a 50-frame recording's first 600 bytes: its header, no frame
        whole = write_frames(render_video(STEEP, 50, seed=1, rate=0.08).frames, path, 5.0).read_bytes()
        path.write_bytes(whole[:600])
    return path


BAD_CAMERAS: dict[str, tuple[list[str], str]] = {  # the options after --camera, the refusal's pattern
    "a text file named .mkv": (["--detector", "motion"], r"^--camera '.*cam\.mkv': not a video FFmpeg can read"),
    "an empty file": (["--detector", "motion"], r"^--camera '.*cam\.mkv': not a video FFmpeg can read"),
    "random bytes": (["--detector", "motion"], r"^--camera '.*cam\.mp4': not a video FFmpeg can read"),
    "a header and no frame": (["--detector", "motion"],
                              r"^--camera '.*cam\.mkv' holds no frame that can be decoded \(its header states 50\)$"),
    "a video with the stand-in detector": ([], r"^--camera '.*cam\.mkv' is a video file, which carries no truth for "
                                               r"the stand-in detector: use --detector motion$"),
    "a missing folder": ([], r"^--camera '.*no-such-folder' is neither a seed, a video file nor a folder of "
                             r"frame_\*\.png with truth\.json"),
}
BAD_OPTIONS: dict[str, tuple[list[str], str]] = {
    "--quota 0": (["--quota", "0"], r"^--quota 0 B cannot hold a crop: the store needs at least 3\.\d\d KiB"),
    "--memory 100MiB": (["--memory", "100MiB"], r"^--memory 100\.00 MiB \(104857600 bytes\) is below what the "
                        r"service needs before its first step, at least .* give --memory \d+MiB or more$"),
}


def _prepared(kind: str, path: Path) -> Path:
    """A store that does not exist yet, or one a run has left (teacher, stored frames, a student state)."""
    if kind == "existing":
        path.mkdir()
        _sure_teacher(path / "teacher.pt")
        _trained_student(path, 5)
        rng = np.random.default_rng(2)
        FrameStore(path / "frames", 2**20).add([(encode_png(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)),
                                                 label, 7) for label in (0, 1, 2)], cursor=40)
        (path / ".lock").write_text("12345\n")
    return path


def _refused(store: Path, *args: str) -> str:
    """The one line ``insitu run`` refuses ``args`` with (exit 2, nothing on stdout)."""
    result = CliRunner().invoke(app, ["insitu", "run", "--store", str(store), *args])
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    line = result.stderr.splitlines()[0]
    assert line.startswith("error: ")
    return line.removeprefix("error: ")


@pytest.fixture(params=["absent", "existing"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("name", list(BAD_CAMERAS))
def test_a_camera_the_service_cannot_read_is_refused_before_any_work(tmp_path: Path, store_kind: str,
                                                                     name: str) -> None:
    pytest.importorskip("av")
    options, pattern = BAD_CAMERAS[name]
    camera = _camera(name, tmp_path)
    store = _prepared(store_kind, tmp_path / "node")
    before = _snapshot(store)
    started = time.monotonic()

    # A generous --memory: the refusal is the camera's (the memory floor reads this test process's size).
    message = _refused(store, "--camera", str(camera), "--memory", "64GiB", *options)

    assert re.search(pattern, message), message
    assert _snapshot(store) == before  # absent stays absent: no teacher trained, no lock, no status
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_a_quota_or_memory_the_service_cannot_start_in_is_refused_before_any_work(tmp_path: Path, store_kind: str,
                                                                                  name: str) -> None:
    options, pattern = BAD_OPTIONS[name]
    store = _prepared(store_kind, tmp_path / "node")
    before = _snapshot(store)

    message = _refused(store, "--camera", "0", *(["--memory", "64GiB"] if "--memory" not in options else []),
                       *options)

    assert re.search(pattern, message), message
    assert _snapshot(store) == before


def test_the_least_memory_a_refusal_names_is_the_floor_of_both_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    # The real command line: its own process size is the floor's; the store does not come to exist.
    refused = _run(tmp_path / "node", "--camera", "0", "--memory", "100MiB", "--frames", "1")
    least = re.search(r"at least [\d.]+ MiB \((\d+) bytes\).* give --memory (\d+)MiB or more$", refused.stderr)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert least is not None and 0 <= int(least[2]) * 2**20 - int(least[1]) < 2**20
    assert not (tmp_path / "node").exists()

    # The floor, at a process of 300 MiB: the student's 300 + 3 x 8 (the decoded store) + 16 (the cushion) MiB at
    # --student-share 0.5; at 0.9, the inference process's 300 MiB in its tenth (less 9 bytes: the student's share
    # is rounded down to whole bytes, the inference process gets the rest). A byte less is refused.
    monkeypatch.setattr(service, "read_process_memory", lambda: SimpleNamespace(rss_bytes=300 * 2**20))
    for share, floor in ((0.5, 680 * 2**20), (0.9, 3000 * 2**20 - 9)):
        with pytest.raises(InfeasibleBudgetError) as caught:
            service._check_memory(ServiceConfig(camera="0", memory_bytes=floor - 1, student_share=share))
        assert caught.value.minimum_bytes == floor
        service._check_memory(ServiceConfig(camera="0", memory_bytes=floor, student_share=share))


# --- a hand-edited manifest ---------------------------------------------------------------------
def _edit(key: str, value: Any) -> Any:
    def edit(manifest: dict[str, Any]) -> None:
        if key == "cursor":
            manifest["cursor"] = value
        else:
            manifest["frames"][0][key] = value
    return edit


MANIFEST_EDITS: dict[str, tuple[Any, str]] = {
    "a listed file missing": (None, "frames[1].name lists 000000001.png, which is not in {frames}"),
    "label 99": (_edit("label", 99), "frames[0].label is 99, not a class (0 to 3)"),
    "nbytes 'x'": (_edit("nbytes", "x"), 'frames[0].nbytes is "x", not a non-negative integer'),
    "cursor -40": (_edit("cursor", -40), "cursor is -40, not a non-negative integer"),
    "nbytes unlike the file": (_edit("nbytes", 10), "frames[0].nbytes is 10, the file holds {size} bytes"),
    "a name not its seq's": (_edit("name", "../teacher.pt"),
                             'frames[0].name is "../teacher.pt", not "000000000.png" (the name of seq 0)'),
}


@pytest.mark.parametrize("name", list(MANIFEST_EDITS))
def test_a_hand_edited_manifest_is_refused_naming_the_file_and_the_field(tmp_path: Path, name: str) -> None:
    store = _prepared("existing", tmp_path / "node")
    manifest_path = store / "frames" / "manifest.json"
    edit, problem = MANIFEST_EDITS[name]
    if edit is None:
        (store / "frames" / "000000001.png").unlink()
    else:
        manifest = json.loads(manifest_path.read_text())
        edit(manifest)
        manifest_path.write_text(json.dumps(manifest))
    before = _snapshot(store)

    message = _refused(store, "--camera", "0", "--memory", "64GiB")

    size = (store / "frames" / "000000000.png").stat().st_size
    assert message == (f"{manifest_path}: {problem.format(frames=store / 'frames', size=size)}; the frame store "
                       "cannot be opened")
    assert _snapshot(store) == before


# --- the student's failure, with its cause --------------------------------------------------------
@pytest.fixture
def failing(tmp_path: Path) -> Iterator[Any]:
    """Start a stand-in student that runs ``code``, its stderr in the store's student.log, as the service's is."""
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / supervisor.STUDENT_LOG, "wb") as stderr:
            started.append(subprocess.Popen([sys.executable, "-c", code], stderr=stderr))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_student_that_crashes_or_is_killed_is_reported_with_its_cause(tmp_path: Path, failing: Any) -> None:
    crashed = failing("raise RuntimeError('the state directory is read-only')")
    crashed.wait(timeout=60)
    assert str(supervisor.student_failed(crashed, tmp_path)) == (
        "the student process exited with status 1: RuntimeError: the state directory is read-only")

    killed = failing("import time; time.sleep(60)")
    killed.kill()
    killed.wait()
    assert str(supervisor.student_failed(killed, tmp_path)) == (
        "the student process exited with status -9: killed by SIGKILL (out of memory, or kill -9)")


# --- insitu world --------------------------------------------------------------------------------
def test_the_world_and_its_video_go_to_a_folder_that_does_not_exist_yet(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from edgetrain.insitu.video import read_frames

    out = tmp_path / "new" / "world"

    result = CliRunner().invoke(app, ["insitu", "world", "--out", str(out), "--frames", "3", "--video",
                                      str(out / "cam.mkv")])

    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["cam.mkv", "frame_00000.png", "frame_00001.png",
                                                     "frame_00002.png", "truth.json"]
    assert len(list(read_frames(out / "cam.mkv"))) == 3
