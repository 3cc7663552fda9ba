"""Free heap at each step's peak under a process budget, per glibc mmap threshold (NOTE [ Returning freed memory ]).

Runs ``edgetrain train`` in a child process per threshold, with a thread that samples the
process's RSS and glibc's ``mallinfo2`` every 0.5 ms and keeps the figures at each step's highest
RSS: the heap's size, its free part (holes between live blocks), and the bytes in mappings of
their own. Free heap that grows from step to step is fragmentation the cushion does not cover.
MobileNetV2 at batch 16, 128 px, under its least process budget (the least that ``train --memory``
accepts in that process); 1 MiB against 256 KiB (:data:`edgetrain.profiling.process.MMAP_THRESHOLD_BYTES`).

Emulated: nothing; glibc on the machine that runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

MODEL, BATCH, IMAGE = "mobilenet_v2", 16, 128
# Below any run's need: the first child is refused, and the next trains at the least budget the refusal names.
MEMORY = "256MiB"
SAMPLES, QUICK_SAMPLES = 300, 64   # one epoch each, less the held-out share and the last short batch
THRESHOLDS = (2**20, 256 * 2**10)
MiB = 2**20
ATTEMPTS = 4   # fresh processes, each at the least budget the one before it was refused at

CHILD = """
import ctypes, json, sys, threading, time
from pathlib import Path
import edgetrain.train.loop as loop
from edgetrain.profiling import process
from edgetrain.train import TrainConfig, train

threshold, model, batch, image, samples, memory, run_dir = sys.argv[1:8]
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t)
                for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = MallInfo2
peak = {"rss": 0}
def rss():
    return process.read_process_memory().rss_bytes
def sample():
    while True:
        now = rss()
        if now > peak["rss"]:
            info = libc.mallinfo2()
            peak.update(rss=now, heap=info.arena, heap_free=info.fordblks, mapped=info.hblkhd)
        time.sleep(0.0005)
steps = []
inner = loop._train_step
def step(*args, **kwargs):
    peak["rss"] = 0
    result = inner(*args, **kwargs)
    steps.append({"peak_rss_bytes": peak["rss"], "heap_bytes": peak["heap"], "heap_free_bytes": peak["heap_free"],
                  "mapped_bytes": peak["mapped"]})
    return result
loop._train_step = step
loop.configure_allocator = lambda: process.configure_allocator(int(threshold))
threading.Thread(target=sample, daemon=True).start()
from edgetrain.errors import InfeasibleBudgetError
try:
    summary = train(TrainConfig(model=model, batch=int(batch), image=int(image), samples=int(samples), epochs=1,
                                save_every=1000, run_dir=Path(run_dir), memory=memory, overwrite=True))
except InfeasibleBudgetError as exc:
    print(json.dumps({"refused_minimum_bytes": exc.minimum_bytes}))
    raise SystemExit(0)
print(json.dumps({"process_peak_bytes": summary.process_peak_bytes, "budget_bytes": summary.budget_bytes,
                  "steps": steps}))
"""


def measure(threshold: int, samples: int) -> dict[str, Any]:
    """One child's training at ``threshold`` under the least budget a fresh process accepts: its process peak, its
    budget and each step's figures at its peak.

    A child refused at a budget names the least one; the next child, a fresh process (a refused attempt leaves
    the heap it grew behind, so a retry in the same process would need more), trains at that, rounded up to a MiB.
    """
    memory = MEMORY
    for _ in range(ATTEMPTS):
        with tempfile.TemporaryDirectory(prefix="heap-slack-") as run_dir:
            done = subprocess.run([sys.executable, "-c", CHILD, str(threshold), MODEL, str(BATCH), str(IMAGE),
                                   str(samples), memory, run_dir], capture_output=True, text=True, check=False,
                                  env={**os.environ, "THP_MEM_ALLOC_ENABLE": "1"})
        if done.returncode:
            raise RuntimeError(f"the training at threshold {threshold} failed:\n{done.stderr[-2000:]}")
        outcome = dict(json.loads(done.stdout.strip().splitlines()[-1]))
        if "refused_minimum_bytes" not in outcome:
            return outcome
        memory = str(-(-outcome["refused_minimum_bytes"] // MiB) * MiB)
    raise RuntimeError(f"no budget found that the training at threshold {threshold} fits in {ATTEMPTS} processes")


TITLE = "Free heap at each step's peak, per mmap threshold"


def run(quick: bool) -> dict[str, Any]:
    """One training per threshold, the thresholds one after the other."""
    samples = QUICK_SAMPLES if quick else SAMPLES
    return {"model": MODEL, "batch": BATCH, "image": IMAGE, "memory": MEMORY, "samples": samples,
            "runs": [{"threshold_bytes": threshold, **measure(threshold, samples)} for threshold in THRESHOLDS]}


def _kib(n: int) -> str:
    return f"{n // 2**10} KiB" if n < MiB else f"{n / MiB:g} MiB"


def render(result: dict[str, Any]) -> str:
    """Per threshold: the process peak against the budget, then the free heap at each step's peak."""
    rows = []
    for r in result["runs"]:
        free = [s["heap_free_bytes"] / MiB for s in r["steps"]]
        over = "over" if r["process_peak_bytes"] > r["budget_bytes"] else "within"
        rows.append(f"| {_kib(r['threshold_bytes'])} | {len(r['steps'])} | {r['process_peak_bytes'] / MiB:.1f} | "
                    f"{r['budget_bytes'] / MiB:.1f} ({over}) | {min(free):.0f}-{max(free):.0f} | "
                    f"{' → '.join(f'{v:.0f}' for v in free)} |")
    return (f"`edgetrain train` of {result['model']} at batch {result['batch']}, {result['image']} px, "
            f"{result['samples']} synthetic samples (one epoch), in a child process per glibc mmap threshold, each "
            "under the least `--memory` that its process accepts. A thread samples the RSS and `mallinfo2` every "
            "0.5 ms and keeps the figures at each step's highest RSS; the free heap there is the holes between live "
            "blocks, which the process budget's cushion does not cover when it grows from step to step.\n\n"
            "| mmap threshold | steps | process peak (MiB) | budget (MiB) | free heap at step peaks (MiB) | "
            "free heap, step by step (MiB) |\n|---|---|---|---|---|---|\n" + "\n".join(rows))


def headline(result: dict[str, Any]) -> str:
    """The process peaks against the budget at each threshold."""
    return "; ".join(f"{_kib(r['threshold_bytes'])}: peak {r['process_peak_bytes'] / MiB:.1f} MiB of "
                     f"{r['budget_bytes'] / MiB:.1f}" for r in result["runs"])
