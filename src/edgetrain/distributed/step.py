"""One step of a data-parallel cluster on a node, and the periodic averaging that replaces it on slow links.

NOTE [ Cluster step ]
Every node holds the same weights and walks the same data order (the
:class:`~edgetrain.train.state.ResumableSampler` of the run's seed). Step ``s`` takes the next
``B`` indices of the order (the *global batch*, the one single-process training would take);
node ``r`` trains on its slice of ``b_r`` of them (:func:`~edgetrain.distributed.batch_shares.split_batch`,
in proportion to each node's predicted speed) through its own :class:`~edgetrain.runtime.Executor`,
whose schedule was planned for *its* device and memory budget at *its* share. Then one small
all-reduce gives the samples and the loss sum of the step, every gradient is scaled by
``b_r / B`` and summed (NOTE [ Weighted averaging ]), and every node takes the same optimizer
step. BatchNorm layers take the global batch's statistics (NOTE [ Cross-node BatchNorm ]), so a
step's gradient is single-process training's, BatchNorm included; a node whose whole slice is
unreadable still runs its step on no sample, to join their all-reduces. Rank 0 alone writes the
run directory: metrics, crash-safe state, summary. Because the
state holds the position in the global order, not in a node's slice, a run stopped at any world
size resumes at any other: the shares are split again and the next global batch is the same.

NOTE [ Periodic averaging ]
On a slow link the all-reduce of every gradient costs more than the step (4.43 s per ResNet-18
step at 100 Mbit/s). With ``average_every = K`` each node steps on its own
slice's gradient (local SGD; Stich, ICLR 2019; DiLoCo, Douillard et al. 2023, with plain
averaging as the outer step) and every ``K`` steps the weights are replaced by their average
weighted by share: K times fewer bytes, and only plain all-reduces of the parameters (no
compression hook, so no bucket-size mismatch of the kind that crashed PowerSGD on gloo).
Optimizer state (momentum) stays local, and so do BatchNorm's statistics (each node normalises
over its own slice: no collective between averagings). The loss is still summed every step. This is not
single-process training any more: the loss after a fixed number of steps is what the benchmark
compares. Rank 0 saves *its* weights; a resume restarts every node from them.
Its logged loss learns less per step than exact training for two reasons, neither a bug
(``python -m benchmarks run local_sgd``, docs/results/local_sgd.md: 4 simulated nodes, 40 ResNet-18
steps, means over 2 seeds): BatchNorm over each node's slice alone (exact steps with
``--local-batch-norm``) ends far above the single node's BatchNorm over the global batch (last 5
steps' loss 0.95 against 0.50); and between averagings a step's loss is the node's *local* model's,
which its own small batches move away from the average: the averaged weights' loss is well below
the logged one (0.97 against 1.29, averaging every 4 steps).

NOTE [ Outer step ]
Plain averaging replaces the weights by the average of the nodes' local weights. DiLoCo (Douillard
et al. 2023) keeps the weights of the last averaging, ``θ``, and treats what the nodes moved away
from them together as a gradient: every ``K`` steps the *pseudo-gradient* ``Δ = θ - Σ_r w_r θ_r``
(``θ_r`` node ``r``'s local weights, ``w_r`` its share) goes through an outer optimizer, SGD with
Nesterov momentum ``μ`` and rate ``η`` (the paper: η = 0.7, μ = 0.9)::

    m ← μ m + Δ;   θ ← θ - η (Δ + μ m)      (μ = 0: θ ← θ - η Δ)

and every node goes on from the new ``θ`` with its inner optimizer restarted (momentum 0,
:func:`restart_optimizer`). The restart is what makes the outer momentum work here: with each
node's inner momentum carried over as well, the two momenta compound: in 40 ResNet-18 steps of
4 simulated nodes (``python -m benchmarks run local_sgd``, modes ``diloco`` and ``diloco-carry``),
η = 0.7, μ = 0.9 ended above plain averaging without the restart and below it with it (last 5
steps' logged loss 2.23 and 1.13 against 1.29, means over 2 seeds). The restart also
makes every node's whole state the same right after an outer step: ``θ`` and ``m`` (each node
computes them from the same average) and a zero inner state, so a state saved there (rank 0's)
resumes every node exactly; one saved between outer steps restarts every node from rank 0's local
weights and inner state, as plain averaging does. η = 1, μ = 0 is plain averaging, and is run as
such (no outer state, no restart). ``θ`` and ``m`` are two more model-sized tensors per node, held
from the start, so its runtime baseline counts them (NOTE [ Process budget ]).

NOTE [ A node's random stream ]
Dropout draws from torch's global generator, and each node's draws depend on what it did before:
its share, its profiling, its restarts. A saved state holds rank 0's generator only, so a run
resumed with every node on it drew other masks than the uninterrupted run (found with
``transformer_small``: the losses parted at the first step after a resume). Each step therefore
starts from a generator seeded by the run's seed, the step and the node's rank
(:func:`seed_step`): the same masks whether the step runs straight on or after a resume, at the
same world size and split (a re-formed group splits the batch anew, so its masks differ anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..runtime import Executor
from .batch_norm import cross_node_statistics
from .compress import PowerSGD
from .group import all_reduce_gradients, all_reduce_sum, all_reduce_tensors
from .half_allreduce import HalfPrecisionAllReduce

__all__ = ["StepResult", "cluster_step", "seed_step", "average_parameters", "OuterStep", "restart_optimizer"]


@dataclass(frozen=True)
class StepResult:
    """One cluster step: the global batch's mean loss, its samples, and this node's wait for the all-reduces."""

    loss: float
    samples: int
    sync_s: float


def cluster_step(executor: Executor, model: nn.Module, optimizer: torch.optim.Optimizer,
                 batch: tuple[torch.Tensor, torch.Tensor] | None, *, average: bool = True,
                 compressor: PowerSGD | None = None, half: HalfPrecisionAllReduce | None = None) -> StepResult:
    """This node's part of one step (NOTE [ Cluster step ]): its slice through its executor, gradients summed
    with weight ``samples here / samples in all``, then the optimizer step every node takes alike.

    ``average=False`` is a local step of periodic averaging (NOTE [ Periodic averaging ]): the
    node steps on its own gradient and only the loss is summed. ``batch`` None: this node has no
    sample this step (all corrupt); it still joins the all-reduces (a model with cross-node
    BatchNorm needs a batch of no sample instead, to join its layers'). ``half`` (whole gradients, when
    ``compressor`` is None): sums them in half precision, bucket by bucket during the backward (NOTE
    [ Half-precision buckets overlapped with the backward ]). ``sync_s`` counts the network and the wait
    for slower nodes after this node's backward.
    """
    optimizer.zero_grad(set_to_none=True)
    count = 0 if batch is None else len(batch[1])
    loss = 0.0
    overlapped = half if average and compressor is None else None
    with overlapped.collecting(count) if overlapped is not None else contextlib.nullcontext():
        if batch is not None:
            with cross_node_statistics(model) if average else contextlib.nullcontext():
                value = executor.step(*batch)
            loss = float(value) if count else 0.0   # the mean over no sample is NaN
    computed = time.perf_counter()
    total, loss_sum = all_reduce_sum([count, loss * count])
    if overlapped is not None:  # every node started the same buckets, so every node waits for them
        overlapped.finish(1.0 / total if total else 0.0)
    elif total > 0 and average:
        all_reduce_gradients(model.parameters(), count / total, compressor)
    synced = time.perf_counter()
    if total > 0 and (count > 0 or average):
        optimizer.step()
    return StepResult(loss_sum / total if total else float("nan"), int(total), synced - computed)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's global generator for ``rank``'s step ``step`` of a run (NOTE [ A node's random stream ])."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "little"))


def average_parameters(model: nn.Module, weight: float) -> float:
    """Replace every parameter by the weighted sum over nodes (NOTE [ Periodic averaging ]); seconds spent."""
    started = time.perf_counter()
    with torch.no_grad():
        params = list(model.parameters())
        all_reduce_tensors(params, weight)
    return time.perf_counter() - started


class OuterStep:
    """DiLoCo's outer optimizer over the weights of the last averaging (NOTE [ Outer step ])."""

    def __init__(self, params: list[nn.Parameter], lr: float, momentum: float) -> None:
        self.params = params
        self.weights = [p.detach().clone() for p in params]  # θ: the global weights after the last outer step
        self.optimizer = torch.optim.SGD(self.weights, lr=lr, momentum=momentum, nesterov=momentum > 0,
                                         foreach=False)
        self._zero_momentum()

    def _zero_momentum(self) -> None:
        """Momentum 0 now, not at the first outer step (μ·0 + Δ = Δ, as torch's first step), so that the node's
        memory at planning holds it (its runtime baseline, NOTE [ Process budget ])."""
        self.optimizer.state.clear()
        if self.optimizer.defaults["momentum"] > 0:
            for weight in self.weights:
                self.optimizer.state[weight]["momentum_buffer"] = torch.zeros_like(weight)

    def step(self) -> None:
        """With the parameters holding the nodes' average: move θ by the pseudo-gradient, and the parameters to θ."""
        with torch.no_grad():
            for weight, param in zip(self.weights, self.params, strict=True):
                weight.grad = weight - param
            self.optimizer.step()
            for weight, param in zip(self.weights, self.params, strict=True):
                param.copy_(weight)
                weight.grad = None

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A saved :meth:`state_dict`; None (a state saved without an outer step): θ = the parameters, no momentum."""
        with torch.no_grad():
            for weight, saved in zip(self.weights, self.params if state is None else state["weights"], strict=True):
                weight.copy_(saved)
        if state is None:
            self._zero_momentum()
        else:
            self.optimizer.load_state_dict(state["optimizer"])


def restart_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Zero every tensor of the optimizer's state in place: a fresh SGD's or Adam's next step, exactly (a momentum
    of 0 gives μ·0 + g = g; Adam's moments and step count start at 0), in the memory already held."""
    with torch.no_grad():
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
