"""Per-frame inference latency of the in-situ service, alone and beside its training student process.

Usage::

    edgetrain insitu run --camera 0 --store out/insitu/node0 --memory 1GiB --frames 1200   # a store to train from
    python benchmarks/insitu_latency.py --store out/insitu/node0 [--clips 4] [--seed 0] [--node-camera steep]

Renders ``--clips`` held-out clips of the node's camera (``simulate``'s test clips) and runs the
service's inference path over them in 25-frame chunks, with a student process (as the service
starts it: SCHED_IDLE, one thread, half of 1 GiB) training from the store's frames, paused
(SIGSTOP) on even chunks and running on odd ones
(:func:`edgetrain.insitu.service.latency_beside_student`). Prints one JSON line: both p95s,
their ratio (the issue's bound: 1.10), whether the student was training, and its CPU share while
it ran: near 0 means the machine, busy with other work, gave the SCHED_IDLE student nothing,
and the ratio then says nothing about training's interference. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch

from edgetrain.insitu.service import ServiceConfig, latency_beside_student
from edgetrain.insitu.student import FRAMES, TEACHER
from edgetrain.insitu.teacher import load_teacher, render_clips
from edgetrain.insitu.world import NODE_CAMERAS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--node-camera", choices=list(NODE_CAMERAS), default="steep")
    args = parser.parse_args()
    torch.set_num_threads(1)
    teacher = load_teacher(args.store / TEACHER)
    clips = render_clips((NODE_CAMERAS[args.node_camera],), args.clips, 200, args.seed * 1000 + 500, rate=0.08)
    config = ServiceConfig(camera=str(args.seed), memory_bytes=2**30, chunk_frames=25, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="edgetrain-insitu-") as work:
        result = latency_beside_student(clips, teacher, copy.deepcopy(teacher.model), args.store / FRAMES,
                                        Path(work) / "node", config)
    print(json.dumps({"clips": args.clips, "frames": 200 * args.clips, **result}))


if __name__ == "__main__":
    main()
