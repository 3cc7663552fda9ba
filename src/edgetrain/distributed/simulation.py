"""A data-parallel cluster computed in one process: the final loss of N nodes without N processes.

``python -m benchmarks run final_loss`` builds its tables from these runs.

NOTE [ The compressed cluster in one process ]
The held-out loss of one run is a draw from a wide distribution (float rounding alone moves it by about 3% per seed:
the results page of ``python -m benchmarks run final_loss``), so "within 0.5% of single-node training" takes
many seeds per row: days of ``cluster local`` runs on a small machine. A data-parallel step that sums its gradients
(whole or compressed) needs no processes to be computed, only the sum:

* **BatchNorm over the global batch** (NOTE [ Cross-node BatchNorm ]): the nodes' weighted gradients sum to the single
  node's gradient ``S`` of the global batch. PowerSGD is linear in what the nodes send (NOTE [ PowerSGD on plain
  all-reduces ]): ``P = Σ_r M_r Q = (Σ_r M_r) Q``, ``Q' = (Σ_r M_r)^T basis``, and the nodes' error buffers enter
  only as their sum, which follows ``Σ_r e_r = S + Σ_r e_r - P Q^T``: one error buffer on the summed gradient. So
  N-node PowerSGD is :class:`~edgetrain.distributed.compress.PowerSGD` itself at world size 1 on the global batch,
  and a run costs a single-node run.
* **BatchNorm over each node's slice**: the nodes' slices go through the same weights one after another, each through
  its own forward and backward (BatchNorm over that slice), their gradients weighted by share and summed as the
  all-reduce sums them; then the compressor on the sum. Rank 0 evaluates with its own running statistics, so the
  step keeps those of slice 0.

Everything else is the node's: the run's data, split, order, initial weights, optimizer, rate schedule
(``TrainConfig.learning_rate_at``), the executor's step (every activation kept, as an unbudgeted node plans it), the
step's random seed per rank (``seed_step``) and rank 0's held-out evaluation after every epoch; the library's
collectives run in a gloo group of one process over an in-memory store. What differs from a real cluster: no
network and no processes (so no time is measured, and no crash can happen), and the float order of the sums.
``tests/test_cluster.py`` holds the simulation's losses to a real ``cluster local`` run's.

The noise floor is ``reordered``: the single node with every global batch reversed, the same maths in another float
order (the mean loss and BatchNorm's statistics do not depend on the samples' order; their rounding does); ``rolled``
(every batch rolled by half its length) is a third such order, to tell which of two orders is the odd one.

NOTE [ A real cluster beside the simulation ]
A node that sends its gradient in float16 rounds its own slice's sum before the all-reduce adds the nodes' in
float16: that rounding is not linear, so the one-process trick above does not give it, and with BatchNorm over the
global batch a node's gradient needs every node's statistics layer by layer. Mode ``cluster:WIRE`` (``float32``,
``float16``, ``bfloat16``) therefore trains the run on a real ``cluster local`` of plain local processes (one thread
each unless ``OMP_NUM_THREADS`` says otherwise; no network shaping, no CPU quota, spares off, no restart allowed): the
system itself, about the single run's CPU time spread over the processes. Its readings are the simulation's but the
training split evaluated after the last epoch, which a cluster does not log. ``cluster:float32`` is the
whole-gradient cluster in its own float order: the real system's noise floor beside ``reordered``.

NOTE [ Two readings of the final loss ]
The goal "final loss within 0.5% of single-node training" names no data set, so :func:`summarise_final_losses` reads
it three ways: the **held-out** loss (rank 0's evaluation of the held-out split after the last epoch: what the model
does on images it never trained on); the **training** loss, the mean of the last epoch's logged step losses (one pass
over the training data as the run trains on it, BatchNorm in training mode, as the time-to-target tables read the
loss); and the **training split evaluated** after the last epoch as the held-out split is (eval mode, BatchNorm's
running statistics). The held-out and training readings can disagree: a compressed run that fits its training data
less can still generalise as well. With BatchNorm over each node's slice the logged training loss normalises over
each node's slice, against the single node's whole batch: BatchNorm over fewer samples is noisier, so that reading
is not the same quantity in both runs; the evaluated one is.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from edgetrain.bench.stats import equivalence
from edgetrain.core.optim import make_optimizer, set_learning_rate
from edgetrain.core.schedule import keep_all
from edgetrain.data import collate_skip_corrupt
from edgetrain.distributed.batch_shares import split_batch
from edgetrain.distributed.compress import PowerSGD
from edgetrain.distributed.group import all_reduce_gradients
from edgetrain.distributed.node import NodeSpec
from edgetrain.distributed.step import cluster_step, seed_step
from edgetrain.distributed.supervisor import LocalOptions, run_local
from edgetrain.errors import EdgetrainError
from edgetrain.models import get_model_spec
from edgetrain.models.stages import training_stages
from edgetrain.runtime import Executor
from edgetrain.sysutil.fileio import read_jsonl
from edgetrain.train import TrainConfig
from edgetrain.train.loop import evaluate, open_run_data
from edgetrain.train.state import ResumableSampler

SIM_MODE_NAMES = "single, reordered, rolled, exact (BatchNorm per node), powersgd:RANK[:AFTER], cluster:WIRE"
WIRES = ("float32", "float16", "bfloat16")   # cluster:WIRE, a real cluster summing whole gradients in this type
ORDERS = {"single": "as-is", "reordered": "reversed", "rolled": "rolled"}   # the single node's batch orders
# A loss run allows no restart, and finding a hung node fast is not what it measures: the supervisor's 5 s default
# takes a live node for a hung one when two such runs share 2 cores (8 nodes and a simulated run).
LOSS_RUN_HEARTBEAT_TIMEOUT_S = 120.0


def exact_steps_config(run_dir: Path, model: str, batch: int, steps: int, image: int, epochs: int = 1) -> TrainConfig:
    """A run of ``epochs`` epochs of exactly ``steps`` global batches each (the split keeps 80% for training)."""
    samples = -(-batch * steps * 5 // 4) + batch  # the split rounds the validation share up
    return TrainConfig(model=model, samples=samples, batch=batch, image=image, epochs=epochs, save_every=10**6,
                       run_dir=run_dir)


class SimMode(NamedTuple):
    """One row's step: its name, the slices a global batch goes through (the nodes with BatchNorm per node, else 1),
    PowerSGD's rank (0: whole gradients) and the exact steps before it, and the order of the batch's samples
    (``as-is``; ``reversed``; ``rolled`` by half the batch); ``wire``: not simulated, a real cluster's run summing
    whole gradients in this type (NOTE [ A real cluster beside the simulation ])."""

    name: str
    slices: int
    rank: int = 0
    after: int = 0
    order: str = "as-is"
    wire: str | None = None


def sim_mode(name: str, nodes: int, local_batch_norm: bool) -> SimMode:
    """The step a mode's name stands for (NOTE [ The compressed cluster in one process ]); an unknown name raises
    :class:`~edgetrain.errors.EdgetrainError` (``exact`` is one only with BatchNorm per node: over the global batch
    it is the single node's step)."""
    slices = nodes if local_batch_norm else 1
    if name in ORDERS:
        return SimMode(name, 1, order=ORDERS[name])
    if name == "exact" and local_batch_norm:
        return SimMode(name, slices)
    kind, *numbers = name.split(":")
    if kind == "cluster" and len(numbers) == 1 and numbers[0] in WIRES:
        return SimMode(name, nodes, wire=numbers[0])
    if kind == "powersgd" and 1 <= len(numbers) <= 2 and all(n.isdigit() for n in numbers) and int(numbers[0]) >= 1:
        return SimMode(name, slices, int(numbers[0]), int(numbers[-1]) if len(numbers) == 2 else 0)
    raise EdgetrainError(f"unknown mode {name!r}: one of {SIM_MODE_NAMES}")


@contextlib.contextmanager
def cluster_of_one() -> Iterator[None]:
    """A gloo group of this process alone over an in-memory store: the library's collectives run at world size 1
    (PowerSGD's sums of one node are its own numbers), with no network."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def one_process_run(config: TrainConfig, mode: SimMode) -> dict[str, Any]:
    """One run of ``config`` (the global run: its batch is the global batch) as ``mode``'s cluster would train it
    (NOTE [ The compressed cluster in one process ]): every step's logged loss, rank 0's held-out loss after every
    epoch, the training split evaluated after the last, wall and CPU seconds. Needs :func:`cluster_of_one` (or any
    group of one process)."""
    train_set, val_set, classes = open_run_data(config, config.run_dir)
    torch.manual_seed(config.seed)
    model = get_model_spec(config.model).build(classes)
    stages = training_stages(model)
    executor = Executor(stages, keep_all(len(stages)), None)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    compressor = PowerSGD(model.parameters(), mode.rank, seed=config.seed) if mode.rank else None
    shares = split_batch(config.batch, [1.0] * mode.slices, least=2 if mode.slices > 1 else 1)
    offsets = [sum(shares[:rank]) for rank in range(len(shares))]
    sampler = ResumableSampler(len(train_set), config.seed)
    total_steps = config.total_steps(len(train_set))
    losses: list[float] = []
    curve: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch)
        order = sampler.order().tolist()
        for start in range(0, len(order) - config.batch + 1, config.batch):
            step = len(losses)
            set_learning_rate(optimizer, config.learning_rate_at(step, total_steps))
            slices = [_collate(train_set, order[start + offset:start + offset + share])
                      for offset, share in zip(offsets, shares, strict=True)]
            step_compressor = compressor if step >= mode.after else None
            if mode.slices == 1:
                seed_step(config.seed, step, 0)
                x, y = slices[0]
                batch = ordered_batch(x, mode.order), ordered_batch(y, mode.order)
                losses.append(cluster_step(executor, model, optimizer, batch, compressor=step_compressor).loss)
            else:
                losses.append(sliced_step(executor, model, optimizer, slices, step_compressor, config.seed, step))
        _, val_loss = evaluate(model, val_set, config.batch)
        assert val_loss is not None
        curve.append(val_loss)
    _, train_eval_loss = evaluate(model, train_set, config.batch)  # after training: nothing above depends on it
    return {"losses": losses, "val_curve": curve, "val_loss": curve[-1], "train_eval_loss": train_eval_loss,
            "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu_started}


def cluster_run(config: TrainConfig, mode: SimMode, local_batch_norm: bool) -> dict[str, Any]:
    """``config`` trained by a real ``cluster local`` of ``mode.slices`` plain local processes (no emulation, spares
    off, no restart) summing whole gradients in ``mode.wire`` (NOTE [ A real cluster beside the simulation ]): the
    same readings as :func:`one_process_run`'s but the training split's evaluation, which a cluster does not log; CPU
    seconds are the nodes' and the supervisor's."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # the nodes at the simulation's one thread
    started, cpu_started = time.perf_counter(), _cpu_with_children_s()
    options = LocalOptions(spares=False, max_restarts=0, wire_dtype=mode.wire or "float32",
                           local_batch_norm=local_batch_norm, heartbeat_timeout_s=LOSS_RUN_HEARTBEAT_TIMEOUT_S)
    run_local(config, [NodeSpec()] * mode.slices, options)
    records = read_jsonl(config.run_dir / "metrics.jsonl")
    curve = [r["val_loss"] for r in records if "val_loss" in r]
    return {"losses": [r["loss"] for r in records if "loss" in r], "val_curve": curve, "val_loss": curve[-1],
            "train_eval_loss": None, "wall_s": time.perf_counter() - started,
            "cpu_s": _cpu_with_children_s() - cpu_started}


def _cpu_with_children_s() -> float:
    """CPU seconds of this process and of its children that ended and were waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def ordered_batch(batch: torch.Tensor, order: str) -> torch.Tensor:
    """The batch's samples reversed, rolled by half the batch, or as they are (``as-is``): the same maths in another
    float order."""
    if order == "reversed":
        return batch.flip(0)
    if order == "rolled":
        return batch.roll(len(batch) // 2, 0)
    return batch


def _collate(dataset: Any, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate_skip_corrupt([dataset[i] for i in indices])
    if batch is None or len(batch[1]) < len(indices):
        raise EdgetrainError("the simulation needs every sample readable (a node's unreadable slice is not simulated)")
    return batch


def sliced_step(executor: Executor, model: nn.Module, optimizer: torch.optim.Optimizer,
                slices: list[tuple[torch.Tensor, torch.Tensor]], compressor: PowerSGD | None, seed: int,
                step: int) -> float:
    """One step of nodes with BatchNorm over their own slices: each slice's forward and backward through the same
    weights (rank ``r``'s random seed), the gradients weighted by share and summed as the all-reduce does, rank 0's
    running statistics kept, then ``compressor`` (None: whole gradients) on the sum and the optimizer step; the
    global batch's mean loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(len(y) for _, y in slices)
    summed = [torch.zeros_like(p) for p in params]
    loss_sum = 0.0
    rank0_buffers: list[torch.Tensor] = []
    for rank, (x, y) in enumerate(slices):
        seed_step(seed, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss_sum += float(executor.step(x, y)) * len(y)
        for into, p in zip(summed, params, strict=True):
            if p.grad is not None:
                into.add_(p.grad.mul_(len(y) / total))
        if rank == 0:
            rank0_buffers = [b.clone() for b in model.buffers()]
    with torch.no_grad():
        for buffer, kept in zip(model.buffers(), rank0_buffers, strict=True):
            buffer.copy_(kept)
    for p, gradient in zip(params, summed, strict=True):
        p.grad = gradient
    all_reduce_gradients(params, 1.0, compressor)
    optimizer.step()
    return loss_sum / total


READINGS = {"held_out": "held-out loss after the last epoch",
            "training": "the last epoch's training loss (mean of its steps' losses, or of its last steps')",
            "training_eval": "the training split after the last epoch, evaluated as the held-out split is (BatchNorm's "
                             "running statistics)"}


def epoch_losses(run: dict[str, Any], steps_per_epoch: int, window: int = 0) -> list[dict[str, float]]:
    """A run's loss after each epoch in the readings it has (NOTE [ Two readings of the final loss ]); the last is
    its final loss. The training loss is the mean of the epoch's last ``window`` steps' (0: all of them).
    ``training_eval`` is read after the last epoch only, where the run recorded it."""
    last = window or steps_per_epoch
    curve = [{"held_out": held_out, "training": statistics.mean(run["losses"][(e + 1) * steps_per_epoch - last:
                                                                             (e + 1) * steps_per_epoch])}
             for e, held_out in enumerate(run["val_curve"])]
    if run.get("train_eval_loss") is not None:   # a real cluster's run records None (it does not log one)
        curve[-1]["training_eval"] = run["train_eval_loss"]
    return curve


def run_seconds(run: dict[str, Any]) -> float:
    """A run's CPU time (its compute, not the time it was stopped for another job), or its wall time where it
    recorded none."""
    return float(run.get("cpu_s", run["wall_s"]))


def summarise_final_losses(runs: list[dict[str, Any]], modes: list[str], margin: float, steps_per_epoch: int,
                           window: int = 0) -> list[dict[str, Any]]:
    """Per mode: its seeds, median seconds a run (:func:`run_seconds`), and per reading of the final loss
    (:data:`READINGS`) the mean over the seeds that have it and (but for the single node) the seed-by-seed relative
    difference from the single node's, with its :func:`~edgetrain.bench.stats.equivalence` after the last epoch and
    its mean and standard error after every epoch read."""
    by_mode: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in modes}
    for run in runs:
        if run["mode"] in by_mode:
            by_mode[run["mode"]][run["seed"]] = run
    curves = {m: {s: epoch_losses(r, steps_per_epoch, window) for s, r in seeds.items()}
              for m, seeds in by_mode.items()}
    single = curves.get("single", {})
    rows = []
    for name, seeds in curves.items():
        row: dict[str, Any] = {"mode": name, "seeds": sorted(seeds), "run_s": statistics.median(
            run_seconds(r) for r in by_mode[name].values()) if seeds else None}
        for reading in READINGS:
            have = [s for s in sorted(seeds) if reading in seeds[s][-1]]
            row[reading] = {"seeds": len(have),
                            "loss": statistics.mean(seeds[s][-1][reading] for s in have) if have else None}
            paired = [s for s in have if s in single and reading in single[s][-1]]
            if name != "single" and paired:
                by_epoch = [[seeds[s][e][reading] / single[s][e][reading] - 1 for s in paired] if all(
                    reading in seeds[s][e] and reading in single[s][e] for s in paired) else None
                    for e in range(len(single[paired[0]]))]
                final = by_epoch[-1]
                assert final is not None
                row[reading]["vs_single"] = {**equivalence(final, margin), "differences": final, "paired": paired}
                row[reading]["by_epoch"] = [None if d is None else {
                    "mean": statistics.mean(d), "se": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None}
                    for d in by_epoch]
        rows.append(row)
    return rows


def same_settings(run: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether a recorded run (``settings``, ``mode``) counts for a table of ``settings``: the same settings, or any
    BatchNorm setting for the single node in any batch order (one slice: :func:`sim_mode`)."""
    if run["mode"] in ORDERS:
        return {**run["settings"], "local_batch_norm": None} == {**settings, "local_batch_norm": None}
    return bool(run["settings"] == settings)


def read_runs(paths: list[Path], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs in ``paths`` (JSON lines; a missing file has none) that count for ``settings``
    (:func:`same_settings`), each mode and seed once: the first read (a file given twice, or a run copied into two
    files, counts once)."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        for run in read_jsonl(path):
            if same_settings(run, settings):
                runs.setdefault((run["mode"], run["seed"]), run)
    return list(runs.values())
