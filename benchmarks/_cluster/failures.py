"""The **failures** and **save** rows: what a failed node costs the cluster, and the saves that keep it small.

* :func:`failure_run`: one run of 3 nodes with a node killed (SIGKILL), stopped (SIGSTOP) or cut off (its link
  taken down) at step 4 or later, once the warm spares are ready (NOTE [ Warm spares ]); :func:`failure_row`: a
  failure over its runs (detection, restarts, steps lost and repeated, stall, and the longest heartbeat gap of a
  healthy node: the margin of the heartbeat timeout against a false alarm).
* :func:`state_save_row`: durable saves of a model's training state (what rank 0 pays every ``save_every`` steps, so
  that a restart loses no step).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from edgetrain.distributed.node import NodeSpec
from edgetrain.distributed.supervisor import Fault, LocalOptions, run_local
from edgetrain.train import TrainConfig

from .common import load_average, per_run, spread_of, spread_text, step_medians, step_records


def add_options(parser: argparse.ArgumentParser) -> None:
    """None: each failure run is given its fault, samples and link (``benchmarks/cluster_failures.py``)."""


def failure_run(run_dir: Path, kind: str, cpus: float, samples: int, preset: str | None) -> dict[str, Any]:
    """One run of 3 nodes of the small token model (``samples`` samples, batch 6, 80% for training) with a ``kind``
    fault on node 1 at step 4 or later, once the warm spares are ready (NOTE [ Warm spares ]); the nodes in network
    namespaces with ``preset``'s links where one is given (a cut needs one), else plain processes. On a saturated
    machine the idle-priority spares may not be ready before the run ends: then no fault is injected and the run says
    so (``injected``)."""
    config = TrainConfig(model="transformer_small", samples=samples, batch=6, image=16, epochs=1,
                         save_every=1, run_dir=run_dir)
    started, load = time.time(), load_average()
    options = LocalOptions(faults=(Fault(1, 4, kind),), preset=preset, cpus_per_node=cpus)
    report = run_local(config, [NodeSpec()] * 3, options)
    steps = step_records(config.run_dir)
    (failure,) = report["failures"] or [dict.fromkeys(("detection_s", "last_step_before", "steps_lost",
                                                       "steps_repeated", "stall_s"))]
    repeated = failure["steps_repeated"]
    return {"injected": bool(report["failures"]), "detection_s": failure["detection_s"], "restarts": report["restarts"],
            "after_step": failure["last_step_before"], "steps_lost": failure["steps_lost"],
            "steps_repeated": repeated, "stall_s": failure["stall_s"],
            "samples_repeated": None if repeated is None else repeated * config.batch,
            "heartbeat_max_gap_s": report["heartbeat_max_gap_s"], "finished_steps": len(steps), **step_medians(steps),
            "contiguous": [r["step"] for r in steps] == list(range(1, len(steps) + 1)), "wall_s": time.time() - started,
            "load": load, "emulation": report["emulation"]}


def failure_row(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One failure kind over its runs: detection, stall and the healthy nodes' heartbeat gap with their spread;
    restarts, steps lost and repeated per run (each should be the same every time)."""
    return {"kind": kind, "repeats": len(runs), "injected": sum(r["injected"] for r in runs),
            "after_step": [r["after_step"] for r in runs],
            "detection_s": spread_of([r["detection_s"] for r in runs]),
            "stall_s": spread_of([r["stall_s"] for r in runs]),
            "heartbeat_max_gap_s": spread_of([r["heartbeat_max_gap_s"] for r in runs]),
            "step_s": spread_of([r.get("step_s") for r in runs]), "sync_s": spread_of([r.get("sync_s") for r in runs]),
            "restarts": [r["restarts"] for r in runs], "steps_lost": [r["steps_lost"] for r in runs],
            "steps_repeated": [r["steps_repeated"] for r in runs],
            "samples_repeated": [r["samples_repeated"] for r in runs],
            "finished_steps": [r["finished_steps"] for r in runs], "contiguous": all(r["contiguous"] for r in runs),
            "runs": runs, "emulation": runs[0]["emulation"]}


def state_save_row(model_name: str, saves: int, folder: Path) -> dict[str, Any]:
    """What rank 0 pays every ``save_every`` steps: ``saves`` durable saves into ``folder`` of the model's training
    state with SGD momentum (``StateStore.save(TrainingState.capture(...))``, as a node saves), one torch thread."""
    import torch

    from edgetrain.core.optim import make_optimizer
    from edgetrain.models.registry import get_model_spec
    from edgetrain.train.state import StateStore, TrainingState

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec = get_model_spec(model_name)
        model = spec.builder(spec.default_num_classes)
        optimizer = make_optimizer("sgd", model.parameters())
        for parameter in model.parameters():  # one step, so the momentum buffers exist
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()
        store, times_s = StateStore(folder), []
        for step in range(1, saves + 1):
            started = time.perf_counter()
            path = store.save(TrainingState.capture(step=step, epoch=0, model=model, optimizer=optimizer))
            times_s.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return {"model": model_name, "saves": saves, "state_bytes": path.stat().st_size, "save_s": spread_of(times_s),
            "times_s": times_s}


def render(result: dict[str, Any]) -> list[str]:
    """The failure and save tables' markdown lines (none when ``result`` has neither)."""
    out: list[str] = []
    if "failures" in result:
        out += ["", "| failure | injected / runs | after step | detection s (median, IQR, CoV) | restarts | steps "
                "lost | steps (samples) repeated | stall s (median, IQR, CoV) | finished, in order | longest healthy "
                "heartbeat gap s (median, IQR, CoV) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in result.get("failures", []):
        if "skipped" in r:
            out.append(f"| {r['kind']} | skipped: {r['skipped']} | | | | | | | | |")
            continue
        out.append(f"| {r['kind']} | {r['injected']} / {r['repeats']} | {per_run(r['after_step'])} | "
                   f"{spread_text(r['detection_s'])} | "
                   f"{per_run(r['restarts'])} | {per_run(r['steps_lost'])} | {per_run(r['steps_repeated'])} "
                   f"({per_run(r['samples_repeated'])}) | {spread_text(r['stall_s'])} | "
                   f"{per_run(r['finished_steps'])} steps, {'yes' if r['contiguous'] else 'NO'} | "
                   f"{spread_text(r['heartbeat_max_gap_s'])} |")
    for r in result.get("save", []):
        out += ["", f"Saving a {r['model']} training state with momentum ({r['state_bytes'] / 1e6:.1f} MB, durable, "
                f"one torch thread), {r['saves']} saves: {spread_text(r['save_s'])} s"]
    return out
