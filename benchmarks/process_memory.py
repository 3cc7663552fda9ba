"""Process memory against --memory: what the kernel saw of real `edgetrain train` runs at three budgets each.

For each configuration of the demo's node-fit table, scaled to run here (smaller batch and
image, same models), three budgets between the least the process can train in and plain
training's process peak: the budget, the runtime baseline, the tensor peak (tracked), the
process peak (VmHWM from training's start, and /usr/bin/time-style ru_maxrss of the whole
process including start-up, a second instrument), and the overhead process peak - tensor
peak. The claim checked: process peak <= budget at every point. Each run trains a dozen steps
or more: allocator slack can build up over the first steps (NOTE [ Returning freed memory ]),
which a run of three steps would hide.

    python benchmarks/process_memory.py [--out out/bench/process_memory.json] [--configs resnet18:8:128,...]

Emulated: nothing; this machine is x86-64 with 2 cores, so baselines are this machine's (PyTorch
on an aarch64 board has a different import footprint).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CONFIGS = "resnet18:8:128,resnet50:4:128,resnet152:2:128,mobilenet_v2:16:128"  # demo's table, scaled down


def train(run_dir: Path, model: str, batch: int, image: int, memory: int | None) -> tuple[int, str, int]:
    """Run `edgetrain train` once; returns (exit code, stderr, max RSS of the child in bytes)."""
    args = [sys.executable, "-m", "edgetrain", "train", "--model", model, "--batch", str(batch), "--image",
            str(image), "--samples", str(max(batch * 16, 60)), "--epochs", "1", "--save-every", "1000", "--run-dir",
            str(run_dir)]
    if memory is not None:
        args += ["--memory", str(memory)]
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=errors, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS, start-up included
        child.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        return child.returncode, errors.read(), usage.ru_maxrss * 1024


def point(root: Path, model: str, batch: int, image: int, memory: int | None) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    code, stderr, max_rss = train(run_dir, model, batch, image, memory)
    if code != 0:
        raise SystemExit(f"{model} at {memory}: {stderr.strip().splitlines()[-1]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    row = {key: summary[key] for key in ("budget_bytes", "runtime_baseline_bytes", "measured_peak_bytes",
                                         "predicted_peak_bytes", "process_peak_bytes",
                                         "predicted_process_peak_bytes", "recompute_factor", "strategy")}
    row.update(model=model, batch=batch, image=image, whole_process_max_rss_bytes=max_rss,
               overhead_bytes=summary["process_peak_bytes"] - (summary["measured_peak_bytes"] or 0),
               within_budget=None if memory is None else summary["process_peak_bytes"] <= memory)
    return row


def least_budget(root: Path, model: str, batch: int, image: int) -> int:
    code, stderr, _ = train(Path(tempfile.mkdtemp(dir=root)), model, batch, image, 2**20)
    found = re.search(r"\((\d+) bytes\)\s*$", stderr.strip())
    if code != 2 or found is None:
        raise SystemExit(f"{model}: expected a refusal with the least budget, got {stderr!r}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=CONFIGS, help="model:batch:image, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("out/bench/process_memory.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for config in args.configs.split(","):
            model, batch, image = config.split(":")
            plain = point(root, model, int(batch), int(image), None)
            least = least_budget(root, model, int(batch), int(image))
            top = max(least, int(plain["process_peak_bytes"]))
            for budget in sorted({least + 2**23, (least + top) // 2, top + 2**23}):  # 8 MiB: baselines vary run to run
                row = point(root, model, int(batch), int(image), budget)
                rows.append(row)
                mib = 2**20
                print(f"{model} b{batch} {image}px budget {budget / mib:7.1f} MiB: baseline "
                      f"{row['runtime_baseline_bytes'] / mib:6.1f}, "
                      f"tensor peak {row['measured_peak_bytes'] / mib:6.1f}, "
                      f"process peak {row['process_peak_bytes'] / mib:6.1f} (whole process "
                      f"{row['whole_process_max_rss_bytes'] / mib:6.1f}), overhead {row['overhead_bytes'] / mib:6.1f}, "
                      f"ρ {row['recompute_factor']:.3f}, within budget: {row['within_budget']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"all within budget: {all(r['within_budget'] for r in rows)}; wrote {args.out}")


if __name__ == "__main__":
    main()
