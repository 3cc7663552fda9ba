"""plan() at budgets and factors near the least feasible ones.

The fastest (or least-peak) schedule, never a grid error.
"""

from __future__ import annotations

import contextlib
import math
import random

import pytest

from edgetrain import Chain, InfeasibleBudgetError, StageCost, simulate
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import Stats
from edgetrain.planners import plan, revolve, solve, uniform
from edgetrain.planners.dp.exact import exact_minimum_bytes, least_peak_schedule, solve_exact
from edgetrain.profiling import chain_for

FINE_SLOTS = 4000  # eight times plan()'s default grid


def competitors(chain: Chain, budget: int) -> list[Stats]:
    """Every uniform segmentation, revolve slot count and the DP on a finer grid that fits ``budget``."""
    found = [simulate(chain, uniform(chain, n)) for n in range(1, chain.length + 1)]
    found += [simulate(chain, revolve(chain, n)) for n in range(1, max(chain.length - 1, 1) + 1)]
    with contextlib.suppress(InfeasibleBudgetError):
        found.append(simulate(chain, solve(chain, budget, slots=FINE_SLOTS).schedule(budget)))
    return [stats for stats in found if stats.peak_bytes <= budget]


def least_feasible(chain: Chain) -> int:
    with pytest.raises(InfeasibleBudgetError) as caught:
        plan(chain, memory=1)
    assert caught.value.minimum_bytes is not None
    return caught.value.minimum_bytes


@pytest.mark.parametrize(("model", "batch", "size", "rho_at_minimum"), [
    ("resnet18", 16, 32, 1.044), ("resnet50", 8, 224, 1.217), ("mobilenet_v2", 8, 64, 1.016)])
def test_auto_is_fastest_at_twenty_budgets_from_the_least_feasible(model: str, batch: int, size: int,
                                                                   rho_at_minimum: float) -> None:
    chain = chain_for(model, batch, size)
    minimum = least_feasible(chain)
    keep_all_peak = simulate(chain, keep_all(chain.length)).peak_bytes
    # Dense near the minimum, where a grid's rounding bites, up to plain training's peak.
    budgets = [minimum + (keep_all_peak - minimum) * i * i // 19**2 for i in range(20)]
    for budget in budgets:
        chosen = plan(chain, memory=budget)
        assert chosen.predicted_peak_bytes <= budget
        assert simulate(chain, chosen.schedule) == chosen.stats
        fastest_rival = min(stats.time_s for stats in competitors(chain, budget))
        assert chosen.predicted_time_s <= fastest_rival * (1 + 1e-12), budget
    # At the least budget the optimal DP is picked, at these recompute factors.
    at_minimum = plan(chain, memory=minimum)
    assert at_minimum.strategy == "optimal"
    assert at_minimum.recompute_factor == pytest.approx(rho_at_minimum, abs=5e-4)


def test_least_feasible_minimum_is_the_exact_one() -> None:
    chain = chain_for("resnet18", 16, 32)
    minimum = least_feasible(chain)
    assert minimum == 143618048 + 8  # the tensors' least peak, plus the loss and its seed (loss_held_bytes)
    assert plan(chain, memory=minimum).predicted_peak_bytes == minimum
    with pytest.raises(InfeasibleBudgetError):
        plan(chain, memory=minimum - 1)


def random_chain(length: int, seed: int, *, fixed_bytes: int = 0, heavy_gradients: bool = False) -> Chain:
    """Odd sizes (no common divisor helps the grid); ``fixed_bytes`` of weights and optimizer state."""
    rng = random.Random(seed)
    gradient_share = fixed_bytes // length if heavy_gradients else 0
    stages = tuple(StageCost(f"s{i}", rng.uniform(0.5, 2.0), rng.uniform(1.0, 3.0), rng.randrange(1001, 40001),
                             rng.randrange(1001, 80001), param_bytes=fixed_bytes // length,
                             grad_bytes=rng.randrange(0, 4001) + gradient_share,
                             input_saved=rng.random() < 0.8, output_saved=rng.random() < 0.8)
                   for i in range(length))
    return Chain(stages, input_bytes=rng.randrange(1001, 40001), optimizer_state_bytes=fixed_bytes,
                 name=f"random{length}")


CHAINS = [random_chain(4, 1), random_chain(30, 2), random_chain(4, 3, fixed_bytes=8_000_000),
          random_chain(4, 4, fixed_bytes=8_000_000, heavy_gradients=True),
          random_chain(30, 5, fixed_bytes=20_000_000, heavy_gradients=True)]


@pytest.mark.parametrize("chain", CHAINS, ids=lambda chain: f"{chain.name}-{chain.resident_bytes}")
def test_recompute_request_is_least_peak_within_the_factor(chain: Chain) -> None:
    for factor in (1.0, 1.05, 1.2, 1.5, 2.0, 3.0):
        chosen = plan(chain, recompute=factor)
        assert chosen.recompute_factor <= factor * (1 + 1e-12)
        below = chosen.predicted_peak_bytes - 1
        for stats in competitors(chain, below):
            assert stats.recompute_factor > factor * (1 + 1e-12), (factor, stats)


@pytest.mark.parametrize("chain", CHAINS, ids=lambda chain: f"{chain.name}-{chain.resident_bytes}")
def test_budget_request_from_the_exact_minimum_up(chain: Chain) -> None:
    minimum = exact_minimum_bytes(chain)
    with pytest.raises(InfeasibleBudgetError) as caught:
        plan(chain, memory=minimum - 1)
    assert caught.value.minimum_bytes == minimum
    keep_all_peak = simulate(chain, keep_all(chain.length)).peak_bytes
    for i in range(10):
        budget = minimum + (keep_all_peak - minimum) * i * i // 81
        chosen = plan(chain, memory=budget)
        assert chosen.predicted_peak_bytes <= budget
        rivals = [stats.time_s for stats in competitors(chain, budget)]  # none fit the least budgets
        assert chosen.predicted_time_s <= min(rivals, default=math.inf) * (1 + 1e-12)


def small_unit_chain(seed: int, *, outputs_saved: bool) -> Chain:
    """Sizes of a few bytes: the grid's unit is their common divisor, so the numba table has no rounding."""
    rng = random.Random(seed)
    stages = tuple(StageCost(f"s{i}", float(rng.randint(1, 4)), float(rng.randint(1, 4)), rng.randint(1, 5),
                             rng.randint(1, 9), grad_bytes=rng.randint(0, 3), input_saved=rng.random() < 0.7,
                             output_saved=outputs_saved or rng.random() < 0.7) for i in range(9))
    return Chain(stages, input_bytes=rng.randint(1, 5))


@pytest.mark.parametrize("seed", range(4))
def test_exact_table_equals_an_exact_grid(seed: int) -> None:
    chain = small_unit_chain(seed, outputs_saved=True)
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    grid, exact = solve(chain, top), solve_exact(chain, top)
    assert grid.rounding_bytes == 0
    assert exact.min_memory_bytes == grid.min_memory_bytes == exact_minimum_bytes(chain)
    for budget in range(exact.min_memory_bytes, top + 1):
        assert exact.time_s(budget) == grid.time_s(budget)
        stats = simulate(chain, exact.schedule(budget))
        assert stats.peak_bytes <= budget and stats.time_s == pytest.approx(exact.time_s(budget), rel=1e-12)


def test_exact_table_hands_a_child_what_an_unsaved_output_frees() -> None:
    # Seed 3 has records whose hold is negative (an output the record does not keep, counted by
    # the child); the grid clamps those holds to zero, the exact table does not, and the
    # simulator confirms its faster schedules fit: at 29 bytes 75 s against the grid's 82 s.
    chain = small_unit_chain(3, outputs_saved=False)
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    grid, exact = solve(chain, top), solve_exact(chain, top)
    assert exact.min_memory_bytes == exact_minimum_bytes(chain)
    # Holds of -1 (stage 3, e = 0 and 1) and -3 (stage 8, e = 0): the grid may miss 5 bytes' worth.
    assert grid.rounding_bytes == 5
    assert (exact.time_s(29), grid.time_s(29)) == (75.0, 82.0)
    for budget in range(exact.min_memory_bytes, top + 1):
        assert exact.time_s(budget) <= grid.time_s(budget)
        stats = simulate(chain, exact.schedule(budget))
        assert stats.peak_bytes <= budget and stats.time_s == pytest.approx(exact.time_s(budget), rel=1e-12)


LONG_CHAINS = [random_chain(70, 7), random_chain(70, 8, fixed_bytes=50_000_000, heavy_gradients=True)]


@pytest.mark.parametrize("chain", LONG_CHAINS, ids=lambda chain: f"{chain.name}-{chain.resident_bytes}")
def test_long_chain_requests_get_a_schedule_never_a_grid_error(chain: Chain) -> None:
    # Longer than EXACT_MAX_STAGES: no exact table; at the least budget the grid rounds every
    # schedule away, and the least-peak schedule answers (a refusal naming the minimum as the
    # "feasible minimum" it met, before).
    minimum = exact_minimum_bytes(chain)
    keep_all_peak = simulate(chain, keep_all(chain.length)).peak_bytes
    with pytest.raises(InfeasibleBudgetError) as caught:
        plan(chain, memory=minimum - 1, strategy="optimal")
    assert caught.value.minimum_bytes == minimum
    for budget in (minimum, minimum + (keep_all_peak - minimum) // 9):
        chosen = plan(chain, memory=budget, strategy="optimal")
        assert simulate(chain, chosen.schedule) == chosen.stats
        assert chosen.predicted_peak_bytes <= budget
    for factor in (1.05,):
        chosen = plan(chain, recompute=factor, strategy="optimal")
        assert simulate(chain, chosen.schedule) == chosen.stats
        assert chosen.recompute_factor <= factor * (1 + 1e-12)


@pytest.mark.parametrize("chain", [*CHAINS, *LONG_CHAINS], ids=lambda chain: f"{chain.name}-{chain.resident_bytes}")
def test_least_peak_schedule_reaches_the_exact_minimum(chain: Chain) -> None:
    assert simulate(chain, least_peak_schedule(chain)).peak_bytes == exact_minimum_bytes(chain)


def test_a_long_chain_at_its_least_budget_gets_a_faster_schedule_than_the_least_peak_one() -> None:
    """NOTE [ Schedules a grid charges above what they hold ]: on 80 stages (no exact table) the grid finds
    nothing at the least budget, and the least-peak schedule (which only minimises the peak) was the answer;
    schedules the grid places above the budget that hold no more than it are faster. The plan is the fastest
    that fits of every candidate, and fits."""
    from edgetrain.planners.choose import _least_peak_candidate, _OptimalSearch

    chain = random_chain(80, 0)
    least = least_feasible(chain)
    chosen = plan(chain, memory=least)
    least_peak = _least_peak_candidate(chain)
    assert chosen.predicted_peak_bytes <= least == least_peak.stats.peak_bytes
    assert chosen.recompute_factor < 0.85 * least_peak.stats.recompute_factor   # measured: 1.584 against 1.984
    candidates = _OptimalSearch(chain, 500, jit=True).rounded_up(least)
    fitting = [c for c in candidates if c.stats.peak_bytes <= least]
    assert fitting and chosen.predicted_time_s <= min(c.stats.time_s for c in fitting)
