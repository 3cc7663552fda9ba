"""The cost and gain of pinning glibc's mmap threshold (NOTE [ Returning freed memory ]).

Alternates child processes that train a few steps with and without ``configure_allocator()``
(at each of ``--thresholds``; a ``+thp`` suffix runs that setting with PyTorch's
``THP_MEM_ALLOC_ENABLE=1``, huge pages for tensors of 2 MiB and more, as ``edgetrain`` sets it)
and reports, per setting, the median step time and the peak RSS of
the steps (VmHWM reset after the first, warm-up step), and the ratio of the medians measured in
the same run, with the spread (median, IQR, CoV) of the per-round ratios to the default.

    python benchmarks/mmap_threshold.py [--model resnet18 --batch 8 --image 128 --steps 5 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from edgetrain.bench.stats import spread

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--thresholds", default="262144,262144+thp,1048576,default+thp",
                        help="pinned thresholds in bytes ('+thp': with huge pages) to compare with glibc's default")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"default": [], **{t: [] for t in args.thresholds.split(",")}}
    for _ in range(args.rounds):
        for setting in results:
            threshold, _, thp = setting.partition("+")
            env = {key: value for key, value in os.environ.items() if key != "THP_MEM_ALLOC_ENABLE"}
            if thp:
                env["THP_MEM_ALLOC_ENABLE"] = "1"
            out = subprocess.run([sys.executable, "-c", CHILD, threshold, args.model, str(args.batch),
                                  str(args.image), str(args.steps)], capture_output=True, text=True, check=True,
                                 env=env).stdout
            results[setting].append(json.loads(out))
    summary = {setting: {"median_step_s": statistics.median(r["median_step_s"] for r in runs),
                         "peak_rss_mib": statistics.median(r["peak_rss_bytes"] for r in runs) / 2**20}
               for setting, runs in results.items()}
    for figures in summary.values():
        figures["step_time_ratio_to_default"] = figures["median_step_s"] / summary["default"]["median_step_s"]
    round_ratios = {setting: spread([run["median_step_s"] / default["median_step_s"]
                                     for run, default in zip(runs, results["default"], strict=True)]).to_dict()
                    for setting, runs in results.items()}
    print(json.dumps({**vars(args), **summary, "round_ratio_to_default": round_ratios}, indent=1))


if __name__ == "__main__":
    main()
