"""Local SGD simulated in one process: N copies of a model, each on its slice of every global batch.

No network, no namespaces, no executor: the question is the arithmetic, not the time. Each copy
has its own optimizer and its own BatchNorm over its own slice, as the nodes of ``cluster local
--average-every K`` have (NOTE [ Periodic averaging ] in ``step.py``). :func:`simulate` runs one
mode, step by step on the run's data in the run's order:

* ``single``: one model on the whole global batch;
* ``exact``: the nodes' gradients averaged every step (BatchNorm still per node: the exact run
  with ``--local-batch-norm``);
* ``average``: each node steps on its own gradient, the weights averaged every ``every`` steps;
* ``diloco``: the same with DiLoCo's outer step (:class:`~edgetrain.distributed.step.OuterStep`),
  the nodes' inner optimizers restarted after it (NOTE [ Outer step ]);
* ``diloco-carry``: the outer step with each node's inner momentum carried over (no restart).

Besides each step's logged loss (the mean of the nodes' losses, what a cluster's metrics hold)
it records the loss that the *average* of the nodes' weights has on the step's batch, before the
step: between averagings the logged loss is each node's local model's.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.optim import make_optimizer
from ..data import collate_skip_corrupt
from ..errors import EdgetrainError
from ..models import get_model_spec
from ..train import TrainConfig
from ..train.loop import open_run_data
from ..train.state import ResumableSampler
from .step import OuterStep, restart_optimizer

__all__ = ["LOCAL_SGD_MODES", "steps_config", "mean_into", "copy_first", "sliced_loss", "node_step",
           "average_nodes", "simulate", "summarise"]

LOCAL_SGD_MODES = ("single", "exact", "average", "diloco", "diloco-carry")


def steps_config(run_dir: Path, model: str, batch: int, steps: int, image: int, seed: int = 0) -> TrainConfig:
    """One epoch of exactly ``steps`` global batches of ``batch`` (the split keeps 80% for training)."""
    samples = -(-batch * steps * 5 // 4) + batch  # the split rounds the validation share up
    return TrainConfig(model=model, samples=samples, batch=batch, image=image, epochs=1, save_every=10**6,
                       run_dir=run_dir, seed=seed)


def mean_into(target: Sequence[torch.Tensor], groups: Sequence[Sequence[torch.Tensor]]) -> None:
    """Each tensor of ``target`` becomes the mean of its counterparts in ``groups`` (equal shares)."""
    with torch.no_grad():
        for index, tensor in enumerate(target):
            tensor.copy_(torch.stack([group[index] for group in groups]).mean(0))


def copy_first(groups: Sequence[Sequence[torch.Tensor]]) -> None:
    """Every group's tensors become the first group's."""
    with torch.no_grad():
        for other in groups[1:]:
            for tensor, first in zip(other, groups[0], strict=True):
                tensor.copy_(first)


def sliced_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, nodes: int) -> float:
    """The mean cross-entropy of ``model`` over the batch's ``nodes`` equal slices (BatchNorm per slice), without
    training it."""
    share = len(y) // nodes
    loss = nn.functional.cross_entropy
    with torch.no_grad():
        return statistics.mean(float(loss(model(x[r * share:(r + 1) * share]), y[r * share:(r + 1) * share]))
                               for r in range(nodes))


def node_step(models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer], x: torch.Tensor,
              y: torch.Tensor, *, exact: bool) -> float:
    """Each node's slice through its model and optimizer (gradients averaged first when ``exact``); the nodes' mean
    loss."""
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
        mean_into(grads[0], grads)
        copy_first(grads)
    for optimizer in optimizers:
        optimizer.step()
    return statistics.mean(losses)


def average_nodes(models: Sequence[nn.Module], outer: OuterStep | None = None, *, restart: bool = False,
                  optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
    """Plain averaging of the models' parameters, or ``outer``'s step on the average; every model then holds the
    result. ``outer`` must be built on the first model's parameters; with ``restart`` the ``optimizers`` restart."""
    params = [list(m.parameters()) for m in models]
    mean_into(params[0], params)
    if outer is not None:  # node 0's parameters hold the average: θ moves, and they take it
        outer.step()
    copy_first(params)
    if restart:
        for optimizer in optimizers:
            restart_optimizer(optimizer)


def simulate(mode: str, config: TrainConfig, nodes: int, every: int, outer_lr: float,
             outer_momentum: float) -> dict[str, Any]:
    """One mode's run of ``config`` (its model, data, order, seed, optimizer and rate) on ``nodes`` simulated nodes
    (one for ``single``): every step's logged loss and the loss of the nodes' averaged weights, and its wall time.

    Raises:
        EdgetrainError: an unknown mode, or a batch that the nodes do not share equally.
    """
    if mode not in LOCAL_SGD_MODES:
        raise EdgetrainError(f"unknown mode {mode!r}; valid modes: {', '.join(LOCAL_SGD_MODES)}")
    nodes = 1 if mode == "single" else nodes
    if config.batch % nodes:
        raise EdgetrainError(f"batch {config.batch} is not a multiple of {nodes} nodes")
    with tempfile.TemporaryDirectory(prefix="local-sgd-") as scratch:
        train_set, _, classes = open_run_data(config, Path(scratch))
        torch.manual_seed(config.seed)
        base = get_model_spec(config.model).build(classes)
        models = [copy.deepcopy(base) for _ in range(nodes)]
        optimizers = [make_optimizer(config.optimizer, m.parameters(), config.learning_rate()) for m in models]
        outer = OuterStep(list(models[0].parameters()), outer_lr, outer_momentum) \
            if mode.startswith("diloco") else None
        order = ResumableSampler(len(train_set), config.seed).order().tolist()
        probe = copy.deepcopy(base).train()
        steps = len(train_set) // config.batch
        losses, averaged = [], []
        started = time.perf_counter()
        for step in range(steps):
            batch = collate_skip_corrupt([train_set[i] for i in order[step * config.batch:(step + 1) * config.batch]])
            if batch is None:
                raise EdgetrainError(f"step {step}: every sample of the batch is unreadable")
            x, y = batch
            mean_into(list(probe.parameters()), [list(m.parameters()) for m in models])
            averaged.append(sliced_loss(probe, x, y, nodes))
            losses.append(node_step(models, optimizers, x, y, exact=mode == "exact"))
            if mode not in ("single", "exact") and (step + 1) % every == 0:
                average_nodes(models, outer, restart=mode == "diloco", optimizers=optimizers)
        return {"mode": mode, "seed": config.seed, "losses": losses, "averaged_losses": averaged,
                "wall_s": time.perf_counter() - started}


def summarise(run: dict[str, Any], window: int, target_step: int) -> dict[str, Any]:
    """A run's last-``window`` means of the logged and the averaged weights' losses, and the logged loss's
    ``window``-step mean up to ``target_step``."""
    losses = run["losses"]
    at = losses[max(0, target_step - window):target_step]
    return {"mode": run["mode"], "seed": run["seed"], "final_loss": statistics.mean(losses[-window:]),
            "averaged_loss": statistics.mean(run["averaged_losses"][-window:]),
            "loss_at_target_step": statistics.mean(at), "wall_s": run["wall_s"]}
