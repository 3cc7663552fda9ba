"""The Capuchin-style greedy: fits what it claims, swaps or recomputes as storage speed says, never beats paging-dp."""

from __future__ import annotations

import random

import pytest
from chains import MB, keep_all_peak, random_chain

from edgetrain.core.chain import Chain
from edgetrain.core.schedule import PageOut, keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.planners.capuchin import capuchin
from edgetrain.planners.dp.paging import solve_paging

# storage as fast as it gets: any transfer hides behind one stage of compute
FAST = EnergyProfile("fast", 1e9, 3.0, 1e-9, 1e15, 1.0, 1e-9, 1e15, 1.0)
# storage so slow that no transfer ever hides
SLOW = EnergyProfile("slow", 1e9, 3.0, 1e3, 1.0, 1.0, 1e3, 1.0, 1.0)
# a middle ground: swaps hide behind long windows only
MEDIUM = EnergyProfile("medium", 1e9, 3.0, 1e-3, 1e8, 1.0, 1e-3, 5e7, 1.5)


def test_keeps_everything_when_the_budget_allows() -> None:
    chain = Chain.uniform(6, act_bytes=MB)
    schedule = capuchin(chain, MEDIUM, keep_all_peak(chain))
    assert schedule.ops == keep_all(chain.length).ops


@pytest.mark.parametrize("seed", range(8))
def test_fits_the_budget_or_says_how_low_it_got(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, rng.randint(3, 9))
    top = keep_all_peak(chain)
    for budget in range(top, top // 3, -MB):
        try:
            schedule = capuchin(chain, MEDIUM, budget)
        except InfeasibleBudgetError as exc:
            assert exc.minimum_bytes is not None and exc.minimum_bytes > budget
            continue
        assert simulate(chain, schedule, MEDIUM).peak_bytes <= budget


def test_swaps_when_storage_is_fast_and_recomputes_when_slow() -> None:
    chain = Chain.uniform(8, act_bytes=MB)
    budget = keep_all_peak(chain) - 2 * MB
    fast = simulate(chain, capuchin(chain, FAST, budget), FAST)
    slow_schedule = capuchin(chain, SLOW, budget)
    slow = simulate(chain, slow_schedule, SLOW)
    assert fast.peak_bytes <= budget and fast.pageout_count > 0 and fast.forward_advances == 0
    assert slow.peak_bytes <= budget and slow.forward_advances > 0
    assert not any(isinstance(op, PageOut) for op in slow_schedule.ops)


def test_an_impossible_budget_raises_with_the_least_peak_reached() -> None:
    chain = Chain.uniform(5, act_bytes=MB)
    with pytest.raises(InfeasibleBudgetError) as info:
        capuchin(chain, SLOW, MB)
    assert info.value.minimum_bytes is not None and info.value.minimum_bytes > MB
    assert info.value.budget_bytes == MB


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("profile", [FAST, MEDIUM, SLOW], ids=["fast", "medium", "slow"])
def test_never_beats_paging_dp_energy(seed: int, profile: EnergyProfile) -> None:
    rng = random.Random(100 + seed)
    chain = random_chain(rng, rng.randint(3, 8))
    top = keep_all_peak(chain)
    table = solve_paging(chain, profile, top)
    compared = 0
    for budget in range(top, top // 3, -MB):
        try:
            greedy = simulate(chain, capuchin(chain, profile, budget), profile)
        except InfeasibleBudgetError:
            continue
        best = simulate(chain, table.schedule(budget), profile)
        assert best.peak_bytes <= budget
        assert best.energy_j <= greedy.energy_j * (1 + 1e-9)
        compared += 1
    assert compared > 0
