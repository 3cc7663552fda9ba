"""paging-dp: the recompute DP with paging, priced in energy; checked against the simulator and ``optimal``."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from chains import MB, around_least, keep_all_peak, random_chain

from edgetrain import Chain
from edgetrain.core.chain import StageCost
from edgetrain.core.schedule import Backward, Forward, PageIn, PageOut, Schedule
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile, page_energy_j
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.planners.dp.grid import common_unit_bytes
from edgetrain.planners.dp.optimal import solve
from edgetrain.planners.dp.paging import least_paging_peak, paging_dp, solve_paging
from edgetrain.planners.energy_plan import plan_energy
from edgetrain.profiling import linear_resnet

# cheap storage: 100 MB/s in at 1 W, 50 MB/s out at 1.5 W, 1 ms latency; compute at 3 W
CHEAP = EnergyProfile("cheap", 1e9, 3.0, 1e-3, 1e8, 1.0, 1e-3, 5e7, 1.5)
# storage so slow that paging never pays
SLOW = EnergyProfile("slow", 1e9, 3.0, 1e3, 1.0, 1.0, 1e3, 1.0, 1.5)


@pytest.mark.parametrize("seed", range(12))
def test_fast_kernel_equals_reference(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(1, 6))
    top = keep_all_peak(chain)
    reference = solve_paging(chain, CHEAP, top, slots=60, solver="reference")
    fast = solve_paging(chain, CHEAP, top, slots=60, solver="fast")
    np.testing.assert_array_equal(reference.top_cost, fast.top_cost)
    np.testing.assert_array_equal(reference.choice, fast.choice)


@pytest.mark.parametrize("seed", range(20))
def test_rebuilt_schedules_fit_and_cost_what_the_table_says(seed: int) -> None:
    """The table's cost is the simulator's energy of the rebuilt schedule, to rounding; its peak is within budget."""
    rng = random.Random(100 + seed)
    chain = random_chain(rng, rng.randint(2, 8))
    top = keep_all_peak(chain)
    table = solve_paging(chain, CHEAP, top, slots=80)
    for budget in np.linspace(table.min_memory_bytes, top, 7).astype(int):
        stats = simulate(chain, table.schedule(int(budget)), CHEAP)
        assert stats.peak_bytes <= budget
        assert stats.energy_j == pytest.approx(table.cost(int(budget)), rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_without_affordable_paging_it_is_the_optimal_recompute_dp(seed: int) -> None:
    """Storage too slow to use: energy = compute power x optimal's least time, at every budget."""
    rng = random.Random(200 + seed)
    chain = random_chain(rng, rng.randint(2, 8))
    top = keep_all_peak(chain)
    recompute_only = solve(chain, top, slots=80)
    table = solve_paging(chain, SLOW, top, slots=80)
    assert table.min_memory_bytes <= recompute_only.min_memory_bytes   # paging still fits more budgets
    for budget in np.linspace(recompute_only.min_memory_bytes, top, 6).astype(int):
        assert table.cost(int(budget)) == pytest.approx(SLOW.compute_power_w * recompute_only.time_s(int(budget)))


@pytest.mark.parametrize("seed", range(20))
def test_paging_never_costs_more_energy_than_recompute_only(seed: int) -> None:
    rng = random.Random(300 + seed)
    chain = random_chain(rng, rng.randint(2, 8))
    top = keep_all_peak(chain)
    recompute_only = solve(chain, top, slots=80)
    table = solve_paging(chain, CHEAP, top, slots=80)
    assert table.min_memory_bytes <= recompute_only.min_memory_bytes
    for budget in np.linspace(recompute_only.min_memory_bytes, top, 6).astype(int):
        assert table.cost(int(budget)) <= CHEAP.compute_power_w * recompute_only.time_s(int(budget)) * (1 + 1e-12)


def test_paging_instead_of_recomputing_by_hand() -> None:
    """Four unit stages whose records keep their input (as a convolution does), unit powers.

    Keep-all peaks at 6 bytes (x_0..x_3, the loss output x_4 and δ_3 at the last backward).
    With storage at 1 byte per µs and 1 µs latency, each 1-byte transfer costs 2e-6 J. At 5
    bytes the best is keep-all with x_2 paged out while stage 3 runs (8 J + 2 transfers); at
    4 bytes x_1 and x_2 both (8 J + 4 transfers). Recompute-only pays 10 J and 13 J there.
    """
    stages = tuple(StageCost(f"s{i}", 1.0, 1.0, 1, 1, input_saved=True, output_saved=False) for i in range(4))
    chain = Chain(stages, input_bytes=1)
    profile = EnergyProfile("unit", 1.0, 1.0, 1e-6, 1e6, 1.0, 1e-6, 1e6, 1.0)
    assert keep_all_peak(chain) == 6
    table, recompute_only = solve_paging(chain, profile, 6, slots=10), solve(chain, 6)
    transfer_j = page_energy_j(1, profile, "in")
    assert transfer_j == pytest.approx(2e-6)
    for budget, paged, recompute_j in ((6, (), 8.0), (5, (2,), 10.0), (4, (1, 2), 13.0)):
        schedule = table.schedule(budget)
        assert table.cost(budget) == pytest.approx(8.0 + 2 * transfer_j * len(paged), abs=1e-12)
        assert tuple(op.value for op in schedule.ops if isinstance(op, PageOut)) == paged
        assert sum(isinstance(op, Forward) for op in schedule.ops) == 4   # no recomputation
        assert simulate(chain, schedule).peak_bytes <= budget
        assert recompute_only.time_s(budget) == recompute_j


def test_deadline_trades_energy_for_time() -> None:
    """Storage frugal in energy but slow: under a deadline the DP recomputes instead of paging.

    The chain of the test above at 5 bytes: paging x_2 costs two 1.5 s transfers at 0.01 W
    (8 s x 3 W + 0.03 J = 24.03 J, 11 s); recomputing costs two more forwards (30 J, 10 s).
    """
    stages = tuple(StageCost(f"s{i}", 1.0, 1.0, 1, 1, input_saved=True, output_saved=False) for i in range(4))
    chain = Chain(stages, input_bytes=1)
    profile = EnergyProfile("slow-io", 1.0, 3.0, 1e-9, 1 / 1.5, 0.01, 1e-9, 1 / 1.5, 0.01)
    free = paging_dp(chain, profile, 5, slots=10)
    assert free.deadline_met and free.stats.pageout_count == 1
    assert free.stats.energy_j == pytest.approx(24.03, abs=1e-6)
    assert free.stats.time_s == pytest.approx(11.0, abs=1e-6)
    tight = paging_dp(chain, profile, 5, deadline_s=10.5, slots=10)
    assert tight.deadline_met and tight.stats.pageout_count == 0
    assert (tight.stats.energy_j, tight.stats.time_s) == (pytest.approx(30.0), pytest.approx(10.0))
    impossible = paging_dp(chain, profile, 5, deadline_s=9.0, slots=10)
    assert not impossible.deadline_met


def test_infeasible_budget_reports_a_floor() -> None:
    chain = Chain.uniform(5, act_bytes=MB)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve_paging(chain, CHEAP, 2 * MB)
    assert info.value.minimum_bytes is not None and info.value.minimum_bytes > 2 * MB


def odd_sized(chain: Chain, param_bytes: int = 0) -> Chain:
    """``chain`` with sizes no common divisor rounds (a grid of 500 slots is never exact), plus fixed state."""
    stages = tuple(replace(stage, out_bytes=stage.out_bytes + 37 * i + 1, saved_bytes=stage.saved_bytes + 53 * i + 3,
                           param_bytes=param_bytes, grad_bytes=stage.grad_bytes + param_bytes)
                   for i, stage in enumerate(chain.stages))
    return replace(chain, stages=stages, input_bytes=chain.input_bytes + 11)


# Sizes no grid of 500 slots divides exactly; in one, weights, gradients and optimizer state are 99% of the peak
AROUND_LEAST = {
    "uniform": (odd_sized(Chain.uniform(10, act_bytes=MB, saved_bytes=2 * MB)), True),
    "uniform, paging only": (odd_sized(Chain.uniform(10, act_bytes=MB, saved_bytes=2 * MB)), False),
    "linear_resnet18": (linear_resnet(18, 8, 224), True),
    "fixed state dominates": (replace(odd_sized(Chain.uniform(8, act_bytes=MB), 50 * MB),
                                      optimizer_state_bytes=400 * MB), True),
    **{f"random {seed}": (odd_sized(random_chain(random.Random(300 + seed), 7)), True) for seed in range(4)},
}


@pytest.mark.parametrize(("chain", "recompute"), AROUND_LEAST.values(), ids=AROUND_LEAST)
def test_every_budget_from_the_stated_least_gets_a_schedule_within_it(chain: Chain, recompute: bool) -> None:
    """NOTE [ Paging near the least budget ]: a refusal states the least budget of any schedule, that budget is
    accepted and reached exactly, and so is every budget above it, where the grid scaled to the budget rounds
    every schedule away included."""
    with pytest.raises(InfeasibleBudgetError) as info:
        paging_dp(chain, CHEAP, 1, recompute=recompute)
    least = info.value.minimum_bytes
    assert least == least_paging_peak(chain, CHEAP, recompute=recompute).minimum_bytes
    with pytest.raises(InfeasibleBudgetError) as below:
        paging_dp(chain, CHEAP, least - 1, recompute=recompute)
    assert below.value.minimum_bytes == least
    for budget in around_least(least, keep_all_peak(chain)):
        peak = simulate(chain, paging_dp(chain, CHEAP, budget, recompute=recompute).schedule).peak_bytes
        assert peak <= budget
        assert budget > least or peak == least


@pytest.mark.parametrize("seed", range(12))
def test_least_paging_peak_is_the_least_budget_of_an_exact_table(seed: int) -> None:
    """Sizes in whole MB: the table's unit divides every size, so its least budget is exact, and the pass in bytes
    (a second solver of the recurrence) finds the same, reached exactly by its schedule."""
    rng = random.Random(200 + seed)
    chain = random_chain(rng, rng.randint(1, 8))
    for recompute in (True, False):
        table = solve_paging(chain, CHEAP, keep_all_peak(chain), recompute=recompute)
        assert common_unit_bytes(chain) % table.unit_bytes == 0
        least = least_paging_peak(chain, CHEAP, recompute=recompute)
        assert least.minimum_bytes == table.min_memory_bytes == simulate(chain, least.schedule).peak_bytes


@pytest.mark.parametrize("strategy", ["recompute", "paging-dp", "paging-only"])
@pytest.mark.parametrize("name", ["uniform", "random 1"])
def test_plan_energy_answers_every_budget_from_the_least_it_states(name: str, strategy: str) -> None:
    """The same of :func:`plan_energy`'s DP strategies, recompute-only included (its 2000-slot grid)."""
    chain = AROUND_LEAST[name][0]
    with pytest.raises(InfeasibleBudgetError) as info:
        plan_energy(chain, CHEAP, 1, strategy=strategy)
    least = info.value.minimum_bytes
    assert least is not None
    with pytest.raises(InfeasibleBudgetError):
        plan_energy(chain, CHEAP, least - 1, strategy=strategy)
    for budget in around_least(least, keep_all_peak(chain)):
        assert plan_energy(chain, CHEAP, budget, strategy=strategy).stats.peak_bytes <= budget


@pytest.mark.parametrize("strategy", ["recompute", "paging-dp"])
def test_plan_energy_fits_the_generator_states_its_planners_leave_out(strategy: str) -> None:
    """NOTE [ Generator states in the plan ]: states of a quarter MB per recomputed stage; every budget from the
    least the error states to keep-all's peak gets a schedule whose simulated peak, states counted, is within
    (storage too slow to page: the schedules recompute)."""
    chain = replace(AROUND_LEAST["uniform"][0], rng_state_bytes=MB // 4)
    with pytest.raises(InfeasibleBudgetError) as info:
        plan_energy(chain, SLOW, 1, strategy=strategy)
    least = info.value.minimum_bytes
    assert least is not None
    recomputed = 0
    for budget in around_least(least, keep_all_peak(chain)):
        stats = plan_energy(chain, SLOW, budget, strategy=strategy).stats
        assert stats.peak_bytes <= budget
        recomputed += stats.forward_advances > 0
    assert recomputed > 0


def test_paging_dp_schedule_round_trips_through_compact_form() -> None:
    rng = random.Random(7)
    chain = random_chain(rng, 8)
    table = solve_paging(chain, CHEAP, keep_all_peak(chain), slots=80)
    schedule = table.schedule(table.min_memory_bytes)
    data = schedule.to_bytes()
    assert Schedule.from_bytes(data).ops == schedule.ops
    assert len(data) == 6 + len(schedule.ops)
    # The least-memory schedule pages, so the compact form carried every kind of op.
    assert {type(op) for op in Schedule.from_bytes(data).ops} >= {Forward, Backward, PageOut, PageIn}


@pytest.mark.parametrize("seed", range(10))
def test_paging_only_never_recomputes_and_matches_reference(seed: int) -> None:
    rng = random.Random(400 + seed)
    chain = random_chain(rng, rng.randint(1, 6))
    top = keep_all_peak(chain)
    fast = solve_paging(chain, CHEAP, top, slots=60, recompute=False)
    reference = solve_paging(chain, CHEAP, top, slots=60, recompute=False, solver="reference")
    np.testing.assert_array_equal(fast.choice, reference.choice)
    full = solve_paging(chain, CHEAP, top, slots=60)
    assert fast.min_memory_bytes >= full.min_memory_bytes
    for budget in np.linspace(fast.min_memory_bytes, top, 5).astype(int):
        stats = simulate(chain, fast.schedule(int(budget)), CHEAP)
        assert stats.forward_advances == 0 and stats.peak_bytes <= budget
        assert full.cost(int(budget)) <= fast.cost(int(budget)) * (1 + 1e-12)
