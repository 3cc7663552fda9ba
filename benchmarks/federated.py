"""Federated mode: loss, bytes and every node's peak memory against its budget, per round.

Runs ``edgetrain cluster federated``'s library call (:func:`edgetrain.distributed.federated_local.run_local`: a
Flower server and one process per node on this machine, plain localhost processes, no shaping, no
cgroup) and tabulates each round's record from ``metrics.jsonl``: the held-out loss and accuracy of
the averaged model (weighted by the nodes' held-out samples), the nodes' mean training loss, the
bytes of serialised weights sent down (to every node, for training and for evaluation) and up, and
each node's peak resident memory (VmHWM from its planning on) against its ``MEMORY`` budget.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from edgetrain.distributed.federated import METRICS, FederatedConfig
from edgetrain.distributed.federated_local import run_local
from edgetrain.distributed.supervisor import free_port
from edgetrain.units import format_bytes

NODES, MODEL, IMAGE, BATCH, OPTIMIZER, MEMORY = 2, "resnet18_cifar", 32, 32, "sgd", "1GiB"
ROUNDS, LOCAL_STEPS, SAMPLES = 5, 10, 1000
QUICK_ROUNDS, QUICK_LOCAL_STEPS, QUICK_SAMPLES = 1, 2, 400
# In-situ node folders (``edgetrain insitu run``'s ``teacher.pt`` and ``frames/``), one per node, for the in-situ task
# instead of MODEL on synthetic samples; empty: the synthetic task.
STORES: tuple[str, ...] = ()

TITLE = "Federated training: loss, bytes and node memory per round"


def run(quick: bool) -> dict[str, Any]:
    """One federated run on this machine into a temporary run directory; its summary and every round's record."""
    rounds, local_steps, samples = (QUICK_ROUNDS, QUICK_LOCAL_STEPS, QUICK_SAMPLES) if quick \
        else (ROUNDS, LOCAL_STEPS, SAMPLES)
    with tempfile.TemporaryDirectory(prefix="federated-") as run_dir:
        config = FederatedConfig(run_dir=run_dir, nodes=NODES, rounds=rounds, local_steps=local_steps, batch=BATCH,
                                 model=MODEL, samples=samples, image=IMAGE, stores=STORES, memory=(MEMORY,),
                                 optimizer=OPTIMIZER,
                                 address=f"127.0.0.1:{free_port()}", overwrite=True)
        started = time.perf_counter()
        summary = run_local(config)
        wall_s = time.perf_counter() - started
        records = [json.loads(line) for line in (Path(run_dir) / METRICS).read_text().splitlines()]
    return {"nodes": NODES, "stores": list(STORES), "model": MODEL, "image": IMAGE, "batch": BATCH,
            "optimizer": OPTIMIZER, "memory": MEMORY, "rounds": rounds, "local_steps": local_steps,
            "samples": samples, "wall_s": wall_s, "summary": summary, "records": records}


def table(records: list[dict[str, Any]]) -> str:
    """One markdown row per round."""
    lines = ["| round | held-out loss | accuracy | train loss | bytes down | bytes up | "
             "node peaks (predicted) / budget | s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in records:
        peaks = ", ".join(f"{format_bytes(n['peak_rss_bytes'])} ({format_bytes(n['predicted_peak_bytes'])})"
                          + (f" / {format_bytes(n['budget_bytes'])}" if n["budget_bytes"] else "")
                          for n in r["nodes"])
        lines.append(f"| {r['round']} | {r['loss']:.4f} | {r['accuracy']:.3f} | {r['train_loss']:.4f} | "
                     f"{r['bytes_down']:,} | {r['bytes_up']:,} | {peaks} | {r['time_s']:.1f} |")
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The run's settings, then one row per round."""
    task = (f"the in-situ stores {', '.join(result['stores'])}" if result["stores"] else
            f"{result['model']} at {result['image']} px on {result['samples']} synthetic samples")
    return (f"`edgetrain cluster federated` on this machine: {result['nodes']} nodes, {task}, "
            f"{result['local_steps']} local steps of {result['batch']} per round, {result['optimizer']}, every node "
            f"under `--memory {result['memory']}`; {result['rounds']} rounds in {result['wall_s']:.0f} s. Held-out "
            "loss and accuracy are the averaged model's (weighted by the nodes' held-out samples); bytes are "
            "serialised weights, down to every node (training and evaluation) and up; a node's peak is its VmHWM "
            "from its planning on, beside the peak its plan predicted.\n\n" + table(result["records"]))


def headline(result: dict[str, Any]) -> str:
    """The nodes' peaks against their budget and prediction over every round, and the last round's accuracy."""
    nodes = [n for r in result["records"] for n in r["nodes"]]
    peaks = [n["peak_rss_bytes"] for n in nodes]
    return (f"{result['nodes']} nodes, {result['rounds']} rounds under {result['memory']}: peaks "
            f"{format_bytes(min(peaks))}-{format_bytes(max(peaks))} (predicted "
            f"{format_bytes(max(n['predicted_peak_bytes'] for n in nodes))}); accuracy "
            f"{result['records'][-1]['accuracy']:.2f} after round {result['records'][-1]['round']}")
