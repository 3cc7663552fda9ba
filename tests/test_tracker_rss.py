"""LiveBytesTracker against a second instrument: the kernel's count of resident pages.

A child process runs with glibc's ``MALLOC_MMAP_THRESHOLD_=4096`` (every allocation of 4 KiB
or more is its own mmap, returned to the kernel on free) and ``MALLOC_TRIM_THRESHOLD_=0``, so its
resident set rises and falls with the tensors it holds. For a steady-state SGD step run by the
executor, it measures the tracker's peak above the step's start, then runs the same step again
with the tracker off and reads the kernel's high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) above the resident set at the start.

Measured (torch 2.13, CPU, one thread, 3 runs each; docs/concepts/memory.md): the RSS rise is
0.9963-0.9993 of the tracker's peak for the small transformer (32 x 128 tokens) at keep-all,
half-way and least memory, and 0.9975-0.9982 for ResNet-18 (8 x 96 px) at least memory; the
RSS is below by 60-180 KB, small tensors served from malloc arena pages already resident. Where a
convolution's kernel scratch is at the peak the RSS is above (ResNet-18 keep-all +1.4%,
MobileNetV2 least memory +21%). A plan counts that scratch (NOTE [ A kernel's scratch in the
plan ] in chain.py), and the kernel is compared with the plan: once each, the RSS rise was 0.9991 /
0.9966 / 0.9961 of the planned peak for the transformer (no scratch), 0.996 / 0.9945 / 0.9547 for
ResNet-18 at keep-all, half-way and least memory, and 1.0008 / 0.9953 for MobileNetV2 at keep-all
and least: below where a kernel leaves pages of its scratch
untouched, never more than 0.1% above. The kernel lies between the plan's tensors and the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from steps import peak_tracks

CHILD = textwrap.dedent('''
    import json, sys
    import torch
    from edgetrain.models import get_model_spec
    from edgetrain.core.optim import make_optimizer
    from edgetrain.planners import solve
    from edgetrain.profiling import LiveBytesTracker, profile
    from edgetrain.runtime import run_schedule
    from edgetrain.core.schedule import keep_all
    from edgetrain.core.simulator import simulate
    from edgetrain.models.stages import training_stages

    def status(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

    torch.set_num_threads(1)
    name, batch, size, fractions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    spec = get_model_spec(name)
    torch.manual_seed(0)
    model = spec.build(num_classes=10)
    x, y = spec.example_input(batch, size), spec.example_target(batch, num_classes=10)
    chain = profile(model, x, y, measure_time=False)
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    table = solve(chain, top + top // 100, slots=500)
    low, high = table.min_memory_bytes, table.max_memory_bytes
    stages, opt = training_stages(model), make_optimizer("sgd", model.parameters())
    rows = []
    for fraction in fractions:
        schedule = table.schedule(int(low + (high - low) * fraction))
        for _ in range(2):   # momentum buffers exist; the allocator has settled
            opt.zero_grad(set_to_none=True)
            run_schedule(stages, schedule, x, y)
            opt.step()
        opt.zero_grad(set_to_none=True)
        with LiveBytesTracker() as tracker:
            tracker.register_training_state(model, opt, x, y)
            start = tracker.current_bytes
            run_schedule(stages, schedule, x, y)
            opt.step()
        tracked = tracker.peak_bytes - start
        del tracker
        opt.zero_grad(set_to_none=True)
        before = status("VmRSS:")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")   # VmHWM := VmRSS
        run_schedule(stages, schedule, x, y)
        opt.step()
        rows.append({"fraction": fraction, "tracked": tracked, "rss": status("VmHWM:") - before,
                     "recomputes": simulate(chain, schedule).forward_advances > 0,
                     "planned": simulate(chain, schedule).peak_bytes - chain.between_steps_bytes,
                     "planned_tensors": simulate(chain.without_scratch(), schedule).peak_bytes
                     - chain.between_steps_bytes})
    print(json.dumps(rows))
''')

# The RSS rise over the plan's peak: measured 0.9961-0.9991 where no scratch is at the peak (see the module
# docstring); the band leaves room for the arena's share, which moved by up to 0.15% between runs of the same step.
# A plan missing one saved activation of these steps (>= 0.5 MB, 1% of the peak) falls outside.
RSS_OVER_PLANNED = (0.99, 1.005)


def rss_against_tracker(name: str, batch: int, size: int, fractions: list[float]) -> list[dict[str, object]]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4096", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", CHILD, name, str(batch), str(size), json.dumps(fractions)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


needs_proc = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists() or sys.platform != "linux",
                                reason="needs Linux's /proc/self/clear_refs and glibc's malloc")


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize(("name", "batch", "size", "fractions"), [
    ("transformer_small", 32, 128, [1.0, 0.5, 0.0]),
    ("resnet18", 8, 96, [0.0]),
])
def test_tracker_peak_agrees_with_the_kernel(name: str, batch: int, size: int, fractions: list[float],
                                             record_property: pytest.RecordProperty) -> None:
    rows = rss_against_tracker(name, batch, size, fractions)
    record_property("rss_over_planned", [row["rss"] / row["planned"] for row in rows])
    low, high = RSS_OVER_PLANNED
    for row in rows:
        # the kernel between the plan's tensors and the plan with its kernels' scratch (whose pages a kernel may
        # leave untouched); the tracker at the plan's tensors
        assert low * row["planned_tensors"] <= row["rss"] <= high * row["planned"], row
        assert peak_tracks(row["tracked"], row["planned_tensors"]), row
    if len(rows) > 1:
        # The two instruments see the same saving from keep-all to least memory (within 1% of keep-all).
        saved_tracked, saved_rss = rows[0]["tracked"] - rows[-1]["tracked"], rows[0]["rss"] - rows[-1]["rss"]
        assert rows[-1]["recomputes"] and saved_tracked > 0
        assert abs(saved_rss - saved_tracked) <= 0.01 * rows[0]["tracked"], rows
