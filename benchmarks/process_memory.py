"""Process memory against --memory: real `edgetrain train` runs, each in a memory cgroup limited to its budget.

For each configuration of the demo's node-fit table, scaled to run here (smaller batch and image, same models), three
budgets between the least the process can train in and plain training's process peak. Each budgeted run is the real
command line in a subprocess that joins a fresh memory cgroup before it starts, limited to the budget (swap
included), so the kernel itself enforces ``--memory`` and counts what the process uses. Per run: the budget, the
runtime baseline, the tensor peak (tracked), the process peak (VmHWM from training's start) and what of it neither
the baseline nor the tensors explain, the child's own ``ru_maxrss`` (the whole process, start-up included, a second
instrument), and the kernel's figures for the cgroup: its peak charge from training's start
(``memory.max_usage_in_bytes``, which edgetrain resets when training begins; resident memory, page cache the run
fills and kernel memory; a peak equal to the limit means the kernel had to reclaim to keep the run inside), and OOM
kills. Plain training runs in a cgroup without a limit, a meter only. The claim checked: every run completes inside
its cgroup, with peak RSS and the kernel's peak within the budget.

Each run trains a dozen steps or more: allocator slack can build up over the first steps (NOTE [ Returning freed
memory ]), which a run of three steps would hide. Every cgroup made is removed afterwards, also when a run fails.

This machine is x86-64, so baselines are this machine's (PyTorch on an aarch64 board has a different import
footprint). Without root or a memory cgroup controller the benchmark is skipped, with the reason in its result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgetrain.errors import EdgetrainError
from edgetrain.sysutil.memory_cgroups import MemoryCgroup, memory_cgroup, memory_cgroup_unavailable

TITLE = "The whole training process against --memory, as the kernel counts it"

# (model, batch, image side): the demo's node-fit table, scaled down
CONFIGS = (("resnet18", 8, 128), ("resnet50", 4, 128), ("resnet152", 2, 128), ("mobilenet_v2", 16, 128))
QUICK_CONFIGS = (("resnet18", 8, 96),)   # 96 px: the least budget already recomputes
MARGIN_BYTES = 8 * 2**20   # above the least and above plain's peak: a run's measured baseline varies by a few MiB
PAGE = 4096                # the kernel keeps whole pages: budgets are page multiples
MiB = 2**20


def _command(model: str, batch: int, image: int, run_dir: Path, memory: int | None) -> list[str]:
    args = [sys.executable, "-m", "edgetrain", "train", "--model", model, "--batch", str(batch), "--image",
            str(image), "--samples", str(max(batch * 16, 60)), "--epochs", "1", "--save-every", "1000", "--run-dir",
            str(run_dir)]
    return args + ([] if memory is None else ["--memory", str(memory)])


def train(command: list[str], group: MemoryCgroup | None) -> tuple[int, str, int]:
    """Run ``command`` once, inside ``group`` when given; returns (exit code, stderr, the child's max RSS in bytes)."""
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, stdin=subprocess.DEVNULL,
                                 preexec_fn=None if group is None else group.enter)
        _, status, usage = os.wait4(child.pid, 0)   # this child's own rusage: its peak RSS, start-up included
        child.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        return child.returncode, errors.read(), usage.ru_maxrss * 1024


def point(root: Path, model: str, batch: int, image: int, memory: int | None) -> dict[str, Any]:
    """One run in a fresh cgroup limited to ``memory`` (a meter only for None): the run's and the kernel's figures."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    with memory_cgroup(memory, prefix="edgetrain-bench") as group:
        code, stderr, max_rss = train(_command(model, batch, image, run_dir, memory), group)
        kernel = {"cgroup_peak_bytes": group.peak_bytes(), "oom_kills": group.oom_kills()}
    row: dict[str, Any] = {"model": model, "batch": batch, "image": image, "budget_bytes": memory, "exit_code": code,
                           "whole_process_max_rss_bytes": max_rss, **kernel}
    if code != 0:
        lines = stderr.strip().splitlines()
        row.update(completed=False, error=lines[-1] if lines else f"exit code {code}", within_budget=False)
        return row
    summary = json.loads((run_dir / "summary.json").read_text())
    row.update({key: summary[key] for key in ("runtime_baseline_bytes", "measured_peak_bytes", "predicted_peak_bytes",
                                              "process_peak_bytes", "predicted_process_peak_bytes",
                                              "recompute_factor", "strategy")})
    tensors = summary["measured_peak_bytes"] or 0
    row.update(completed=True,
               unplanned_bytes=summary["process_peak_bytes"] - summary["runtime_baseline_bytes"] - tensors,
               cushion_bytes=(summary["predicted_process_peak_bytes"] - summary["runtime_baseline_bytes"]
                              - summary["predicted_peak_bytes"]),
               within_budget=None if memory is None else (
                   summary["process_peak_bytes"] <= memory
                   and (kernel["cgroup_peak_bytes"] is None or kernel["cgroup_peak_bytes"] <= memory)))
    return row


def least_budget(root: Path, model: str, batch: int, image: int) -> int:
    """The least process budget the run trains in, from edgetrain's refusal of an impossible one."""
    code, stderr, _ = train(_command(model, batch, image, Path(tempfile.mkdtemp(dir=root)), MiB), None)
    found = re.search(r"\((\d+) bytes\)\s*$", stderr.strip())
    if code != 2 or found is None:
        raise EdgetrainError(f"{model}: expected a refusal naming the least budget, got {stderr.strip()!r}")
    return int(found.group(1))


def budgets(least: int, plain_peak: int) -> list[int]:
    """Three page-aligned budgets: just above the least, halfway to plain training's peak, just above that peak."""
    top = max(least, plain_peak)
    values = (least + MARGIN_BYTES, max((least + top) // 2, least + MARGIN_BYTES), top + MARGIN_BYTES)
    return sorted({-(-value // PAGE) * PAGE for value in values})


def run(quick: bool) -> dict[str, Any]:
    """Every configuration: plain training in a meter cgroup, the least budget, then three budgeted runs."""
    reason = memory_cgroup_unavailable()
    if reason is not None:
        return {"skipped": reason, "plain": [], "rows": []}
    plain_rows, rows = [], []
    with tempfile.TemporaryDirectory(prefix="edgetrain-process-memory-") as tmp:
        root = Path(tmp)
        for model, batch, image in QUICK_CONFIGS if quick else CONFIGS:
            plain = point(root, model, batch, image, None)
            if not plain["completed"]:
                raise EdgetrainError(f"{model}: plain training failed: {plain['error']}")
            least = least_budget(root, model, batch, image)
            plain_rows.append({**plain, "least_budget_bytes": least})
            rows += [point(root, model, batch, image, budget) for budget in budgets(least, plain["process_peak_bytes"])]
    return {"skipped": None, "plain": plain_rows, "rows": rows}


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def render(result: dict[str, Any]) -> str:
    """The plain runs, every budgeted run, and the verdict."""
    if result["skipped"]:
        return f"Not measured: {result['skipped']}."
    parts = ["Each run is `edgetrain train --memory M` in a memory cgroup limited to `M` (swap included): the kernel "
             "enforces the budget and counts the whole process. *Process peak* is VmHWM from training's start; "
             "*max RSS* the child's `ru_maxrss`, start-up included; *kernel peak* the cgroup's "
             "`memory.max_usage_in_bytes` from training's start (edgetrain resets it when training begins), which "
             "counts resident memory, page cache the run fills and kernel memory; *at limit* says the kernel's peak "
             "reached the limit, so that the kernel reclaimed (page cache first) to keep the run inside. *Unplanned* "
             "is process peak - baseline - tensor peak, what the plan's *cushion* (the predicted process peak - "
             "baseline - predicted tensor peak) is there to cover. Sizes in MiB.",
             "## Plain training\n\nIn a cgroup without a limit, a meter only; the least budget is the one edgetrain "
             "names when it refuses an impossible one.\n\n"
             "| model | batch | image | least budget | baseline | tensor peak | process peak | max RSS "
             "| kernel peak |\n"
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
             + "\n".join(f"| {p['model']} | {p['batch']} | {p['image']} | {_mib(p['least_budget_bytes'])} | "
                         f"{_mib(p['runtime_baseline_bytes'])} | {_mib(p['measured_peak_bytes'])} | "
                         f"{_mib(p['process_peak_bytes'])} | {_mib(p['whole_process_max_rss_bytes'])} | "
                         f"{_mib(p['cgroup_peak_bytes'])} |" for p in result["plain"])]
    lines = ["## Under --memory\n",
             "| model | budget | baseline | tensor peak | process peak | max RSS | kernel peak | at limit "
             "| OOM kills | unplanned | cushion | ρ | process peak ≤ budget |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        if not r["completed"]:
            lines.append(f"| {r['model']} | {_mib(r['budget_bytes'])} | | | | {_mib(r['whole_process_max_rss_bytes'])} "
                         f"| {_mib(r['cgroup_peak_bytes'])} | {_at_limit(r)} | {r['oom_kills']} | | | | "
                         f"failed: {r['error']} |")
            continue
        lines.append(f"| {r['model']} b{r['batch']} {r['image']} px | {_mib(r['budget_bytes'])} | "
                     f"{_mib(r['runtime_baseline_bytes'])} | {_mib(r['measured_peak_bytes'])} | "
                     f"{_mib(r['process_peak_bytes'])} | {_mib(r['whole_process_max_rss_bytes'])} | "
                     f"{_mib(r['cgroup_peak_bytes'])} | {_at_limit(r)} | {r['oom_kills']} | "
                     f"{_mib(r['unplanned_bytes'])} | {_mib(r['cushion_bytes'])} | {r['recompute_factor']:.3f} | "
                     f"{'yes' if r['process_peak_bytes'] <= r['budget_bytes'] else 'no'} |")
    parts.append("\n".join(lines))
    done = [r for r in result["rows"] if r["completed"]]
    if done:
        tight = min(done, key=lambda r: r["budget_bytes"] - r["process_peak_bytes"])
        parts.append(f"Least headroom: {_mib(tight['budget_bytes'] - tight['process_peak_bytes'])} MiB between the "
                     f"process peak and the budget ({tight['model']} b{tight['batch']} at "
                     f"{_mib(tight['budget_bytes'])} MiB).")
    parts.append(f"**{_verdict(result)}.**")
    return "\n\n".join(parts)


def _at_limit(row: dict[str, Any]) -> str:
    """Whether the kernel's peak reached the cgroup's limit (the budget)."""
    peak = row["cgroup_peak_bytes"]
    return "-" if peak is None else "yes" if peak >= row["budget_bytes"] else "no"


def _verdict(result: dict[str, Any]) -> str:
    rows = result["rows"]
    done = [r for r in rows if r["completed"]]
    rss_within = sum(r["process_peak_bytes"] <= r["budget_bytes"] for r in done)
    models = len({(r["model"], r["batch"], r["image"]) for r in rows})
    shares = [r["cgroup_peak_bytes"] / r["budget_bytes"] for r in done if r["cgroup_peak_bytes"]]
    kernel = "" if not shares else f", the kernel's peak {min(shares):.0%}-{max(shares):.0%} of it"
    reclaimed = sum(_at_limit(r) == "yes" for r in done)
    if reclaimed:
        kernel += f", reclaiming at the limit in {reclaimed} run{'s' if reclaimed != 1 else ''}"
    return (f"{len(done)} of {len(rows)} budgets, {models} model{'s' if models != 1 else ''}: the run completes in a "
            f"cgroup limited to the budget{kernel}; peak RSS within the budget at {rss_within} of {len(rows)}")


def headline(result: dict[str, Any]) -> str:
    """The README's figure: how many budgeted runs held, on how many models, and the kernel's peaks."""
    return f"not measured: {result['skipped']}" if result["skipped"] else _verdict(result)
