"""Local SGD on one machine: why periodic averaging learns less per step than exact training.

N nodes are simulated in one process (no network, no namespaces, no executor: the question is the
arithmetic, not the time): N copies of the model, each on its slice of every global batch of the
time-to-target runs of ``benchmarks/cluster.py`` (same data, order, initial weights, optimizer and
rate), each with its own optimizer and BatchNorm over its own slice, as the nodes of ``cluster
local --average-every K`` are. Modes:

* **single**: one model on the whole global batch (the target's run);
* **exact**: the nodes' gradients averaged every step (BatchNorm still per node: the exact run
  with ``--local-batch-norm``);
* **average**: each node steps on its own gradient, the weights averaged every ``--every`` steps
  (NOTE [ Periodic averaging ]);
* **diloco**: the same with DiLoCo's outer step (:class:`edgetrain.distributed.step.OuterStep`,
  the nodes' inner optimizers restarted after it: NOTE [ Outer step ]);
* **diloco-carry**: the outer step with each node's inner momentum carried over (no restart).

Per mode and seed: the logged loss (the mean of the nodes' losses, what the cluster's metrics hold), its
mean over the last ``--window`` steps and at the time-to-target table's target step, and the loss the
*average* of the nodes' weights has on each step's batch (BatchNorm per node slice, training mode),
over the last ``--window`` steps. Writes JSON (``--out``) and markdown (``--md``) and prints the markdown.

Usage: ``python benchmarks/local_sgd.py [--modes single,exact,average,diloco,diloco-carry] [--seeds 0,1]
[--steps 40] [--nodes 4] [--batch 32] [--every 4] [--outer-lr 0.7] [--outer-momentum 0.9]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgetrain.bench.stats import rerun_command
from edgetrain.core.optim import make_optimizer
from edgetrain.data import collate_skip_corrupt
from edgetrain.distributed.step import OuterStep, restart_optimizer
from edgetrain.models import get_model_spec
from edgetrain.train import TrainConfig
from edgetrain.train.loop import open_run_data
from edgetrain.train.state import ResumableSampler

MODES = ("single", "exact", "average", "diloco", "diloco-carry")


def _config(args: argparse.Namespace, seed: int, root: Path) -> TrainConfig:
    """The time-to-target run's configuration: ``benchmarks/cluster.py``'s (one epoch of ``steps``), this seed."""
    from _cluster.common import run_config as cluster_config  # benchmarks/ is the script's own folder
    return replace(cluster_config(root, args.model, args.batch, args.steps, args.image), seed=seed)


def _mean_into(target: list[torch.Tensor], groups: list[list[torch.Tensor]]) -> None:
    """Each tensor of ``target`` becomes the mean of its counterparts in ``groups`` (equal shares)."""
    with torch.no_grad():
        for index, tensor in enumerate(target):
            tensor.copy_(torch.stack([group[index] for group in groups]).mean(0))


def _copy_first(groups: list[list[torch.Tensor]]) -> None:
    """Every group's tensors become the first group's."""
    with torch.no_grad():
        for other in groups[1:]:
            for tensor, first in zip(other, groups[0], strict=True):
                tensor.copy_(first)


def _sliced_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, nodes: int) -> float:
    """The mean loss of ``model`` over the batch's node slices (BatchNorm per slice), without training it."""
    share = len(y) // nodes
    loss = nn.functional.cross_entropy
    with torch.no_grad():
        return statistics.mean(float(loss(model(x[r * share:(r + 1) * share]), y[r * share:(r + 1) * share]))
                               for r in range(nodes))


def run_mode(mode: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One mode's run with one seed: every step's logged loss and the loss of the nodes' averaged weights."""
    with tempfile.TemporaryDirectory(prefix="local-sgd-") as scratch:
        config = _config(args, seed, Path(scratch))
        train_set, _, classes = open_run_data(config, Path(scratch))
        torch.manual_seed(seed)
        base = get_model_spec(args.model).build(classes)
        nodes = 1 if mode == "single" else args.nodes
        models = [copy.deepcopy(base) for _ in range(nodes)]
        optimizers = [make_optimizer(config.optimizer, m.parameters(), config.learning_rate()) for m in models]
        outer = OuterStep(list(models[0].parameters()), args.outer_lr, args.outer_momentum) \
            if mode.startswith("diloco") else None
        order = ResumableSampler(len(train_set), seed).order().tolist()
        probe = copy.deepcopy(base).train()
        losses, averaged = [], []
        started = time.perf_counter()
        for step in range(args.steps):
            batch = collate_skip_corrupt([train_set[i] for i in order[step * args.batch:(step + 1) * args.batch]])
            assert batch is not None
            x, y = batch
            _mean_into(list(probe.parameters()), [list(m.parameters()) for m in models])
            averaged.append(_sliced_loss(probe, x, y, nodes))
            losses.append(_train_step(models, optimizers, x, y, exact=mode == "exact"))
            if mode not in ("single", "exact") and (step + 1) % args.every == 0:
                _average(models, outer, restart=mode == "diloco", optimizers=optimizers)
        return {"mode": mode, "seed": seed, "losses": losses, "averaged_losses": averaged,
                "wall_s": time.perf_counter() - started}


def _train_step(models: list[nn.Module], optimizers: list[torch.optim.Optimizer], x: torch.Tensor, y: torch.Tensor,
                *, exact: bool) -> float:
    """Each node's slice through its model and optimizer (gradients averaged first when ``exact``); the mean loss."""
    share = len(y) // len(models)
    losses = []
    for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[rank * share:(rank + 1) * share]),
                                           y[rank * share:(rank + 1) * share])
        loss.backward()
        losses.append(float(loss.detach()))
    if exact:
        grads = [[p.grad for p in m.parameters() if p.grad is not None] for m in models]
        _mean_into(grads[0], grads)
        _copy_first(grads)
    for optimizer in optimizers:
        optimizer.step()
    return statistics.mean(losses)


def _average(models: list[nn.Module], outer: OuterStep | None, *, restart: bool,
             optimizers: list[torch.optim.Optimizer]) -> None:
    """Plain averaging, or the outer step on the average; every node then holds the result."""
    params = [list(m.parameters()) for m in models]
    _mean_into(params[0], params)
    if outer is not None:  # node 0's parameters hold the average: θ moves, and they take it
        outer.step()
    _copy_first(params)
    if restart:
        for optimizer in optimizers:
            restart_optimizer(optimizer)


def summarise(run: dict[str, Any], window: int, target_step: int) -> dict[str, Any]:
    """A run's last-``window`` means of the logged and the averaged weights' losses, and the logged loss's
    ``window``-step mean at ``target_step``."""
    losses = run["losses"]
    at = losses[max(0, target_step - window):target_step]
    return {"mode": run["mode"], "seed": run["seed"], "final_loss": statistics.mean(losses[-window:]),
            "averaged_loss": statistics.mean(run["averaged_losses"][-window:]),
            "loss_at_target_step": statistics.mean(at), "wall_s": run["wall_s"]}


def markdown(result: dict[str, Any]) -> str:
    window, target = result["window"], result["target_step"]
    out = [f"Load average {result['load_before']} before, {result['load_after']} after; rerun with "
           f"`{result['command']}`.", "",
           f"| mode | seed | logged loss (last {window}) | loss of the averaged weights (last {window}) | "
           f"logged loss, {window} steps to step {target} | s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {r['mode']} | {r['seed']} | {r['final_loss']:.4f} | {r['averaged_loss']:.4f} | "
            f"{r['loss_at_target_step']:.4f} | {r['wall_s']:.0f} |" for r in result["rows"]]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1])
    parser.add_argument("--model", default="resnet18_cifar")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="the global batch (nodes x each node's slice)")
    parser.add_argument("--every", type=int, default=4, help="steps between averagings")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--target-at", type=float, default=0.75, help="as benchmarks/cluster.py's --ttt-target-at")
    parser.add_argument("--out", type=Path, default=Path("out/bench_local_sgd.json"))
    parser.add_argument("--md", type=Path, default=Path("out/bench_local_sgd.md"))
    args = parser.parse_args()
    unknown = set(args.modes) - set(MODES)
    if unknown or args.batch % args.nodes:
        raise SystemExit(f"--modes: any of {', '.join(MODES)}; --batch a multiple of --nodes")
    torch.set_num_threads(1)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    target_step = max(1, round(args.steps * args.target_at))
    runs = [run_mode(mode, args, seed) for seed in args.seeds for mode in args.modes]
    result = {"command": rerun_command("benchmarks/local_sgd.py", vars(args), leave_out=("out", "md")),
              "load_before": load, "load_after": " ".join(f"{v:.2f}" for v in os.getloadavg()),
              "window": args.window, "target_step": target_step,
              "rows": [summarise(r, args.window, target_step) for r in runs], "runs": runs}
    from _cluster.common import write_result  # benchmarks/ is the script's own folder
    write_result(result, args.out, args.md, markdown)


if __name__ == "__main__":
    main()
