"""The single-level planner's search (planners/single_level.py) on long chains: groups of stages, exact predictions."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from chains import keep_all_peak, random_chain

from edgetrain import Chain
from edgetrain.core.simulator import simulate
from edgetrain.planners import single_level as planner
from edgetrain.planners.search_timing import timed_search
from edgetrain.planners.single_level import GOES_ON, KEPT, STARTS, single_level, single_level_plan, stage_groups
from edgetrain.runtime.compiled import text_kinds


def test_a_short_chain_is_searched_stage_by_stage() -> None:
    assert stage_groups([True, False, True, True, False]) == [0, 1, 2, 3]


def test_a_long_chain_is_searched_in_groups_that_begin_where_a_region_may_open() -> None:
    opens = [i % 3 != 1 for i in range(80)]   # stages 1, 4, 7, ... save only their output: no region opens there
    openings = [0] + [i for i in range(1, 79) if opens[i]]
    firsts = stage_groups(opens, max_groups=24)
    assert len(firsts) == 24 and firsts[0] == 0 and firsts == sorted(set(firsts))
    assert set(firsts) <= set(openings)
    # spread evenly over the 53 openings: each group but the last (which takes the rest) spans two of them
    spans = [openings.index(b) - openings.index(a) for a, b in itertools.pairwise(firsts)]
    assert set(spans) == {2}
    # fewer openings than groups: every opening begins a group
    assert stage_groups([i % 20 == 0 for i in range(80)], max_groups=24) == [0, 20, 40, 60]


def _regions_from(firsts: list[int], opens: list[bool], length: int) -> list[int]:
    """Regions from each of ``firsts`` to the next (up to the loss stage, kept), where a region may open."""
    kinds = [KEPT] * length
    for a, b in zip(firsts, [*firsts[1:], length - 1], strict=True):
        if opens[a]:
            kinds[a:b] = [STARTS] + [GOES_ON] * (b - a - 1)
    return kinds


@pytest.mark.slow
def test_on_a_long_chain_the_plan_moves_whole_groups_fits_as_simulated_and_beats_every_start() -> None:
    # Prepare: 50 stages, all but two saving their input (where regions may open: many starts for the search), a
    # budget a third of the way from regions of three groups each up to keep-all's peak
    drawn = random_chain(random.Random(5), 50)
    chain = Chain(tuple(replace(stage, input_saved=i not in (10, 30)) for i, stage in enumerate(drawn.stages)),
                  input_bytes=drawn.input_bytes)
    opens = [stage.input_saved for stage in chain.stages]
    firsts = stage_groups(opens)
    low = simulate(chain, single_level(_regions_from(firsts[::3], opens, chain.length))).peak_bytes
    budget = low + (keep_all_peak(chain) - low) // 3
    # Execute: the counted search at the planner's own grouping
    searched = timed_search(chain, budget, planner.MAX_GROUPS, 600.0)
    assert searched.plan is not None
    kinds = text_kinds(searched.plan)
    # Assert: regions begin and end only at groups' first stages, and open where the input is saved
    edges = {i for i in range(1, chain.length) if (kinds[i] == KEPT) != (kinds[i - 1] == KEPT) or kinds[i] == STARTS}
    assert STARTS in kinds and edges <= {*firsts, chain.length - 1}
    assert all(opens[i] for i, kind in enumerate(kinds) if kind == STARTS)
    stats = simulate(chain, single_level(kinds))
    assert stats.peak_bytes <= budget
    # no fitting plan of regions of k consecutive groups is faster than the plan the search ends on
    for k in range(1, len(firsts)):
        other = simulate(chain, single_level(_regions_from(firsts[::k], opens, chain.length)))
        assert other.peak_bytes > budget or other.time_s >= stats.time_s
    # and the search is a few thousand simulations (stage by stage it is about 40,000 on this chain)
    assert searched.simulations < 5_000


def test_a_timed_search_stops_past_its_limit_and_puts_the_planner_back(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = random_chain(random.Random(2), 30)
    budget = keep_all_peak(chain) - 1
    stopped = timed_search(chain, budget, chain.length, limit_s=0.0)
    searched = timed_search(chain, budget, 8, limit_s=600.0)
    assert not stopped.finished and stopped.simulations == 1 and stopped.plan is None
    assert searched.finished and searched.peak_bytes is not None and searched.peak_bytes <= budget
    assert planner.MAX_GROUPS == 24 and planner.simulate is simulate
    monkeypatch.setattr(planner, "MAX_GROUPS", 8)
    assert searched.plan == "".join(".SR"[k] for k in single_level_plan(chain, budget))
