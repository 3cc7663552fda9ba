"""Free heap at each step's peak under a process budget, per glibc mmap threshold (NOTE [ Returning freed memory ]).

Runs ``edgetrain train`` in a child process per threshold, with a thread that samples the
process's RSS and glibc's ``mallinfo2`` every 0.5 ms and keeps the figures at each step's highest
RSS: the heap's size, its free part (holes between live blocks), and the bytes in mappings of
their own. Free heap that grows from step to step is fragmentation the cushion does not cover.

    python benchmarks/heap_slack.py [--model mobilenet_v2 --batch 16 --image 128 --samples 300 --memory 511MiB]

Emulated: nothing; glibc on this machine (x86-64, 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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
summary = train(TrainConfig(model=model, batch=int(batch), image=int(image), samples=int(samples), epochs=1,
                            save_every=1000, run_dir=Path(run_dir), memory=memory, overwrite=True))
print(json.dumps({"process_peak_bytes": summary.process_peak_bytes, "budget_bytes": summary.budget_bytes,
                  "steps": steps}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--memory", default="511MiB")
    parser.add_argument("--thresholds", default="1048576,262144", help="mmap thresholds in bytes, comma-separated")
    args = parser.parse_args()
    results = {}
    for threshold in args.thresholds.split(","):
        with tempfile.TemporaryDirectory() as run_dir:
            out = subprocess.run([sys.executable, "-c", CHILD, threshold, args.model, str(args.batch), str(args.image),
                                  str(args.samples), args.memory, run_dir], capture_output=True, text=True,
                                 check=True, env={**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}).stdout
        results[threshold] = json.loads(out.strip().splitlines()[-1])
        mib = 2**20
        free = [round(s["heap_free_bytes"] / mib, 1) for s in results[threshold]["steps"]]
        print(f"threshold {threshold}: process peak {results[threshold]['process_peak_bytes'] / mib:.1f} MiB "
              f"(budget {results[threshold]['budget_bytes'] / mib:.1f}); free heap at each step's peak, MiB: {free}",
              flush=True)
    print(json.dumps({**vars(args), "results": results}))


if __name__ == "__main__":
    main()
