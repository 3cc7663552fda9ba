"""How long the power advisor's profiling takes (the goal: <= 6 modes, <= 2 minutes), with its spread.

Runs :func:`edgetrain.power.predict.profile_adaptively` -- five corner modes, then the advisor's
pick without margins while it is not yet profiled, at most 6 modes -- over this machine's thread x
cgroup-quota modes (NOTE [ Thread x quota modes ]), measuring each mode as
``benchmarks/power_modes.py``'s real validation does (:func:`edgetrain.power.cgroup_modes.time_step_in_mode`:
a child process that imports PyTorch and builds the model, then ``--warmup`` + ``--steps``
training steps inside the mode's quota). Repeats the whole profiling ``--repeats`` times and
prints, as JSON: the wall time of one profiling with its median, IQR and CoV
(:func:`edgetrain.bench.stats.spread`), the modes it profiled, each mode's wall time, and the
software setup. Needs root (cgroup v1 cpu controller); changes no CPU's online state or clock.

Without a power sensor the advisor's objective is the epoch time (``advise``), so its margin-free
pick is usually a profiled corner and the profiling stops at 5 modes; each further mode would add
about one median mode's time.

Usage::

    python benchmarks/power_profiling_time.py [--repeats 5] [--model resnet18 --batch 8 --size 64]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

from edgetrain.bench.stats import software_setup, spread
from edgetrain.power.cgroup_modes import quota_grid, quota_unavailable_reason, time_step_in_mode
from edgetrain.power.predict import ModePoint, Profile, profile_adaptively


def one_profiling(args: argparse.Namespace) -> dict[str, Any]:
    """Profile the thread x quota grid once as the advisor does; the wall time of the whole and of each mode."""
    modes = {mode.point(): mode for mode in quota_grid()}
    mode_s: dict[str, float] = {}

    def measure(point: ModePoint) -> Profile:
        start = time.perf_counter()
        timing = time_step_in_mode(modes[point], args.model, args.batch, args.size, args.steps, args.warmup)
        mode_s[point.name] = time.perf_counter() - start
        return Profile(point, statistics.median(timing.step_times_s))

    start = time.perf_counter()
    profiles = profile_adaptively(list(modes), measure, math.ceil(args.samples / args.batch),
                                  deadline_s=args.deadline)
    return {"wall_s": time.perf_counter() - start, "modes": [p.mode.name for p in profiles], "mode_wall_s": mode_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="Whole profilings (the spread is over these).")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="Timed steps per mode (as power_modes.py).")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--samples", type=int, default=50_000, help="Samples per epoch (the advisor's objective).")
    parser.add_argument("--deadline", type=float, default=None, help="Epoch deadline in seconds, if any.")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    reason = quota_unavailable_reason()
    if reason:
        sys.exit(f"unavailable: {reason}")
    runs = [one_profiling(args) for _ in range(args.repeats)]
    per_mode = [s for run in runs for s in run["mode_wall_s"].values()]
    print(json.dumps({"model": args.model, "batch": args.batch, "size": args.size, "steps": args.steps,
                      "warmup": args.warmup, "profiling_wall_s": spread([r["wall_s"] for r in runs]).to_dict(),
                      "modes_profiled": spread([len(r["modes"]) for r in runs]).to_dict(),
                      "mode_wall_s": spread(per_mode).to_dict(), "runs": runs, "setup": software_setup()}, indent=1))


if __name__ == "__main__":
    main()
