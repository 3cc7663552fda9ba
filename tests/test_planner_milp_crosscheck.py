"""paging-dp reaches POET's MILP optimum on chains where the two cost models coincide.

On chains whose records hold only their output (``saved_bytes == out_bytes``, no input kept),
with no parameter gradients and no workspace, the MILP's graph model (``chain_training_graph``)
counts the same bytes, times and transfers as the simulator. The MILP searches every schedule
of its model (recomputing, keeping or paging any value at any step); paging-dp only persistent,
in-order ones, built from executable ops. Equal optima at every budget say the DP loses nothing
on these chains, and that neither model under-counts the other. (Where records also keep their
input, the MILP may recompute such an input without re-recording the stage, which autograd
cannot run, so its optimum can be lower there: docs/concepts/milp.md.)
"""

from __future__ import annotations

import random

import pytest
from chains import chain_with_output_records

from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.milp.solve import chain_training_graph, milp

PROFILE = EnergyProfile("toy", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)


@pytest.mark.parametrize("seed", range(8))
def test_paging_dp_reaches_the_milp_optimum(seed: int) -> None:
    rng = random.Random(seed)
    chain = chain_with_output_records(rng)
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    table = solve_paging(chain, PROFILE, top, slots=1000)    # unit = 1 byte: the table is exact
    graph = chain_training_graph(chain, PROFILE)
    for budget in range(table.min_memory_bytes, top + 1):
        dp = table.cost(budget)
        found = milp(graph, budget, mip_gap=1e-9, time_limit_s=30, read_back_once=True)
        assert found.status == "optimal"
        assert found.energy_j == pytest.approx(dp, rel=1e-9)
