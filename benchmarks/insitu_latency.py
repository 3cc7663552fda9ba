"""Per-frame inference latency of the in-situ service, alone and beside its training student process.

Usage::

    edgetrain insitu run --camera 0 --store out/insitu/node0 --memory 1GiB --frames 1200   # a store to train from
    python benchmarks/insitu_latency.py --store out/insitu/node0 [--clips 4] [--seed 0] [--node-camera steep]
        [--repeats 5]

Renders ``--clips`` held-out clips of the node's camera (``simulate``'s test clips) and runs the
service's inference path over them in 25-frame chunks, with a student process (as the service
starts it: SCHED_IDLE, one thread, half of 1 GiB) training from the store's frames, paused
(SIGSTOP) on even chunks and running on odd ones
(:func:`edgetrain.insitu.latency.latency_beside_student`). Frames arrive at ``--frame-rate``
(20 per second: a frame every 50 ms, so the student has the time between frames to train; 0:
back to back) and, as the service does by default, the student is stopped while each frame is
inferred (NOTE [ Yielding per frame ]; ``--student-runs-during-frames`` lets both run at once).
Prints one JSON line: both p95s, their ratio (the bound: 1.10), whether the student was
training, and its CPU share while it ran: near 0 means the machine, busy with other work, gave
the SCHED_IDLE student nothing, and the ratio then says nothing about training's interference.
Run it on a quiet machine.
With ``--repeats N`` it measures N times over the same clips and adds a line with the median,
IQR and CoV of both p95s, the ratio and the student's CPU share (:func:`edgetrain.bench.stats.spread`).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch

from edgetrain.bench.stats import software_setup, spread
from edgetrain.insitu.latency import PROBE_FRAME_RATE_HZ, latency_beside_student
from edgetrain.insitu.service_config import ServiceConfig
from edgetrain.insitu.student import FRAMES, TEACHER
from edgetrain.insitu.teacher import load_teacher, render_clips
from edgetrain.insitu.world import NODE_CAMERAS

SPREAD_KEYS = ("inference_p95_alone_s", "inference_p95_beside_student_s", "inference_p95_ratio", "student_cpu_share")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node-camera", choices=list(NODE_CAMERAS), default="steep")
    parser.add_argument("--frame-rate", type=float, default=PROBE_FRAME_RATE_HZ,
                        help="Frames arrive at this rate (per second); 0: back to back (the student then trains "
                        "only in the chunks' gaps when paused per frame).")
    parser.add_argument("--student-runs-during-frames", action="store_true", help="Do not stop the student while a "
                        "frame is inferred (NOTE [ Yielding per frame ]): both run at once on two cores.")
    parser.add_argument("--repeats", type=int, default=1, help="Measurements, each with a fresh student process; "
                        "with more than one, a last line gives their spread.")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    torch.set_num_threads(1)
    teacher = load_teacher(args.store / TEACHER)
    clips = render_clips((NODE_CAMERAS[args.node_camera],), args.clips, 200, args.seed * 1000 + 500, rate=0.08)
    config = ServiceConfig(camera=str(args.seed), memory_bytes=2**30, chunk_frames=25, seed=args.seed,
                           student_steps=10**6,  # trains throughout (it is stopped at the end), however long the run
                           frame_rate_hz=args.frame_rate or None, pause_per_frame=not args.student_runs_during_frames)
    results = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="edgetrain-insitu-") as work:
            result = latency_beside_student(clips, teacher, copy.deepcopy(teacher.model), args.store / FRAMES,
                                            Path(work) / "node", config)
        print(json.dumps({"clips": args.clips, "frames": 200 * args.clips, "frame_rate_hz": config.frame_rate_hz,
                          "pause_per_frame": config.pause_per_frame, **result}), flush=True)
        results.append(result)
    if len(results) > 1:
        values = {key: [float(v) for r in results if (v := r[key]) is not None] for key in SPREAD_KEYS}
        print(json.dumps({"repeats": len(results), **{key: spread(v).to_dict() for key, v in values.items() if v},
                          "setup": software_setup()}))


if __name__ == "__main__":
    main()
