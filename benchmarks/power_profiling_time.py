"""How long the power advisor's profiling takes (the goal: <= 6 modes, <= 2 minutes), with its spread.

Runs :func:`edgetrain.power.predict.profile_adaptively` -- five corner modes, then the advisor's pick without margins
while it is not yet profiled, at most 6 modes -- over this machine's thread x cgroup-quota modes (NOTE [ Thread x
quota modes ]), measuring each mode as the real validation of ``python -m benchmarks run power_modes`` does
(:func:`edgetrain.power.cgroup_modes.time_step_in_mode`: a child process that imports PyTorch and builds the model,
then the warm-up and timed training steps inside the mode's quota). Repeats the whole profiling and gives the wall
time of one profiling with its spread, the modes it profiled and each mode's wall time. Needs root (cgroup v1 cpu
controller); changes no CPU's online state or clock.

Without a power sensor the advisor's objective is the epoch time (``advise``), so its margin-free pick is usually a
profiled corner and the profiling stops at 5 modes; each further mode would add about one median mode's time.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from benchmarks.power_modes import BATCH, MODEL, SIZE, STEPS, WARMUP
from edgetrain.bench.stats import Spread, spread
from edgetrain.power.cgroup_modes import quota_grid, quota_unavailable_reason, time_step_in_mode
from edgetrain.power.predict import ModePoint, Profile, profile_adaptively

REPEATS = 5  # whole profilings: the spread is over these
SAMPLES = 50_000  # samples per epoch (the advisor's objective)
DEADLINE_S: float | None = None  # no epoch deadline

TITLE = "How long the power advisor's profiling takes"


def one_profiling(steps: int, warmup: int) -> dict[str, Any]:
    """Profile the thread x quota grid once as the advisor does; the wall time of the whole and of each mode."""
    modes = {mode.point(): mode for mode in quota_grid()}
    mode_s: dict[str, float] = {}

    def measure(point: ModePoint) -> Profile:
        start = time.perf_counter()
        timing = time_step_in_mode(modes[point], MODEL, BATCH, SIZE, steps, warmup)
        mode_s[point.name] = time.perf_counter() - start
        return Profile(point, statistics.median(timing.step_times_s))

    start = time.perf_counter()
    profiles = profile_adaptively(list(modes), measure, math.ceil(SAMPLES / BATCH), deadline_s=DEADLINE_S)
    return {"wall_s": time.perf_counter() - start, "modes": [p.mode.name for p in profiles], "mode_wall_s": mode_s}


def run(quick: bool) -> dict[str, Any]:
    """``REPEATS`` whole profilings (quick: one, of 2 timed steps a mode); unavailable without the cgroup."""
    repeats, steps, warmup = (1, 2, 1) if quick else (REPEATS, STEPS, WARMUP)
    reason = quota_unavailable_reason()
    if reason:
        return {"unavailable": reason}
    runs = [one_profiling(steps, warmup) for _ in range(repeats)]
    per_mode = [s for r in runs for s in r["mode_wall_s"].values()]
    return {"model": MODEL, "batch": BATCH, "size": SIZE, "steps": steps, "warmup": warmup,
            "profiling_wall_s": spread([r["wall_s"] for r in runs]).to_dict(),
            "modes_profiled": spread([len(r["modes"]) for r in runs]).to_dict(),
            "mode_wall_s": spread(per_mode).to_dict(), "runs": runs}


def render(result: dict[str, Any]) -> str:
    """The profiling's wall time with its spread, then each profiling's modes."""
    if "unavailable" in result:
        return f"Unavailable on this machine: {result['unavailable']}."
    wall, modes, per_mode = (Spread.from_dict(result[k]) for k in ("profiling_wall_s", "modes_profiled",
                                                                   "mode_wall_s"))
    rows = [f"| {k + 1} | {r['wall_s']:.1f} | {', '.join(r['modes'])} | "
            f"{', '.join(f'{s:.1f}' for s in r['mode_wall_s'].values())} |" for k, r in enumerate(result["runs"])]
    return (f"The advisor's adaptive profiling over this machine's thread x CPU-quota modes, each mode a child "
            f"process running {result['warmup']} warm-up and {result['steps']} timed steps of {result['model']} "
            f"(batch {result['batch']}, {result['size']} px).\n\n"
            "| | median | IQR | CoV | profilings |\n|---|---|---|---|---|\n"
            f"| one profiling's wall time | {wall.median:.1f} s | {wall.q1:.1f}-{wall.q3:.1f} s | {wall.cov_text} | "
            f"{wall.n} |\n"
            f"| modes profiled | {modes.median:g} | {modes.q1:g}-{modes.q3:g} | {modes.cov_text} | {modes.n} |\n"
            f"| one mode's wall time | {per_mode.median:.1f} s | {per_mode.q1:.1f}-{per_mode.q3:.1f} s | "
            f"{per_mode.cov_text} | {per_mode.n} modes |\n\n"
            "| profiling | wall s | modes, in order | each mode's wall s |\n|---|---|---|---|\n" + "\n".join(rows))
