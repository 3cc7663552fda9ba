"""Check a plan on a real model: one scheduled step against plain autograd, and its measured peak.

A user who brings a model of their own (or a planner under test) asks two things of a plan: does
the step compute plain backprop's gradients, and does it stay within the peak the plan predicts?
:func:`check_step` answers both on this machine in two training steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..core.chain import Chain
from ..core.optim import TrainingOptimizer
from ..profiling import LiveBytesTracker
from ..profiling.tracker import full_allocator_window

__all__ = ["LOOPS", "StepCheck", "StepPeaks", "check_step", "memtracker_step_peak", "step_peaks", "three_budgets"]


@dataclass(frozen=True)
class StepCheck:
    """One training step of ``Checkpointed(model, memory=budget_bytes)`` against plain autograd."""

    budget_bytes: int
    predicted_peak_bytes: int
    # by the c10 allocator's records, kernels' scratch included: the state at the step's start plus the most the
    # allocator handed out above it
    measured_peak_bytes: int
    forward_advances: int
    recompute_factor: float
    worst_grad_error: float  # max |g - g_ref| / max |g_ref| over the parameters
    # the same step as LiveBytesTracker counts it, and the plan's peak without kernels' scratch (NOTE [ A kernel's
    # scratch in the plan ] in chain.py): the check of the simulator's bookkeeping of every tensor
    tracked_peak_bytes: int = 0
    predicted_tracked_peak_bytes: int = 0
    # user loop only: a third step's peak as PyTorch's own MemTracker counts it (None where it cannot run; it counts
    # what LiveBytesTracker counts, so it checks that instrument and that its module hooks leave the step unchanged)
    memtracker_peak_bytes: int | None = None

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_peak_bytes / self.predicted_peak_bytes


LOOPS = ("step", "user")


def check_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget_bytes: int, chain: Chain,
               seed: int = 0, *, twins: Chain | None = None, loop: str = "step") -> StepCheck:
    """Train a copy of ``model`` two steps under ``Checkpointed(memory=budget_bytes, chain=chain)``.

    With ``twins`` (the chain of its segmented stages, ``Checkpointed.twin_stages``) the plan is
    two-level (``blocks=True``) and the recompute factor counts the inner recomputation too.
    ``loop`` is how each step runs: ``"step"`` by :meth:`Checkpointed.step_loss`, ``"user"`` as
    a user's training loop does, ``cross_entropy(wrapped(x), y).backward()`` (NOTE [ Checkpointed
    in a user loop ]).

    The first step's gradients are compared with plain autograd's (cross-entropy, same weights,
    RNG seeded with ``seed`` before each); the second step's peak (SGD momentum buffers exist by
    then) is measured by the allocator's records against the plan's predicted peak, and by the
    tracker against the plan's peak without kernels' scratch. In the user loop a third step runs
    under PyTorch's ``MemTracker`` (:func:`memtracker_step_peak`), the independent count.

    Raises:
        AssertionError: a parameter has a gradient in one step and none in the other.
    """
    from .checkpointed import Checkpointed

    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, not {loop!r}")
    reference, mine = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(seed)
    nn.functional.cross_entropy(reference(x), y).backward()
    wrapped = Checkpointed(mine, sample=x, target=y, memory=budget_bytes, measure_time=False, chain=chain,
                           blocks=twins is not None, twins=twins)

    def step() -> None:
        if loop == "user":
            nn.functional.cross_entropy(wrapped(x), y).backward()
        else:
            wrapped.step_loss(x, y)

    torch.manual_seed(seed)
    step()
    pairs = list(zip(mine.parameters(), reference.parameters(), strict=True))
    if any((p.grad is None) != (r.grad is None) for p, r in pairs):
        raise AssertionError("the scheduled step and plain autograd give gradients to different parameters")
    errors = [((p.grad - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-30)).item()
              for p, r in pairs if p.grad is not None and r.grad is not None]
    del reference, pairs
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.01, momentum=0.9)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(mine, optimizer, x, y) as peaks:
        step()
        optimizer.step()
    memtracker_peak = None
    if loop == "user":
        optimizer.zero_grad(set_to_none=True)
        memtracker_peak = memtracker_step_peak(step, mine, optimizer, x, y)
    block = wrapped.block_plan
    factor = wrapped.plan.recompute_factor if block is None else block.recompute_factor
    return StepCheck(budget_bytes, wrapped.plan.predicted_peak_bytes, peaks.allocated,
                     wrapped.plan.stats.forward_advances, factor, max(errors, default=0.0),
                     tracked_peak_bytes=peaks.tracked,
                     predicted_tracked_peak_bytes=wrapped.predicted_tracked_peak_bytes,
                     memtracker_peak_bytes=memtracker_peak)


def memtracker_step_peak(step: Callable[[], None], model: nn.Module, optimizer: torch.optim.Optimizer,
                         *batch: torch.Tensor) -> int | None:
    """The peak of ``step()`` followed by ``optimizer.step()`` as PyTorch's ``MemTracker`` counts it, the model, its
    optimizer state and ``batch`` included; None where torch has no MemTracker or it refuses the model: it hooks the
    gradient of every parameter (so a frozen one stops it) and rejects a root module called twice in one step; and
    its module hook fails its own assertion ("Expected gradient function to be set") on torchvision's ShuffleNetV2
    under the executor, which plain autograd does not meet: the cause is not yet known."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return None
    if not all(p.requires_grad for p in model.parameters()):
        return None
    tracker = MemTracker()
    try:
        with tracker:
            tracker.track_external(model, optimizer, *batch)
            step()
            optimizer.step()
    except (NotImplementedError, AssertionError):  # refused; or its module hook's own assertion (on ShuffleNetV2)
        return None
    peak = tracker.get_tracker_snapshot("peak")
    return int(peak[batch[0].device]["Total"]) if batch[0].device in peak else 0


@dataclass
class StepPeaks:
    """A step's peak by both instruments: ``tracked`` by LiveBytesTracker, ``allocated`` the state at the step's
    start plus the most the c10 allocator handed out above it (kernels' scratch included)."""

    tracked: int = 0
    allocated: int = 0


@contextmanager
def step_peaks(model: nn.Module, optimizer: TrainingOptimizer | None, *batch: torch.Tensor) -> Iterator[StepPeaks]:
    """Measure the block (a training step) by both instruments, the training state registered with the tracker."""
    peaks = StepPeaks()
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, optimizer, *batch)
        state_bytes = tracker.current_bytes
        with full_allocator_window(batch[0].device) as allocated:
            yield peaks
    # where the records cannot see every thread's allocations, the profile measured no scratch either
    peaks.tracked = tracker.peak_bytes
    peaks.allocated = tracker.peak_bytes if allocated is None else state_bytes + allocated.peak_bytes


def three_budgets(chain: Chain) -> list[int]:
    """The least feasible step budget, the middle, and plain training's (keep-all) peak: the
    range a plan must hold over."""
    from ..core.schedule import keep_all
    from ..core.simulator import simulate
    from ..planners.choose import least_step_bytes

    least, keep_all_peak = least_step_bytes(chain), simulate(chain, keep_all(chain.length)).peak_bytes
    return [least, (least + keep_all_peak) // 2, keep_all_peak]
