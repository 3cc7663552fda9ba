"""The motion detector scored against the generator's truth on the node streams of ``insitu simulate``.

Usage::

    python benchmarks/insitu_motion.py [--seeds 0 1 2] [--clips 6] [--node-camera steep|pole]

For each seed, the node stream's clips (``render_video(camera, 200, seed * 1000 + 300 + i)``,
the clips ``edgetrain insitu simulate --seed S --node-camera C`` pseudo-labels) go through
:func:`edgetrain.insitu.motion.detect_motion`; boxes are matched one-to-one to truth boxes at
IoU >= 0.5. Precision: detections that found an object; recall: detectable objects (the stand-in
detector's floor: >= 50% visible, >= 14x10 px) found. Prints one JSON line per seed and one for
all. The detector's parameters were chosen on seed 0's first two pole clips.
"""

from __future__ import annotations

import argparse
import json
import time

from edgetrain.bench.stats import software_setup, spread
from edgetrain.insitu.motion import detect_motion, match_sources, score_boxes
from edgetrain.insitu.world import NODE_CAMERAS, render_video


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--node-camera", choices=list(NODE_CAMERAS), default="steep")
    args = parser.parse_args()
    total: dict[str, float] = {}
    clip_ms_per_frame: list[float] = []
    for seed in args.seeds:
        counts: dict[str, float] = {"frames": 0, "detect_s": 0.0}
        for i in range(args.clips):
            video = render_video(NODE_CAMERAS[args.node_camera], 200, seed * 1000 + 300 + i, rate=0.08)
            started = time.perf_counter()
            detections = detect_motion(video.frames)
            detect_s = time.perf_counter() - started
            clip_ms_per_frame.append(1000 * detect_s / len(video.frames))
            counts["detect_s"] += detect_s
            counts["frames"] += len(video.frames)
            for key, value in score_boxes(detections, match_sources(detections, video), video).items():
                counts[key] = counts.get(key, 0) + value
        _print(str(seed), counts)
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    _print("all", total)
    print(json.dumps({"ms_per_frame_over_clips": spread(clip_ms_per_frame).to_dict(), "setup": software_setup()}))


def _print(seed: str, c: dict[str, float]) -> None:
    print(json.dumps({"seed": seed, **{k: v for k, v in c.items() if k != "detect_s"},
                      "precision": round(c["true_positives"] / max(c["detections"], 1), 3),
                      "recall": round(c["detectable_found"] / max(c["detectable_objects"], 1), 3),
                      "ms_per_frame": round(1000 * c["detect_s"] / c["frames"], 2)}))


if __name__ == "__main__":
    main()
