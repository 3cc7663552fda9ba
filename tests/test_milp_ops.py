"""milp_schedule turns POET-MILP solutions on chains into executor ops that cost what the MILP says.

On chains where the MILP's graph model and the simulator coincide (records hold only their
output, no input kept, no gradients, no workspace; see test_planner_milp_crosscheck.py), every
converted schedule must run in :func:`simulate` within the budget at exactly the MILP's energy.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from chains import chain_with_output_records

from edgetrain import Chain
from edgetrain.core.chain import StageCost
from edgetrain.core.schedule import Forward, Keep, PageIn, PageOut, Schedule, keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import InfeasibleBudgetError, ScheduleError
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.milp.ops import milp_schedule
from edgetrain.planners.milp.solve import chain_training_graph, milp
from edgetrain.planners.milp.strategy import MilpPlan, plan_milp

PROFILE = EnergyProfile("toy", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)
CHEAP_STORAGE = EnergyProfile("cheap", 1.0, 3.0, 1e-6, 1000.0, 0.01, 1e-6, 1000.0, 0.01)


def check(chain: Chain, profile: EnergyProfile, budget: int, **kwargs: object) -> Schedule:
    result = milp(chain_training_graph(chain, profile), budget, mip_gap=1e-9, time_limit_s=30, **kwargs)
    assert result.status == "optimal"
    schedule = milp_schedule(chain, result)
    assert schedule.strategy == "milp" and schedule.length == chain.length
    stats = simulate(chain, schedule, profile)
    assert stats.peak_bytes <= budget
    assert stats.energy_j == pytest.approx(result.energy_j, rel=1e-9)
    assert stats.forward_count == int(result.R[:, :chain.length].sum())
    assert stats.pagein_count == int(result.M_in.sum()) and stats.pageout_count == int(result.M_out.sum())
    return schedule


@pytest.mark.parametrize("seed", range(8))
def test_converted_schedules_cost_the_milp_energy_at_every_budget(seed: int) -> None:
    chain = chain_with_output_records(random.Random(seed))
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    lowest = solve_paging(chain, PROFILE, top, slots=1000).min_memory_bytes
    for budget in range(lowest, top + 1):
        check(chain, PROFILE, budget)
    assert check(chain, PROFILE, top).ops == keep_all(chain.length).ops


def test_paging_is_converted_to_page_ops() -> None:
    chain = Chain(tuple(StageCost(f"s{i}", 1.0, 2.0, out, out, input_saved=False, output_saved=True)
                        for i, out in enumerate((3, 1, 4, 2, 3))), input_bytes=1, name="toy")
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    lowest = solve_paging(chain, CHEAP_STORAGE, top, slots=1000).min_memory_bytes
    paged = 0
    for budget in range(lowest, top):
        ops = check(chain, CHEAP_STORAGE, budget).ops
        outs = [op.value for op in ops if isinstance(op, PageOut)]
        assert sorted(outs) == sorted(op.value for op in ops if isinstance(op, PageIn))
        paged += bool(outs)
    assert paged > 0


def test_recomputation_without_paging() -> None:
    keeps = set()
    for seed in range(8):
        chain = chain_with_output_records(random.Random(seed))
        top = simulate(chain, keep_all(chain.length)).peak_bytes
        lowest = solve_paging(chain, PROFILE, top, slots=1000).min_memory_bytes
        for budget in range(lowest, top + 1):
            try:
                ops = check(chain, PROFILE, budget, paging=False).ops
            except Exception as exc:  # no schedule without paging at this budget
                if "no schedule fits" in str(exc):
                    continue
                raise
            keeps |= {op.keep for op in ops if isinstance(op, Forward)}
    assert keeps == {Keep.NONE, Keep.INPUT, Keep.ALL}


def input_saving_chain() -> Chain:
    return Chain(tuple(StageCost(f"s{i}", 1.0, 1.0, out, out, input_saved=True, output_saved=False)
                       for i, out in enumerate((1, 1, 2))), input_bytes=1, name="in")


def test_recomputing_a_saved_input_is_not_expressible() -> None:
    chain = input_saving_chain()
    result = milp(chain_training_graph(chain, PROFILE), 4, mip_gap=1e-9, paging=False)
    with pytest.raises(ScheduleError, match=r"keeps its input x_1.*not expressible"):
        milp_schedule(chain, result)
    plan = MilpPlan(result, "toy", 4, chain.compute_time_s, chain=chain)
    assert plan.schedule is None
    assert "not expressible" in plan.to_dict()["schedule_error"]  # type: ignore[operator]


def test_result_for_another_chain_is_refused() -> None:
    chain = chain_with_output_records(random.Random(0))
    result = milp(chain_training_graph(chain, PROFILE), 10**6)
    other = Chain(chain.stages + chain.stages, input_bytes=1)
    with pytest.raises(ScheduleError, match="not for chain_training_graph"):
        milp_schedule(other, result)


def test_plan_milp_fits_the_generator_states_the_milp_leaves_out() -> None:
    """NOTE [ Generator states in the plan ]: a state of 2 bytes per recomputed stage, on chains whose records
    are a few bytes; below keep-all's peak the converted schedule, states counted, fits the budget."""
    for seed in range(4):
        chain = replace(chain_with_output_records(random.Random(seed), 6), rng_state_bytes=2)
        top = simulate(chain, keep_all(chain.length)).peak_bytes
        for budget in range(top - 4, top):
            try:
                plan = plan_milp(chain, PROFILE, budget)
            except InfeasibleBudgetError as exc:
                assert exc.minimum_bytes is not None and exc.minimum_bytes > budget
                continue
            assert plan.schedule is not None and simulate(chain, plan.schedule).peak_bytes <= budget


def test_plan_milp_carries_the_schedule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    chain = chain_with_output_records(random.Random(3))
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    plan = plan_milp(chain, PROFILE, top - 2)
    assert plan.to_dict()["schedule_error"] is None
    schedule = plan.schedule
    assert schedule is not None and schedule.strategy == "milp"
    assert simulate(chain, schedule).peak_bytes <= top - 2
    schedule.save(tmp_path / "s.json")
    assert Schedule.load(tmp_path / "s.json").ops == schedule.ops
    assert np.isfinite(plan.to_dict()["energy_j"])  # type: ignore[arg-type]
