"""A planned step as PyTorch's own memory tracker counts it: ``MemTracker`` beside edgetrain's instruments.

``torch.distributed._tools.mem_tracker.MemTracker`` counts tensor storages at the dispatcher, as
:class:`~edgetrain.profiling.LiveBytesTracker` does, but it also hooks every module's forward and
the gradients of its inputs (``ModTracker``), and those hooks hold the autograd nodes they see.
These tests run a recomputing plan under both and hold that the step, observed that way, still
peaks at the plan's prediction (NOTE [ A caught gradient has one holder ] in ``schedule_run.py``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetrain import Checkpointed, profile
from edgetrain.models import get_model_spec
from edgetrain.planners.choose import least_step_bytes
from edgetrain.runtime.verify import check_step, memtracker_step_peak, step_peaks, three_budgets

pytest.importorskip("torch.distributed._tools.mem_tracker")


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_memtracker_counts_a_recomputing_step_at_the_plans_prediction(name: str) -> None:
    torch.manual_seed(0)
    spec = get_model_spec(name)
    model = spec.build(10)
    x, y = spec.example_input(4, 64), torch.zeros(4, dtype=torch.long)
    chain = Checkpointed(model, sample=x, target=y, recompute=100.0, measure_time=False).chain
    wrapped = Checkpointed(model, sample=x, target=y, memory=int(least_step_bytes(chain) * 1.01),
                           measure_time=False, chain=chain)
    assert wrapped.plan.stats.forward_advances > 0   # the plan recomputes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def backward() -> None:
        nn.functional.cross_entropy(wrapped(x), y).backward()

    backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(model, optimizer, x, y) as unobserved:   # momentum buffers exist from here on
        backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(model, optimizer, x, y) as observed:
        counted = memtracker_step_peak(backward, model, optimizer, x, y)
    # MemTracker's hooks do not change the step, and both trackers count the same storages, the batch included
    assert counted == observed.tracked == unobserved.tracked
    assert observed.tracked <= wrapped.predicted_tracked_peak_bytes
    assert observed.allocated <= wrapped.plan.predicted_peak_bytes


def test_check_step_reports_memtrackers_count_of_the_user_loop() -> None:
    torch.manual_seed(0)
    spec = get_model_spec("resnet18")
    model = spec.build(10)
    x, y = spec.example_input(2, 32), torch.zeros(2, dtype=torch.long)
    chain = profile(model, x, y, measure_time=False)
    least = three_budgets(chain)[0]
    check = check_step(model, x, y, least, chain, loop="user")
    assert check.memtracker_peak_bytes == check.tracked_peak_bytes
