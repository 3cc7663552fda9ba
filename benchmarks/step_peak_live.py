"""What is alive at a training step's tensor peak, by the c10 allocator's records: where a peak comes from.

MobileNetV3-Small (4 x 64 px) is the one model whose least edgetrain step with the optimizer after the backward does
not go below inductor's least: its gradients alone are about its floor. For inductor's graph at
``activation_memory_budget = 1.0`` and edgetrain's least-budget plan (settings of
:mod:`edgetrain.runtime.step_settings`), each in its own child process (one torch thread), this runs three steps, then
records one more under ``torch.profiler`` with ``profile_memory``
(:func:`edgetrain.profiling.peak_live.peak_live`): the step's tensor peak above its start, the ops running at that
moment, and the allocations still alive then, largest first, each with the ops that made it (its innermost enclosing
op events). The allocations are deterministic for a setting, so one recorded step says it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TITLE = "What is alive at a step's tensor peak"

MODEL = "mobilenet_v3_small"
SETTINGS = ("inductor:1.0", "edgetrain:least")
QUICK_SETTINGS = ("eager", "edgetrain:least")   # no compilation: the same records in seconds
TOP = 12   # how many live allocations a setting lists
WARM_STEPS = 3
ROOT = Path(__file__).resolve().parent.parent
CHILD = "import sys; from benchmarks.step_peak_live import child; child(sys.argv[1])"


def child(setting: str) -> None:
    """One setting of ``MODEL`` in this process: print its recorded peak as one JSON line."""
    from edgetrain.profiling.peak_live import peak_live
    from edgetrain.runtime.step_settings import setting_step
    step, _ = setting_step(setting, MODEL, 8, 128, None)   # batch and image are the zoo models'; MODEL has its own
    for _ in range(WARM_STEPS):
        step()
    found = peak_live(step)
    print(json.dumps({"setting": setting, "peak_bytes": found.peak_bytes, "ops_at_peak": found.ops_at_peak,
                      "events": found.events, "live_bytes": sum(e.nbytes for e in found.live),
                      "live_count": len(found.live),
                      "top": [{"nbytes": e.nbytes, "ops": e.ops} for e in found.live[:TOP]]}))


def run(quick: bool) -> dict[str, Any]:
    """Each setting's recorded step, each in its own child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    settings = []
    for setting in QUICK_SETTINGS if quick else SETTINGS:
        done = subprocess.run([sys.executable, "-c", CHILD, setting], capture_output=True, text=True, cwd=ROOT,
                              env=env, check=True)
        settings.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"model": MODEL, "warm_steps": WARM_STEPS, "settings": settings}


def render(result: dict[str, Any]) -> str:
    """Per setting: its peak, the ops at it, and the largest allocations alive there."""
    kib = 1024
    lines = [f"{result['model']} (the inputs of `edgetrain.models.cases`), one torch thread: after "
             f"{result['warm_steps']} steps, one step recorded by the c10 allocator's records. The tensor peak is the "
             "most bytes the step held above its start; the live allocations are those made before the peak and not "
             "freed by then (a free matched to the latest live allocation of its size, so with equal sizes an op may "
             "be another's of that size; sizes and totals are exact). Each is named by its innermost enclosing ops.",
             "", "| setting | tensor step peak MiB | ops at the peak | alive at the peak MiB (allocations) |",
             "|---|---|---|---|"]
    for s in result["settings"]:
        lines.append(f"| {s['setting']} | {s['peak_bytes'] / 2**20:.3f} | `{s['ops_at_peak']}` | "
                     f"{s['live_bytes'] / 2**20:.3f} ({s['live_count']}) |")
    for s in result["settings"]:
        lines += ["", f"## {s['setting']}: the largest allocations alive at the peak", "", "| KiB | made by |",
                  "|---|---|", *(f"| {e['nbytes'] / kib:.1f} | `{e['ops']}` |" for e in s["top"])]
    return "\n".join(lines)
