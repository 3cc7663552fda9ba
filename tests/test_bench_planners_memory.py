"""Pure parts of two benchmarks: torch's checkpoint_sequential as a schedule (planners), and the budgets and verdict of
the whole-process benchmark (process_memory)."""

from __future__ import annotations

import random

import pytest
from chains import random_chain

from benchmarks import planners, process_memory
from edgetrain.core.schedule import Backward, keep_all
from edgetrain.core.simulator import simulate

MiB = 2**20


@pytest.mark.parametrize("segments", range(1, 9))
def test_checkpoint_sequential_as_a_schedule_recomputes_every_segment_but_the_last(segments: int) -> None:
    # 8 model stages and the loss; torch cuts the model stages only, into segments of 8 // s, the rest in the last
    chain = random_chain(random.Random(segments), 9)
    schedule = planners.torch_sequential_schedule(chain, segments)
    stats = simulate(chain, schedule)
    assert stats.forward_advances == (segments - 1) * (8 // segments)
    assert sorted(op.stage for op in schedule.ops if isinstance(op, Backward)) == list(range(9))
    assert schedule.params == {"segments": segments}
    if segments == 1:
        assert schedule.ops == keep_all(9).ops


def test_the_budgets_are_pages_from_just_above_the_least_to_just_above_plain_training() -> None:
    least, plain = 300 * MiB + 5, 420 * MiB + 77
    budgets = process_memory.budgets(least, plain)
    assert all(b % 4096 == 0 for b in budgets)
    assert budgets == sorted(budgets) and len(budgets) == 3
    assert least + 8 * MiB <= budgets[0] < least + 8 * MiB + 4096
    assert plain + 8 * MiB <= budgets[-1] < plain + 8 * MiB + 4096
    assert least + 8 * MiB < budgets[1] < plain   # halfway
    # a run whose least is its plain peak: the three budgets collapse into one, never below the least's margin
    assert process_memory.budgets(plain, plain) == [budgets[-1]]


def _row(model: str, budget: int, peak: int | None, process_peak: int, completed: bool = True) -> dict[str, object]:
    return {"model": model, "batch": 8, "image": 64, "budget_bytes": budget, "completed": completed,
            "cgroup_peak_bytes": peak, "process_peak_bytes": process_peak}


def test_the_verdict_counts_only_runs_that_completed_and_says_where_the_kernel_reclaimed() -> None:
    rows = [_row("resnet18", 400 * MiB, 300 * MiB, 401 * MiB), _row("resnet18", 500 * MiB, 500 * MiB, 450 * MiB),
            _row("mobilenet_v2", 300 * MiB, 300 * MiB, 0, completed=False)]
    headline = process_memory.headline({"skipped": None, "plain": [], "rows": rows})
    assert headline == ("2 of 3 budgets, 2 models: the run completes in a cgroup limited to the budget, the kernel's "
                        "peak 75%-100% of it, reclaiming at the limit in 1 run; peak RSS within the budget at 1 of 3")
    skipped = {"skipped": "making a memory cgroup needs root", "plain": [], "rows": []}
    assert process_memory.render(skipped) == "Not measured: making a memory cgroup needs root."
