"""Local SGD on one machine: why periodic averaging learns less per step than exact training.

N nodes are simulated in one process (:func:`edgetrain.distributed.local_sgd.simulate`: no network, no namespaces,
no executor: the question is the arithmetic, not the time): N copies of the model, each on its slice of every global
batch of a time-to-target run of the cluster benchmark (same data, order, initial weights, optimizer and rate), each
with its own optimizer and BatchNorm over its own slice, as the nodes of ``cluster local --average-every K`` are.
Modes:

* **single**: one model on the whole global batch (the target's run);
* **exact**: the nodes' gradients averaged every step (BatchNorm still per node: the exact run
  with ``--local-batch-norm``);
* **average**: each node steps on its own gradient, the weights averaged every ``EVERY`` steps
  (NOTE [ Periodic averaging ]);
* **diloco**: the same with DiLoCo's outer step (:class:`edgetrain.distributed.step.OuterStep`,
  the nodes' inner optimizers restarted after it: NOTE [ Outer step ]);
* **diloco-carry**: the outer step with each node's inner momentum carried over (no restart).

Per mode and seed: the logged loss (the mean of the nodes' losses, what the cluster's metrics hold), its
mean over the last ``WINDOW`` steps and up to the time-to-target table's target step, and the loss the
*average* of the nodes' weights has on each step's batch (BatchNorm per node slice, training mode),
over the last ``WINDOW`` steps.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from edgetrain.distributed.local_sgd import LOCAL_SGD_MODES, simulate, steps_config, summarise

MODEL, IMAGE, NODES, BATCH = "resnet18_cifar", 32, 4, 32   # BATCH: the global batch, NODES slices of it
EVERY, OUTER_LR, OUTER_MOMENTUM = 4, 0.7, 0.9               # steps between averagings; DiLoCo's outer step
STEPS, SEEDS, WINDOW = 40, (0, 1), 5
QUICK_STEPS, QUICK_SEEDS, QUICK_WINDOW, QUICK_BATCH = 8, (0,), 2, 16
TARGET_AT = 0.75   # the time-to-target table's target: the single node's loss at this share of its steps

TITLE = "Local SGD: what periodic averaging learns per step"


def run(quick: bool) -> dict[str, Any]:
    """Every mode on every seed, one thread (each node's slice through its own copy, one after the other)."""
    steps, seeds, window, batch = (QUICK_STEPS, QUICK_SEEDS, QUICK_WINDOW, QUICK_BATCH) if quick \
        else (STEPS, SEEDS, WINDOW, BATCH)
    target_step = max(1, round(steps * TARGET_AT))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="local-sgd-") as scratch:
            runs = [simulate(mode, steps_config(Path(scratch), MODEL, batch, steps, IMAGE, seed), NODES, EVERY,
                             OUTER_LR, OUTER_MOMENTUM) for seed in seeds for mode in LOCAL_SGD_MODES]
    finally:
        torch.set_num_threads(threads)
    return {"model": MODEL, "image": IMAGE, "nodes": NODES, "batch": batch, "every": EVERY, "outer_lr": OUTER_LR,
            "outer_momentum": OUTER_MOMENTUM, "steps": steps, "seeds": list(seeds), "window": window,
            "target_step": target_step, "rows": [summarise(r, window, target_step) for r in runs], "runs": runs}


def render(result: dict[str, Any]) -> str:
    """The modes' means over the seeds, then every run."""
    window, target = result["window"], result["target_step"]
    head = (f"| mode | logged loss (last {window}) | loss of the averaged weights (last {window}) | "
            f"logged loss, {window} steps to step {target} |")
    means = []
    for mode in LOCAL_SGD_MODES:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if rows:
            means.append(f"| {mode} | " + " | ".join(f"{statistics.mean(r[key] for r in rows):.4f}" for key in
                                                    ("final_loss", "averaged_loss", "loss_at_target_step")) + " |")
    runs = [f"| {r['mode']} | {r['seed']} | {r['final_loss']:.4f} | {r['averaged_loss']:.4f} | "
            f"{r['loss_at_target_step']:.4f} | {r['wall_s']:.0f} |" for r in result["rows"]]
    seeds = ", ".join(map(str, result["seeds"]))
    return (f"{result['nodes']} nodes simulated in one process, {result['model']} at {result['image']} px, a global "
            f"batch of {result['batch']} ({result['batch'] // result['nodes']} a node, BatchNorm over each node's "
            f"slice), {result['steps']} steps; averaging every {result['every']} steps, DiLoCo's outer step at rate "
            f"{result['outer_lr']} and momentum {result['outer_momentum']}. The logged loss is the mean of the "
            "nodes' losses, what a cluster's metrics hold; the averaged weights' loss is that of the mean of the "
            "nodes' weights on the same batch, before the step. The target step is the time-to-target table's "
            f"(the single node at {TARGET_AT:.0%} of its steps).\n\n"
            f"Mean over the seeds ({seeds}):\n\n{head}\n|---|---|---|---|\n" + "\n".join(means) + "\n\nEvery run:\n\n"
            + head.replace("| mode |", "| mode | seed |") + " s |\n|---|---|---|---|---|---|\n" + "\n".join(runs))
