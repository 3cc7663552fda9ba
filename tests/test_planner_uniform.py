"""Tests of the uniform planner: torch's segment arithmetic, closed-form peak and time, and a
differential test that counts forward executions under real ``checkpoint_sequential``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential, set_checkpoint_early_stop

from edgetrain.core.chain import Chain
from edgetrain.core.schedule import Forward, Schedule, keep_all
from edgetrain.core.simulator import simulate, validate
from edgetrain.planners.uniform import segment_bounds, uniform

GRID = [(length, segments) for length in range(1, 33) for segments in range(1, length + 1)]
TORCH_CASES = [(2, 1), (2, 2), (4, 1), (4, 2), (5, 2), (7, 3), (8, 3), (10, 4), (11, 3), (6, 6), (9, 5)]


def forwards_per_stage(schedule: Schedule) -> list[int]:
    counts = Counter(op.stage for op in schedule.ops if isinstance(op, Forward))
    return [counts[i] for i in range(schedule.length)]


# --- segment arithmetic --------------------------------------------------------------------------

@pytest.mark.parametrize(("length", "segments", "expected"), [
    (10, 1, [(0, 10)]),
    (10, 4, [(0, 2), (2, 4), (4, 6), (6, 10)]),  # 10 // 4 = 2; the last segment takes the rest
    (7, 3, [(0, 2), (2, 4), (4, 7)]),
    (5, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
    (9, 2, [(0, 4), (4, 9)]),
])
def test_segment_bounds_by_hand(length: int, segments: int, expected: list[tuple[int, int]]) -> None:
    assert segment_bounds(length, segments) == expected


@pytest.mark.parametrize(("length", "segments"), GRID)
def test_segments_tile_the_chain(length: int, segments: int) -> None:
    bounds = segment_bounds(length, segments)
    assert len(bounds) == segments
    starts, ends = [start for start, _ in bounds], [end for _, end in bounds]
    assert starts == [0, *ends[:-1]]
    assert bounds[-1][1] == length
    assert all(end - start == length // segments for start, end in bounds[:-1])


@pytest.mark.parametrize("segments", [0, -2])
def test_rejects_fewer_than_one_segment(segments: int) -> None:
    with pytest.raises(ValueError, match="segments must be >= 1"):
        uniform(Chain.uniform(4), segments)


def test_rejects_more_segments_than_stages_like_torch() -> None:
    with pytest.raises(ValueError, match="segments must be <= 3"):
        uniform(Chain.uniform(3), 4)
    model = nn.Sequential(nn.Identity(), nn.Identity(), nn.Identity())
    with pytest.raises(ValueError):  # torch fails on a zero range() step
        checkpoint_sequential(model, 4, torch.zeros(1), use_reentrant=False)


# --- the simulator's verdict ---------------------------------------------------------------------

@pytest.mark.parametrize(("length", "segments"), GRID)
def test_schedule_validates(length: int, segments: int) -> None:
    chain = Chain.uniform(length)
    schedule = uniform(chain, segments)
    validate(chain, schedule)
    assert schedule.strategy == "uniform"
    assert schedule.params == {"segments": segments}


@pytest.mark.parametrize(("length", "segments"), [(n, s) for n, s in GRID if n >= 2])
def test_peak_matches_founding_formula(length: int, segments: int) -> None:
    """Peak on ``Chain.uniform(l)`` is the founding paper's ``s - 1 + (l - floor(l/s)*(s-1))`` plus 2.

    On the unit chain every value, record and gradient is one byte and nothing else is
    resident. At the end of the forward the simulator holds the ``s - 1`` segment inputs
    ``x_q, .., x_{(s-1)q}`` (with ``q = l // s``) and the records of the ``m = l - q(s-1)``
    stages of the last segment (each record includes its output): the paper's
    ``s - 1 + m``. The simulator adds two bytes the formula leaves out: ``x_0``, the input
    batch, always held; and the gradient ``δ_{l-1}`` that ``Backward(l-1)`` (the loss)
    allocates while every record of the last segment is still alive (for ``l = 1`` the loss
    is stage 0, whose backward makes no input gradient: see the next test). Later peaks are lower:
    re-recording segment ``k <= s-2`` holds ``x_0``, ``k`` checkpoints, ``δ``, ``q`` records
    and one new gradient, ``k + q + 3 <= s + q + 1 <= s + m + 1`` since ``m >= q``.
    """
    q = length // segments
    formula = segments - 1 + (length - q * (segments - 1))
    assert simulate(Chain.uniform(length), uniform(Chain.uniform(length), segments)).peak_bytes == formula + 2


def test_peak_of_a_single_stage_chain() -> None:
    """Only ``x_0`` and the loss's record: ``Backward(0)`` creates no gradient for the input."""
    assert simulate(Chain.uniform(1), uniform(Chain.uniform(1), 1)).peak_bytes == 2


@pytest.mark.parametrize(("length", "segments"), GRID)
def test_time_is_one_extra_forward_of_checkpointed_stages(length: int, segments: int) -> None:
    chain = Chain.uniform(length)
    checkpointed = (length // segments) * (segments - 1)
    stats = simulate(chain, uniform(chain, segments))
    assert stats.time_s == 2 * length + checkpointed
    assert stats.forward_advances == checkpointed


@pytest.mark.parametrize("length", [1, 2, 5, 17])
def test_one_segment_is_plain_backprop(length: int) -> None:
    assert uniform(Chain.uniform(length), 1).ops == keep_all(length).ops


# --- differential test against torch -------------------------------------------------------------

class SquareMean(nn.Module):
    """The loss as one more module, so the Sequential's modules are exactly the chain's stages."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x ** 2).mean()


def _counted_model(length: int) -> tuple[nn.Sequential, list[int], list[int]]:
    """``length - 1`` alternating Linear/ReLU layers then the loss; counts entries and completions.

    Our chain's last stage is the loss, so the loss goes inside the Sequential as its last
    module: torch then segments exactly the ``length`` stages that the planner segments.
    """
    layers: list[nn.Module] = [nn.Linear(4, 4) if i % 2 == 0 else nn.ReLU() for i in range(length - 1)]
    model = nn.Sequential(*layers, SquareMean())
    started, finished = [0] * length, [0] * length
    for i, module in enumerate(model):
        module.register_forward_pre_hook(lambda _m, _a, i=i: started.__setitem__(i, started[i] + 1))
        module.register_forward_hook(lambda _m, _a, _o, i=i: finished.__setitem__(i, finished[i] + 1))
    return model, started, finished


def _run_torch(length: int, segments: int, *, early_stop: bool) -> tuple[list[int], list[int]]:
    torch.manual_seed(0)
    model, started, finished = _counted_model(length)
    x = torch.randn(3, 4)  # (batch, features)
    with set_checkpoint_early_stop(early_stop):
        loss = checkpoint_sequential(model, segments, x, use_reentrant=False)
        loss.backward()
    return started, finished


@pytest.mark.parametrize(("length", "segments"), TORCH_CASES)
def test_forward_executions_match_torch(length: int, segments: int) -> None:
    """Each stage runs forward as often under torch as in our schedule.

    With early stop disabled every re-run completes, so completed forwards match. With
    torch's default early stop, the recompute of a segment stops as soon as the last saved
    tensor is rebuilt, which may abort the segment's last module midway; every module's
    forward is still entered the scheduled number of times.
    """
    expected = forwards_per_stage(uniform(Chain.uniform(length), segments))
    started, finished = _run_torch(length, segments, early_stop=False)
    assert finished == expected
    assert started == expected
    started, _ = _run_torch(length, segments, early_stop=True)
    assert started == expected
