"""The cost and gain of pinning glibc's mmap threshold (NOTE [ Returning freed memory ]).

Alternates child processes that train a few steps with and without ``configure_allocator()``
(at each of ``SETTINGS``; a ``+thp`` suffix runs that setting with PyTorch's
``THP_MEM_ALLOC_ENABLE=1``, huge pages for tensors of 2 MiB and more, as ``edgetrain`` sets it)
and reports, per setting, the median step time and the peak RSS of the steps (VmHWM reset after
the first, warm-up step), and the ratio of the medians measured in the same round, with the
spread (median, IQR, CoV) of the per-round ratios to the default.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from edgetrain.bench.stats import Spread, spread

MODEL, BATCH, IMAGE = "mobilenet_v2", 16, 128
STEPS, ROUNDS = 4, 5
QUICK_STEPS, QUICK_ROUNDS, QUICK_IMAGE = 2, 2, 64
# Pinned thresholds in bytes ("+thp": with huge pages) against glibc's default, every round in this order.
SETTINGS = ("default", "262144", "262144+thp", "1048576", "default+thp")
MiB = 2**20

CHILD = """
import json, sys, time, torch
from edgetrain.profiling.process import configure_allocator, read_process_memory, reset_peak
if sys.argv[1] != "default":
    configure_allocator(int(sys.argv[1]))
from edgetrain.models import get_model_spec
from edgetrain.core.optim import make_optimizer
torch.set_num_threads(1)
torch.manual_seed(0)
model = get_model_spec(sys.argv[2]).build(10)
optimizer = make_optimizer("sgd", model.parameters())
batch, image, steps = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
x, y = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
times = []
for step in range(steps + 1):
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
    if step == 0:
        reset_peak()
print(json.dumps({"median_step_s": sorted(times[1:])[len(times[1:]) // 2],
                  "peak_rss_bytes": read_process_memory().peak_rss_bytes}))
"""


def measure(setting: str, image: int, steps: int) -> dict[str, float]:
    """One child's median step time (after a warm-up step) and its peak RSS over those steps."""
    threshold, _, thp = setting.partition("+")
    env = {key: value for key, value in os.environ.items() if key != "THP_MEM_ALLOC_ENABLE"}
    if thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, threshold, MODEL, str(BATCH), str(image), str(steps)],
                         capture_output=True, text=True, check=True, env=env).stdout
    return dict(json.loads(out))


TITLE = "What pinning glibc's mmap threshold costs and gains"


def run(quick: bool) -> dict[str, Any]:
    """Every setting once per round, in the same order, so that each round's ratio to the default shares its load."""
    image, steps, rounds = (QUICK_IMAGE, QUICK_STEPS, QUICK_ROUNDS) if quick else (IMAGE, STEPS, ROUNDS)
    runs: dict[str, list[dict[str, float]]] = {setting: [] for setting in SETTINGS}
    for _ in range(rounds):
        for setting in SETTINGS:
            runs[setting].append(measure(setting, image, steps))
    rows = []
    for setting, measured in runs.items():
        rows.append({"setting": setting,
                     "step_s": spread([r["median_step_s"] for r in measured]).to_dict(),
                     "peak_rss_bytes": statistics.median(r["peak_rss_bytes"] for r in measured),
                     "ratio_to_default": spread([r["median_step_s"] / d["median_step_s"]
                                                 for r, d in zip(measured, runs["default"], strict=True)]).to_dict()})
    return {"model": MODEL, "batch": BATCH, "image": image, "steps": steps, "rounds": rounds, "rows": rows}


def _label(setting: str) -> str:
    threshold, _, thp = setting.partition("+")
    name = "glibc's default" if threshold == "default" else f"pinned at {int(threshold) // 2**10} KiB"
    return name + (", huge pages" if thp else "")


def render(result: dict[str, Any]) -> str:
    """One row per setting: step time, its ratio to the default's in the same round, peak RSS."""
    lines = []
    for r in result["rows"]:
        step, ratio = Spread.from_dict(r["step_s"]), Spread.from_dict(r["ratio_to_default"])
        lines.append(f"| {_label(r['setting'])} | {step.median * 1e3:.0f} | {step.cov_text} | {ratio.median:.2f}x | "
                     f"{ratio.q1:.2f}-{ratio.q3:.2f} | {r['peak_rss_bytes'] / MiB:.0f} |")
    return (f"{result['model']} at batch {result['batch']}, {result['image']} px, SGD, one thread: a child process "
            f"per setting trains {result['steps']} steps after a warm-up step, every setting once per round, "
            f"{result['rounds']} rounds. A step's time is its child's median; the ratio is to the default's in the "
            "same round (median and quartiles over the rounds). Peak RSS is the steps' VmHWM, reset after the "
            "warm-up step. Huge pages: PyTorch's `THP_MEM_ALLOC_ENABLE=1`, which `edgetrain` sets.\n\n"
            "| allocator | step (ms) | CoV over rounds | step time to default | its quartiles | peak RSS (MiB) |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(lines))


def headline(result: dict[str, Any]) -> str:
    """The pinned threshold's step time and peak RSS against the default's, with and without huge pages."""
    rows = {r["setting"]: r for r in result["rows"]}
    pinned, default = rows["262144+thp"], rows["default"]
    return (f"pinned at 256 KiB with huge pages: {pinned['ratio_to_default']['median']:.2f}x the default's step "
            f"time, peak RSS {pinned['peak_rss_bytes'] / MiB:.0f} MiB against {default['peak_rss_bytes'] / MiB:.0f}")
