"""The ``auto`` update scheme: the candidate that learns most on the user's data among those whose step fits.

NOTE [ Contribution analysis ]
Which parameters are worth training depends on the data: a head on features that already separate the classes
learns as much as the whole model, while a view the model never saw needs its early stages to move. So the
choice is measured, as the Tiny Training Engine's contribution analysis measures it (Lin et al., "On-Device
Training Under 256KB Memory", NeurIPS 2022), with a probe per candidate scheme:

* each candidate (``all``, ``bias``, ``last:K``) trains a fresh copy of the model for a few optimizer steps on a
  seeded sample of the user's training batches, at the training learning rate decayed to 0 over the probe (a
  probe at the full rate throughout measures the first steps' overshoot, not what the scheme learns);
* its *expected gain* is the rise of the accuracy on other batches of the training data, held out of the probe,
  from before the probe to after it (the loss's drop breaks ties), each batch normalised by its own statistics;
  every candidate starts from the same weights and is scored on the same batches, so the gains compare;
* its step's memory is the least tensor peak any schedule reaches on the chain profiled with that scheme's flags
  (:func:`edgetrain.planners.choose.least_step_bytes`), so a candidate *fits* a budget when the planner can make its
  step fit; a probe runs its steps by a schedule planned within the budget, so probing holds the memory that
  training will, and a candidate that does not fit is not probed;
* ``auto`` is the fitting candidate with the largest gain; a tie goes to the smaller step.

A probe is a handful of steps per candidate, a cost paid once: the probes are cached in a JSON file under a key
of the model's weights, the probe batches, the scheme and the probe settings, and the time they took is
reported with the choice. The gain is a short-horizon proxy for the accuracy of a whole run: the transfer
benchmark (``benchmarks/transfer_accuracy.py``) measures how often the two disagree.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import EdgetrainError
from ..models.update import AUTO, UpdateSchemeError, apply_update
from ..sysutil.fileio import write_json
from ..units import format_bytes

if TYPE_CHECKING:
    from ..core.chain import Chain

__all__ = ["AUTO", "PROBE_STEPS", "PROBE_TRAIN_BATCHES", "PROBE_HELD_OUT_BATCHES", "StepBudget", "Probe", "ProbeData",
           "AutoChoice", "default_candidates", "probe_batch_counts", "probe_data", "probe_schemes", "choose_update",
           "pick"]

PROBE_STEPS = 16
PROBE_TRAIN_BATCHES = 8
PROBE_HELD_OUT_BATCHES = 4
_CACHE_VERSION = 2

Batch = tuple[torch.Tensor, torch.Tensor]
# A step's tensor budget: bytes, or what is left of a process budget beside the runtime as measured once a probe
# has profiled its step (a function of the probe's model and batch, which it does not count as runtime); None: no
# budget.
StepBudget = int | Callable[[nn.Module, Batch], int] | None


@dataclass(frozen=True)
class ProbeData:
    """The batches a probe trains on, and those it scores on (held out of its steps); all of the step's shape."""

    train: Sequence[Batch]
    held_out: Sequence[Batch]


def probe_batch_counts(count: int) -> tuple[int, int]:
    """Of ``count >= 2`` whole batches, how many a probe trains on and how many it scores on: a third held out (at
    least one, at most 4), up to 8 of the rest to train."""
    held = min(PROBE_HELD_OUT_BATCHES, max(count // 3, 1))
    return min(PROBE_TRAIN_BATCHES, count - held), held


def probe_data(x: torch.Tensor, y: torch.Tensor, batch: int, *, seed: int = 0) -> ProbeData:
    """Whole batches of a seeded shuffle of ``(x, y)``: the first for the probe's steps, the next held out.

    Raises:
        EdgetrainError: fewer than two whole batches of samples.
    """
    count = len(x) // batch
    if count < 2:
        raise EdgetrainError(f"--update auto needs two batches of {batch} to probe on (one to train, one to score), "
                             f"got {len(x)} samples")
    trained, held = probe_batch_counts(count)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    batches = [(x[order[k * batch:(k + 1) * batch]], y[order[k * batch:(k + 1) * batch]])
               for k in range(trained + held)]
    return ProbeData(batches[:trained], batches[trained:])


@dataclass(frozen=True)
class Probe:
    """One candidate's probe: its least step, its expected gain, and what the probe cost.

    ``accuracy_after`` and ``loss_after`` are None for a candidate whose least step is above the budget: it was
    not probed.
    """

    scheme: str
    least_step_bytes: int
    trained_bytes: int     # the parameters it trains
    accuracy_before: float
    accuracy_after: float | None
    loss_before: float
    loss_after: float | None
    probe_seconds: float   # profiling and probe steps, measured when the probe ran (also for a cached one)
    cached: bool

    @property
    def probed(self) -> bool:
        return self.accuracy_after is not None

    @property
    def gain(self) -> float:
        """The held-out accuracy's rise over the probe (a fraction; negative for a probe that lost accuracy)."""
        if self.accuracy_after is None:
            raise ValueError(f"{self.scheme} was not probed: its least step is above the budget")
        return self.accuracy_after - self.accuracy_before

    @property
    def loss_drop(self) -> float:
        if self.loss_after is None:
            raise ValueError(f"{self.scheme} was not probed: its least step is above the budget")
        return self.loss_before - self.loss_after


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` chose under ``budget_bytes`` (``None``: no budget), and every probe it weighed."""

    scheme: str
    budget_bytes: int | None
    probes: tuple[Probe, ...]
    steps: int

    @property
    def chosen(self) -> Probe:
        return next(p for p in self.probes if p.scheme == self.scheme)

    @property
    def probe_seconds(self) -> float:
        return sum(p.probe_seconds for p in self.probes if not p.cached)

    def explain(self) -> str:
        """One line: the choice, its expected gain, the bytes it saves against ``all``, and the probes' cost."""
        chosen = self.chosen
        full = next((p for p in self.probes if p.scheme == "all"), None)
        saved = "" if full is None else f", {format_bytes(max(full.least_step_bytes - chosen.least_step_bytes, 0))} " \
                                        f"below all's {format_bytes(full.least_step_bytes)}"
        fits = [p for p in self.probes if p.probed and _fits(p, self.budget_bytes)]
        budget = "no budget" if self.budget_bytes is None else f"the budget {format_bytes(self.budget_bytes)}"
        cached = sum(p.cached for p in self.probes)
        cost = f"probes {self.probe_seconds:.1f} s" + (f", {cached} cached" if cached else "")
        return (f"--update auto: {chosen.scheme} (expected gain {100 * chosen.gain:+.1f} points of held-out accuracy "
                f"after {self.steps} probe steps; least step {format_bytes(chosen.least_step_bytes)}{saved}); "
                f"{len(fits)} of {len(self.probes)} candidates fit {budget}; {cost}")


def default_candidates(model: nn.Module, stages: list[nn.Module] | None = None) -> list[str]:
    """``all``, ``bias`` and ``last:K`` for K = 1, 2, 4, ... below the model's stage count."""
    from ..models import stages_of

    count = len(stages if stages is not None else stages_of(model))
    lasts, k = [], 1
    while k < count:
        lasts.append(f"last:{k}")
        k *= 2
    return ["all", "bias", *lasts]


def _key(model: nn.Module, data: ProbeData, scheme: str, steps: int, lr: float, optimizer: str, seed: int) -> str:
    digest = hashlib.sha256(f"{_CACHE_VERSION}|{scheme}|{steps}|{lr!r}|{optimizer}|{seed}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for part in (data.train, data.held_out):
        digest.update(str(len(part)).encode())
        for x, y in part:
            digest.update(x.detach().cpu().contiguous().numpy().tobytes())
            digest.update(y.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _read_cache(path: Path | None) -> dict[str, dict[str, float | int | str]]:
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}   # a damaged cache is only lost work: probe again and write it anew
    return data if isinstance(data, dict) else {}


@torch.no_grad()
def _score(model: nn.Module, batches: Sequence[Batch]) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on ``batches``, normalised by each batch's own statistics, dropout off.

    A probe's few steps move the weights further than the norms' running statistics follow (momentum 0.1), so
    eval mode would score a mismatch rather than what the scheme learnt; ``model`` is a probe's copy, whose
    running statistics are dropped with it.
    """
    model.train()
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.eval()
    right, loss, count = 0, 0.0, 0
    for x, y in batches:
        logits = model(x)
        right += int((logits.argmax(1) == y).sum())
        loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        count += len(y)
    return right / count, loss / count


def _fits(probe: Probe, budget_bytes: int | None) -> bool:
    return budget_bytes is None or probe.least_step_bytes <= budget_bytes


def _step_fn(model: nn.Module, chain: Chain,
             budget_bytes: int | None) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """Forward and backward of one batch: plain autograd, or by a schedule planned within ``budget_bytes`` (without
    numba's kernel, whose ~100 MiB would stay in the process that trains next, as training plans)."""
    if budget_bytes is None:
        return lambda x, y: nn.functional.cross_entropy(model(x), y).backward()
    from ..models.stages import training_stages
    from ..planners import plan
    from ..runtime import Executor

    return Executor(training_stages(model), plan(chain, memory=budget_bytes, jit=False).schedule, chain).step


def _probe_one(build: Callable[[], nn.Module], scheme: str, data: ProbeData, budget: StepBudget, steps: int,
               lr: float, optimizer: str, seed: int, before: tuple[float, float]) -> Probe:
    from ..core.optim import make_optimizer
    from ..planners.choose import least_step_bytes
    from ..profiling import profile

    start = time.perf_counter()
    trial = build()
    try:
        apply_update(trial, scheme)
    except UpdateSchemeError as exc:
        raise UpdateSchemeError(f"--update auto: candidate {scheme!r}: {exc}") from None
    trial.train()
    sample = data.train[0]
    chain = profile(trial, *sample, optimizer=optimizer, measure_time=False)
    least = least_step_bytes(chain)
    trained = sum(p.numel() * p.element_size() for p in trial.parameters() if p.requires_grad)
    budget_bytes = budget(trial, sample) if callable(budget) else budget
    if budget_bytes is not None and least > budget_bytes:
        return Probe(scheme, least, trained, *before[:1], None, before[1], None, time.perf_counter() - start, False)
    step = _step_fn(trial, chain, budget_bytes)
    torch.manual_seed(seed)
    opt = make_optimizer(optimizer, trial.parameters(), lr)
    for k in range(steps):
        for group in opt.param_groups:   # cosine from lr to 0 over the probe
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * k / steps))
        x, y = data.train[k % len(data.train)]
        opt.zero_grad(set_to_none=True)
        step(x, y)
        opt.step()
    accuracy, loss = _score(trial, data.held_out)
    return Probe(scheme, least, trained, before[0], accuracy, before[1], loss, time.perf_counter() - start, False)


def probe_schemes(build: Callable[[], nn.Module], data: ProbeData, candidates: Sequence[str] | None = None, *,
                  budget: StepBudget = None, steps: int = PROBE_STEPS, lr: float = 0.01, optimizer: str = "sgd",
                  cache: Path | None = None, seed: int = 0) -> list[Probe]:
    """Probe each candidate scheme on a fresh model from ``build`` (NOTE [ Contribution analysis ]).

    ``build`` returns the model to fine-tune, the same weights at every call (a seeded constructor, or a copy of
    a trained model): one model lives at a time, so probing holds no more than training. ``budget``: the step's
    tensor budget (:data:`StepBudget`); candidates whose least step is above it are not probed. ``cache``: a JSON
    file of earlier probes, read and updated.

    Raises:
        EdgetrainError: no batches to train or score on, ``steps < 1``, or a candidate that is no scheme of this
            model.
    """
    if not data.train or not data.held_out or steps < 1:
        raise EdgetrainError("--update auto needs a batch to train on, one to score on and at least one probe step")
    model = build()
    names = list(candidates) if candidates is not None else default_candidates(model)
    key_of = {scheme: _key(model, data, scheme, steps, lr, optimizer, seed) for scheme in names}
    before = _score(model, data.held_out)
    del model
    stored = _read_cache(cache)
    probes = []
    for scheme in names:
        record = stored.get(key_of[scheme])
        if record is not None:
            probes.append(Probe(**{**record, "cached": True}))   # type: ignore[arg-type]
            continue
        probe = _probe_one(build, scheme, data, budget, steps, lr, optimizer, seed, before)
        gc.collect()   # the probe's model, gradients and optimizer state sit in reference cycles of its schedule
        probes.append(probe)
        if probe.probed:
            stored[key_of[scheme]] = {k: v for k, v in asdict(probe).items() if k != "cached"}
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, stored)
    return probes


def choose_update(build: Callable[[], nn.Module], data: ProbeData, budget_bytes: int | None,
                  candidates: Sequence[str] | None = None, *, steps: int = PROBE_STEPS, lr: float = 0.01,
                  optimizer: str = "sgd", cache: Path | None = None, seed: int = 0) -> AutoChoice:
    """The scheme ``auto`` trains under ``budget_bytes`` (the step's tensors), from :func:`probe_schemes`.

    Raises:
        UpdateSchemeError: no candidate's least step fits ``budget_bytes`` (naming the least of them).
    """
    probes = probe_schemes(build, data, candidates, budget=budget_bytes, steps=steps, lr=lr,
                           optimizer=optimizer, cache=cache, seed=seed)
    return pick(probes, budget_bytes, steps)


def pick(probes: Sequence[Probe], budget_bytes: int | None, steps: int) -> AutoChoice:
    """The largest gain among the probed ``probes`` whose least step fits ``budget_bytes``: held-out accuracy, then
    the loss's drop, then the smaller step."""
    fits = [p for p in probes if p.probed and _fits(p, budget_bytes)]
    if not fits:
        least = min(probes, key=lambda p: p.least_step_bytes)
        raise UpdateSchemeError(f"--update auto: no candidate fits {format_bytes(budget_bytes or 0)}; the least is "
                                f"{least.scheme} at {format_bytes(least.least_step_bytes)}")
    best = max(fits, key=lambda p: (p.gain, p.loss_drop, -p.least_step_bytes))
    return AutoChoice(best.scheme, budget_bytes, tuple(probes), steps)
