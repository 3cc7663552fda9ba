"""``edgetrain insitu``: the in-situ student-teacher pipeline of the founding paper's section III.

The main app registers ``insitu_app`` in :mod:`edgetrain.cli`; the library is imported inside each
command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from ..sysutil.fileio import to_json
from .common import clean_errors, console, finite

__all__ = ["insitu_app"]

insitu_app = typer.Typer(help="In-situ student-teacher training on a camera node: render a world, simulate "
                                "the pipeline, run the service, plot its report.", no_args_is_help=True)


@insitu_app.command("world")
@clean_errors
def world_command(out: Path = typer.Option(Path("out/insitu/world"), "--out", "-o", help="Output directory."),
                  camera: str = typer.Option("steep", "--camera", help="'steep' or 'pole' (the node's presets) or "
                                             "'eye' (the teacher's)."),
                  frames: int = typer.Option(60, "--frames", min=1, help="Frames to render (5 frames/s)."),
                  seed: int = typer.Option(0, "--seed", help="Seed of the world."),
                  sheet: bool = typer.Option(False, "--sheet", help="Also write sheet.png: 6 frames of both cameras "
                                             "with the truth boxes drawn."),
                  video_file: Path | None = typer.Option(
                      None, "--video", help="Also write the frames as this video file: .mkv (lossless FFV1) or .mp4 "
                      "(H.264); needs the `video` extra.")
                  ) -> None:
    """Render a clip of the camera world: frame_NNNNN.png and truth.json (ground truth, for evaluation only)."""
    from ..insitu.world import EYE_LEVEL, FRAME_RATE_HZ, node_camera, render_video, write_video

    video = render_video(EYE_LEVEL[0] if camera == "eye" else node_camera(camera), frames, seed)
    if video_file is not None:  # first: a container it cannot write is refused before anything is written
        from ..insitu.video import write_frames

        write_frames(video.frames, video_file, FRAME_RATE_HZ)
    write_video(video, out)
    if sheet:
        from ..insitu.contact_sheet import contact_sheet

        contact_sheet(seed, out / "sheet.png")
    console.print(f"{frames} frames, {len(video.truth)} object records, {len({t.track_id for t in video.truth})} "
                  f"tracks -> {out}" + ("" if video_file is None else f", {video_file}"))


@insitu_app.command("simulate")
@clean_errors
def simulate_command(
        seed: int = typer.Option(0, "--seed", help="Seed of the world, the models and the detector's noise."),
        store: Path = typer.Option(Path("out/insitu/store"), "--store", help="The frame store's directory "
                                   "(emptied first)."),
        quota: str = typer.Option("8MiB", "--quota", help="The frame store's byte quota."),
        memory: str = typer.Option("19MiB", "--step-memory", help="The student's training-step tensor budget "
                                   "(planned by edgetrain's Checkpointed)."),
        miss_rate: float = typer.Option(0.0, "--miss-rate", min=0.0, max=0.99, help="Detector misses (fraction)."),
        false_positives: float = typer.Option(0.0, "--false-positives", min=0.0, help="Detector false positives "
                                              "per frame (mean)."),
        id_switch_rate: float = typer.Option(0.0, "--id-switch-rate", min=0.0, max=1.0, help="Extra simulated ID "
                                             "switches per matched detection."),
        motion_gate_px: float = typer.Option(8.0, "--motion-gate-px", min=0.0, help="The tracker cuts a track where "
                                             "its box's centre lands this many pixels or more from the straight "
                                             "line through its last detections (an ID switch between objects); 0: "
                                             "no cut."),
        propagation: str = typer.Option("track", "--propagation", help="'track' (backward and forward along the "
                                        "track), 'forward' (from the first trusted frame on) or 'none' (the "
                                        "gate-trusted frames alone: no tracker)."),
        detector: str = typer.Option("standin", "--detector", help="'standin' (the generator's boxes with the rates "
                                     "above) or 'motion' (background subtraction on the frames; the rates above "
                                     "do not apply)."),
        node_camera: str = typer.Option("steep", "--node-camera", help="The node's camera: 'steep' (8 m up, 60° "
                                        "down) or 'pole' (6 m, 45°: the first increment's)."),
        labels: str = typer.Option("size", "--labels", help="'size' (the posterior rule's track posteriors "
                                   "times the likelihood of the track's size in metres, from the node's mount, "
                                   "under class size models learnt from the stream; with --propagation track), "
                                   "'posterior' (each track's teacher probabilities weighted by the view from the "
                                   "node's mount and aligned to the class prior; every track labelled) or 'gate' "
                                   "(the first increment's competence gate and vote)."),
        size_heading: bool = typer.Option(True, "--size-heading/--no-size-heading", help="With --labels size: a "
                                          "track that moves is judged by the size its class has at its heading "
                                          "relative to the camera (from the ground path of its boxes' foot "
                                          "points); --no-size-heading: one size per class whatever the heading."),
        label_coverage: float = typer.Option(1.0, "--label-coverage", min=0.0, max=1.0, help="With --labels size: "
                                             "the share of the stream's detections labelled, the tracks the rule "
                                             "is surest of first (the margin of their two best scores); the rest "
                                             "are not stored."),
        rounds: int | None = typer.Option(None, "--rounds", min=0, help="Self-training rounds: the student "
                                          "relabels the stored tracks and a new student trains on them (0 with "
                                          "--propagation forward|none). Default 2 with --round-folds, else 1."),
        round_folds: int | None = typer.Option(None, "--round-folds", min=0, help="With --labels size: each "
                                               "self-training round trains this many students (>= 2), each on the "
                                               "other folds' stored tracks (after the first round: the surest "
                                               "ones), and relabels every track with their "
                                               "votes on the tracks they never saw times the teacher's posterior "
                                               "and the size likelihoods; 0: the round's one student votes on its "
                                               "own training tracks. Default 2 with --labels size, else 0."),
        round_coverage: float | None = typer.Option(None, "--round-coverage", min=0.0, max=1.0, help="With "
                                                    "--round-folds: the share of the stored detections the last "
                                                    "round keeps, its surest tracks first; the rest are removed from "
                                                    "the store. Default 0.81 with --round-folds, else 1."),
        round_repeats: int = typer.Option(1, "--round-repeats", help="With --round-folds: each self-training "
                                          "round deals the stored tracks into folds this many times (the first "
                                          "deal as with 1, each later one in a random order, with its own fold "
                                          "students) and each crop's vote is the mean of its students' (each "
                                          "never saw its track); costs this many times the fold students."),
        replay_crops: int = typer.Option(3000, "--replay-crops", min=0, help="Eye-level crops shipped with the "
                                         "teacher and replayed by the student (at most the teacher's ~3000)."),
        replay_weight: float = typer.Option(4.0, "--replay-weight", min=0.0, help="A replayed crop's loss weight "
                                            "against a stored one's."),
        student_lr: float = typer.Option(4e-3, "--student-lr", callback=finite("--student-lr", above=0),
                                         help="Every student's peak learning rate "
                                         "(one-cycle schedule): the rounds', the final one's and the oracle's."),
        student_epochs: int = typer.Option(12, "--student-epochs", min=1,
                                           help="Every student's epochs over its crops (the rounds', the final "
                                           "one's and the oracle's)."),
        student_seed_offset: int = typer.Option(1, "--student-seed-offset", help="Every student's shuffling and "
                                                "augmentation seed is --seed plus this; the world, the teacher and "
                                                "the stream stay those of --seed."),
        track_consistency: float = typer.Option(0.0, "--track-consistency", min=0.0,
                                                help="With --round-folds: the final student also learns the crops "
                                                "of the tracks the last round drops, with no label: each crop's "
                                                "cross-entropy to its track's sharpened mean prediction, at this "
                                                "weight (0: off)."),
        quick: bool = typer.Option(False, "--quick", help="A small world and few epochs (a smoke test, ~1 min)."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
    """Render the world, run the pipeline on the node's camera, train teacher/student/oracle, score them."""
    import shutil

    from ..insitu.gate import GateConfig
    from ..insitu.simulate import QUICK, SimulateConfig, simulate
    from ..units import parse_bytes

    overrides: dict[str, Any] = {"replay_crops": replay_crops, "student_epochs": student_epochs,
                                 **(QUICK if quick else {})}
    folds = (SimulateConfig.round_folds if labels == "size" else 0) if round_folds is None else round_folds
    kept = (SimulateConfig.round_coverage if folds else 1.0) if round_coverage is None else round_coverage
    rounds = (SimulateConfig.rounds if folds else 1) if rounds is None else rounds
    config = SimulateConfig(seed=seed, quota_bytes=parse_bytes(quota), student_memory=memory, miss_rate=miss_rate,
                            false_positives_per_frame=false_positives, id_switch_rate=id_switch_rate,
                            motion_gate_px=motion_gate_px,
                            propagation=propagation, detector=detector, node_camera=node_camera, rounds=rounds,
                            round_folds=folds, round_coverage=kept, round_repeats=round_repeats,
                            replay_weight=replay_weight, student_lr=student_lr,
                            student_seed_offset=student_seed_offset, track_consistency=track_consistency,
                            gate=GateConfig(rule=labels, coverage=label_coverage, size_heading=size_heading),
                            **overrides)
    if store.exists():
        shutil.rmtree(store)
    report = simulate(config, store, progress=lambda message: print(message, file=sys.stderr, flush=True))
    if as_json:
        print(to_json(report, indent=1))
    else:
        _print_report(report)


@insitu_app.command("run")
@clean_errors
def run_command(
        camera: str = typer.Option(..., "--camera", help="A seed (a generated world seen by --node-camera, "
                                   "endless), a folder from `edgetrain insitu world` (its truth.json feeds the "
                                   "stand-in detector only) or a video file seen from --node-camera's mount (needs "
                                   "--detector motion and the `video` extra)."),
        store: Path = typer.Option(..., "--store", help="The service's directory: teacher, frame store, student "
                                   "states, promoted model, status.jsonl. A rerun continues where it stopped."),
        memory: str | None = typer.Option(None, "--memory", help="The whole service's memory (inference + "
                                             "student process, resident as the kernel counts it), e.g. 1GiB."),
        device: str | None = typer.Option(None, "--device", "-d", help="A device from `edgetrain devices` whose "
                                             "usable memory (RAM where unknown) is --memory."),
        frames: int | None = typer.Option(None, "--frames", min=1, help="Stop after this many frames of the "
                                             "stream in all (default: the whole stream)."),
        chunk_frames: int = typer.Option(200, "--chunk-frames", min=5, help="Frames per chunk (tracks end at a "
                                         "chunk's end; a generated world's chunk is a new clip)."),
        quota: str = typer.Option("8MiB", "--quota", help="The frame store's byte quota."),
        student_share: float = typer.Option(0.5, "--student-share", help="Share of --memory for the student "
                                            "process; the rest is the inference process's."),
        student_steps: int = typer.Option(400, "--student-steps", min=1, help="The student's optimizer steps in "
                                          "all (across reruns)."),
        round_steps: int = typer.Option(25, "--round-steps", min=1, help="Steps between the student's "
                                        "evaluations (and saved states)."),
        margin: float = typer.Option(0.02, "--margin", help="Promote the student when it beats the teacher by this "
                                     "much on the held-out stored frames."),
        probe_every: int = typer.Option(4, "--probe-every", min=2, help="Every Nth chunk runs with the student "
                                        "paused: the inference latency baseline."),
        frame_rate: float | None = typer.Option(None, "--frame-rate", min=0.1, help="Take frames at this rate "
                                                "(per second), as a camera gives them (default: each as soon as "
                                                "the last is done; the student then trains mostly between chunks)."),
        motion_gate_px: float = typer.Option(8.0, "--motion-gate-px", min=0.0, help="The tracker cuts a track where "
                                             "its box's centre lands this many pixels or more from the straight "
                                             "line through its last detections (an ID switch between objects); 0: "
                                             "no cut."),
        student_runs_during_frames: bool = typer.Option(
            False, "--student-runs-during-frames", help="Do not stop the student while a frame is inferred: on a "
            "multi-core node it then shares caches and memory bandwidth with the frame."),
        node_camera: str = typer.Option("steep", "--node-camera", help="A generated world's camera: 'steep' (8 m, "
                                        "60°) or 'pole' (6 m, 45°)."),
        detector: str = typer.Option("standin", "--detector", help="'standin' (the generator's boxes, stated "
                                     "miss/false-positive rates) or 'motion' (background subtraction on the frames)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the teacher's world, the models and the detector."),
        quick: bool = typer.Option(False, "--quick", help="A small teacher (a smoke test).")) -> None:
    """The node's service: detect, track, label and store in this process; the student trains beside it at low
    priority and is promoted when it wins. Status: JSON lines on stdout and in STORE/status.jsonl."""
    from ..insitu.service import run_service
    from ..insitu.service_config import ServiceConfig
    from ..insitu.simulate import QUICK
    from ..insitu.teacher import TeacherConfig
    from ..units import parse_bytes

    if (memory is None) == (device is None):
        raise ValueError("give exactly one of --memory or --device")
    memory_bytes = parse_bytes(memory) if memory is not None else _usable_memory_of(str(device))
    teacher = TeacherConfig(seed=seed, videos=QUICK["teacher_videos"], frames=QUICK["teacher_frames"],
                            epochs=QUICK["teacher_epochs"], replay_crops=QUICK["replay_crops"]) if quick \
        else TeacherConfig(seed=seed)
    config = ServiceConfig(camera=camera, memory_bytes=memory_bytes, frames=frames, chunk_frames=chunk_frames,
                           quota_bytes=parse_bytes(quota), student_share=student_share, student_steps=student_steps,
                           round_steps=round_steps, margin=margin, probe_every=probe_every, detector=detector,
                           node_camera=node_camera, frame_rate_hz=frame_rate, motion_gate_px=motion_gate_px,
                           pause_per_frame=not student_runs_during_frames, seed=seed, teacher=teacher)
    run_service(store, config, say=lambda message: print(message, file=sys.stderr, flush=True))


@insitu_app.command("report")
@clean_errors
def report_command(status: Path = typer.Argument(..., help="A service's store directory or its status.jsonl."),
                   out: Path = typer.Option(Path("insitu.png"), "--out", "-o", help="The plot (PNG).")) -> None:
    """Plot teacher vs student accuracy over time (held-out stored frames) from a service's status lines."""
    from ..reports.insitu import plot_status, read_status

    last = plot_status(read_status(status), out)
    console.print(f"{last['rounds']} student rounds, last at step {last['step']}: student "
                  f"{last['student_accuracy']:.3f}, teacher {last['teacher_accuracy']:.3f}, "
                  f"{last['promotions']} promotion(s) -> {out}")


def _usable_memory_of(device: str) -> int:
    from ..devices import get_device

    target = get_device(device)
    capacity = target.usable_memory_bytes if target.usable_memory_bytes is not None else target.memory_bytes
    if capacity is None:
        raise ValueError(f"device {device!r} has no known memory size")
    return int(capacity)


def _print_report(report: dict[str, Any]) -> None:
    table = Table(title="accuracy on the node's own (pole) viewpoint, and at eye level")
    bands = list(report["teacher_accuracy_by_elevation"])
    for column in ("model", "pole", *(f"elev {b}°" for b in bands), "eye level"):
        table.add_column(column, justify="right")
    for name in ("teacher", "student", "oracle_student"):
        table.add_row(name, f"{report[f'{name}_accuracy']:.3f}",
                      *(f"{report[f'{name}_accuracy_by_elevation'][b]:.3f}" for b in bands),
                      f"{report[f'{name}_accuracy_eye_level']:.3f}")
    console.print(table)
    console.print(f"pseudo-labels: precision {report['pseudo_label_precision']:.3f} at coverage "
                  f"{report['pseudo_label_coverage']:.3f} ({report['pseudo_labelled_frames']} frames, "
                  f"{report['frames_per_trusted_frame']:.1f} per trusted frame); store "
                  f"{report['store_bytes']} / {report['store_quota_bytes']} bytes, {report['stored_frames']} frames")
