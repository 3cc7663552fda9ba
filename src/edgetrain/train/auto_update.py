"""``train --update auto``: the scheme chosen by probes on the run's own training data (NOTE [ Contribution
analysis ] in ``train/contribution.py``), once per run: a resumed run trains the scheme its start chose."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from ..data import FileDataset, default_data_root
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..models.update import AUTO, parse_update
from ..units import format_bytes
from .budget import ProcessBudget, measure_runtime_baseline, split_process_budget
from .config import TrainConfig
from .contribution import (
    PROBE_HELD_OUT_BATCHES,
    PROBE_STEPS,
    PROBE_TRAIN_BATCHES,
    Probe,
    ProbeData,
    StepBudget,
    pick,
    probe_batch_counts,
    probe_schemes,
)
from .state import capture_rng, restore_rng

__all__ = ["resolve_update", "dataset_probe_data"]

log = logging.getLogger(__name__)

# How much the runtime may grow after auto measures it: a probe's steps add to what its profiling brought up (the
# optimizer's and the executor's first steps), and the run then profiles its scheme again; 5 and 9 MiB measured
# (MobileNetV2 at 64 px, batch 16). The pick leaves this room beside the runtime the probes left, and a refusal
# before any probe has stepped states a least with room for both.
RUNTIME_GROWTH_BYTES = 16 * 2**20


class _DatasetBatches(Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """Batches of ``dataset`` read when asked for: a probe holds one batch at a time, as training does."""

    def __init__(self, dataset: FileDataset, batches: list[list[int]]) -> None:
        self._dataset, self._batches = dataset, batches

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:   # type: ignore[override]
        inputs, labels = default_collate([self._dataset[i] for i in self._batches[k]])
        return inputs, labels


def dataset_probe_data(dataset: FileDataset, batch: int, seed: int) -> ProbeData:
    """Whole batches of readable samples in a seeded order: up to 8 for the probes' steps, up to 4 held out.

    Raises:
        EdgetrainError: fewer than two whole batches of readable samples.
    """
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    wanted = (PROBE_TRAIN_BATCHES + PROBE_HELD_OUT_BATCHES) * batch
    readable = [i for i in order[:wanted + batch] if dataset[i] is not None][:wanted]
    count = len(readable) // batch
    if count < 2:
        raise EdgetrainError(f"--update auto needs two batches of {batch} readable samples to probe on (one to "
                             f"train, one to score), and the training split has {len(readable)}")
    trained, held = probe_batch_counts(count)
    batches = [readable[k * batch:(k + 1) * batch] for k in range(trained + held)]
    return ProbeData(_DatasetBatches(dataset, batches[:trained]), _DatasetBatches(dataset, batches[trained:]))


def resolve_update(spec: Any, num_classes: int, train_set: FileDataset, config: TrainConfig,
                   chosen_at_start: str | None) -> tuple[str, str | None]:
    """The scheme to train and, for ``--update auto``, why it was chosen.

    ``auto`` probes every candidate under the step's budget: ``--step-memory``, or what ``--memory`` leaves beside
    the runtime baseline as measured once each probe has profiled its step (profiling grows the runtime: its first
    steps bring up PyTorch's caches), and picks among those whose least step fits beside the runtime the probes
    leave (before any optimizer state, so a little generous; the plan that follows refuses a step that does not
    fit). Each probe
    builds the model as the run does (seeded), so one model lives at a time; the probes leave the RNG as it was
    and are cached beside the generated datasets.
    ``chosen_at_start``: the scheme a resumed run recorded when it started, trained again without probing.
    """
    if parse_update(config.update).kind != AUTO:
        return config.update, None
    if chosen_at_start is not None:
        return chosen_at_start, f"--update auto: {chosen_at_start}, as chosen when the run started"

    def build() -> nn.Module:
        torch.manual_seed(config.seed)
        model: nn.Module = spec.build(num_classes)
        return model

    rng = capture_rng()
    data = dataset_probe_data(train_set, config.batch, config.seed)
    step_bytes, process_bytes = config.step_budget_bytes(), config.budget_bytes()
    budget: StepBudget = step_bytes
    if step_bytes is None and process_bytes is not None:
        def budget(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
            return split_process_budget(process_bytes, measure_runtime_baseline(model, *batch)).tensor_bytes

    probes = probe_schemes(build, data, budget=budget, lr=config.learning_rate(), optimizer=config.optimizer,
                           cache=default_data_root() / "update-probes.json", seed=config.seed)
    restore_rng(rng)
    process = None
    if step_bytes is None and process_bytes is not None:   # the runtime as the probes left it, and room to grow
        baseline = measure_runtime_baseline(build(), *data.train[0]) + RUNTIME_GROWTH_BYTES
        process = split_process_budget(process_bytes, baseline)
        step_bytes = process.tensor_bytes
    if step_bytes is not None and not any(p.probed and p.least_step_bytes <= step_bytes for p in probes):
        raise _no_candidate_fits(probes, step_bytes, process)
    choice = pick(probes, step_bytes, PROBE_STEPS)
    log.info("%s", choice.explain())
    return choice.scheme, choice.explain()


def _no_candidate_fits(probes: Sequence[Probe], budget_bytes: int,
                       process: ProcessBudget | None) -> InfeasibleBudgetError:
    """The refusal when every candidate's least step is above the budget, naming the least of them."""
    least = min(probes, key=lambda p: p.least_step_bytes)
    if process is not None:
        if not any(p.probed and not p.cached for p in probes):   # no probe has stepped in this process
            process = ProcessBudget(process.process_bytes, process.runtime_baseline_bytes + RUNTIME_GROWTH_BYTES)
        return process.infeasible(least.least_step_bytes)
    return InfeasibleBudgetError(
        f"step budget {format_bytes(budget_bytes)} ({budget_bytes} bytes) is below the least step of every "
        f"--update auto candidate; the least is {least.scheme}'s: {format_bytes(least.least_step_bytes)} "
        f"({least.least_step_bytes} bytes)", minimum_bytes=least.least_step_bytes, budget_bytes=budget_bytes)
