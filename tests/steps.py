"""What one training step leaves behind, to compare a scheduled step with plain autograd."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgetrain.core.chain import Chain
from edgetrain.core.optim import TrainingOptimizer
from edgetrain.core.schedule import Backward, Forward, Keep, Op, PageInRecord, PageOutRecord, Schedule
from edgetrain.core.simulator import simulate
from edgetrain.runtime import Checkpointed, StepCheck, check_step, three_budgets
from edgetrain.runtime.verify import StepPeaks, step_peaks


@dataclass
class StepResult:
    loss: torch.Tensor
    grads: list[torch.Tensor | None]
    buffers: list[torch.Tensor]
    rng: torch.Tensor


def observe(model: nn.Module, loss: torch.Tensor) -> StepResult:
    return StepResult(loss.detach(), [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()],
                      torch.get_rng_state())


def plain_autograd_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> StepResult:
    """The reference: one plain forward, cross-entropy loss and backward, the RNG seeded first."""
    torch.manual_seed(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return observe(model, loss)


# NOTE [ How close a measured peak is to the simulated one ]
# Measured on torch 2.13, CPU (tests/test_executor.py, tests/test_paging.py, 30 schedules on four
# models): the executor's live-bytes peak is 0.9980-1.0000 of ``simulate(...).peak_bytes``. It is
# lower where an op frees a saved tensor before the simulator's stage granularity says so, and by
# up to 8 bytes where the chain counts the loss and its seed gradient before they exist
# (``Chain.loss_held_bytes``). It is never higher: the check has no slack above the prediction.
# (It would be, by 4-12 bytes, if the profiler did not measure the loss and its seed and the weights
# no stage holds.) The README claims 0.995-1.000.
PEAK_FLOOR = 0.995          # the README's lower figure; the least measured is 0.998


def peak_tracks(measured_bytes: int, simulated_bytes: int) -> bool:
    """Whether a measured peak is what the simulator said: not above it, and not far below it,
    which would mean the step or the tracker lost something."""
    return simulated_bytes * PEAK_FLOOR <= measured_bytes <= simulated_bytes


def check_tracks(check: StepCheck) -> bool:
    """``peak_tracks`` for a :class:`StepCheck`, by both instruments: the allocator's records against the plan's
    peak, the tracker against the plan's peak without kernels' scratch."""
    return (peak_tracks(check.measured_peak_bytes, check.predicted_peak_bytes)
            and peak_tracks(check.tracked_peak_bytes, check.predicted_tracked_peak_bytes))


def peaks_track(peaks: StepPeaks, chain: Chain, schedule: Schedule) -> bool:
    """The allocator's records as ``schedule``'s simulated peak on ``chain`` (``peak_tracks``), and the tracker
    between that peak on ``chain.without_scratch()`` and on ``chain`` (NOTE [ A kernel's scratch in the plan ]): an
    executor that overlaps paging I/O may fill the headroom a kernel's scratch leaves at other ops (ResNet-18's
    first output, 4.7 MB, kept while written out)."""
    planned = simulate(chain, schedule).peak_bytes
    tensors = simulate(chain.without_scratch(), schedule).peak_bytes
    return (peak_tracks(peaks.allocated, planned)
            and tensors * PEAK_FLOOR <= peaks.tracked <= planned)


def measured_schedule_step(run: Callable[[], None], model: nn.Module, optimizer: TrainingOptimizer,
                           *batch: torch.Tensor) -> StepPeaks:
    """A steady-state step: ``run`` (a scheduled forward and backward) and the optimizer once to create its state,
    then again, measured with the optimizer's step."""
    run()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(model, optimizer, *batch) as peaks:
        run()
        optimizer.step()
    return peaks


def assert_trains_at_three_budgets(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                                   chain: Chain | None = None, loop: str = "step") -> list[StepCheck]:
    """``check_step`` at :func:`three_budgets` (one profile: ``Checkpointed(chain=)`` plans each
    budget on it): each within its budget, gradients as plain autograd's, peak as predicted; the
    least budget recomputes and keep-all does not. ``loop``: ``check_step``'s (``"user"``: the
    steps are ``cross_entropy(wrapped(x), y).backward()``)."""
    from edgetrain.profiling import profile

    chain = chain if chain is not None else profile(model, x, y, measure_time=False)
    budgets = three_budgets(chain)
    assert budgets[0] < budgets[2]  # there is memory to plan
    checks = [check_step(model, x, y, budget, chain, loop=loop) for budget in budgets]
    for check in checks:
        assert check.predicted_peak_bytes <= check.budget_bytes
        assert check.worst_grad_error <= 1e-6, check
        assert check_tracks(check), check
    assert checks[0].forward_advances > 0 and checks[-1].forward_advances == 0
    return checks


def with_paged_records(chain: Chain, stages: Sequence[int]) -> Schedule:
    """Keep-all with each of ``stages``' records paged right after its forward and back right before its backward."""
    forward: list[Op] = []
    backward: list[Op] = []
    for i in range(chain.length):
        forward.append(Forward(i, Keep.ALL))
        backward.insert(0, Backward(i))
        if i in stages:
            forward.append(PageOutRecord(i))
            backward.insert(0, PageInRecord(i))
    return Schedule(tuple(forward + backward), chain.length, strategy="keep_all+record-paging")


def allocator_step_peaks(wrapped: Checkpointed, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """A steady-state SGD step of ``wrapped``: its peak above what lives between steps by the c10 allocator's
    records, and its plan's prediction of it."""
    from edgetrain.runtime.compiled import measured_step_peak_bytes

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        wrapped.step_loss(x, y)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step()
    return measured_step_peak_bytes(step), wrapped.plan.predicted_peak_bytes - wrapped.chain.between_steps_bytes


def between_least_and_keep_all_mib(model: str, batch: int, image: int) -> int:
    """A step budget a quarter of the way from the least step of ``model`` on this machine to keep-all's, in MiB.

    Measured here, not written down: the convolutions' scratch is in the plan (NOTE [ A kernel's scratch in the
    plan ]), and oneDNN's kernels differ by CPU (ResNet-18 at batch 8 and 64 px: a least step of 136.3 MiB on one
    machine, 149.4 MiB on an AMD EPYC)."""
    from edgetrain.core.schedule import keep_all
    from edgetrain.core.simulator import simulate
    from edgetrain.planners.choose import least_step_bytes
    from edgetrain.profiling import chain_for

    chain = chain_for(model, batch, image, num_classes=10, device="cpu")
    least, plain = least_step_bytes(chain), simulate(chain, keep_all(chain.length)).peak_bytes
    return math.ceil((least + (plain - least) / 4) / 2**20)
