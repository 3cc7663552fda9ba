"""paging-dp against POET's MILP on chains where the two cost models can be compared.

On chains whose records hold only their output (``saved_bytes == out_bytes``, no input kept),
with no parameter gradients and no workspace, the MILP's graph model (``chain_training_graph``)
counts the same bytes as the simulator, but it may recompute a value a record keeps without
re-recording the stage and it is not limited to persistent, in-order schedules: its optimum can
only be lower. paging-dp, which only builds executable schedules, must never beat it (that
would mean the DP under-counts), and reaches it in most cases.
"""

from __future__ import annotations

import random

import pytest

from edgetrain import Chain
from edgetrain.chain import StageCost
from edgetrain.energy import EnergyProfile
from edgetrain.planners.milp import chain_training_graph, milp
from edgetrain.planners.paging import solve_paging
from edgetrain.schedule import keep_all, simulate

PROFILE = EnergyProfile("toy", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)


def chain_with_output_records(rng: random.Random) -> Chain:
    stages = []
    for i in range(rng.randint(2, 5)):
        out = rng.randint(1, 4)
        stages.append(StageCost(f"s{i}", rng.choice([0.5, 1.0, 2.0]), rng.choice([1.0, 2.0]), out, out,
                                input_saved=False, output_saved=True))
    return Chain(tuple(stages), input_bytes=1, name="toy")


@pytest.mark.parametrize("seed", range(6))
def test_paging_dp_never_beats_the_milp_and_often_reaches_it(seed: int) -> None:
    rng = random.Random(seed)
    chain = chain_with_output_records(rng)
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    table = solve_paging(chain, PROFILE, top, slots=1000)    # unit = 1 byte: the table is exact
    graph = chain_training_graph(chain, PROFILE)
    for budget in range(table.min_memory_bytes, top + 1):
        dp = table.cost(budget)
        found = milp(graph, budget, mip_gap=1e-9, time_limit_s=30)
        assert found.status == "optimal"
        assert found.energy_j <= dp * (1 + 1e-9)
    assert milp(graph, top, mip_gap=1e-9).energy_j == pytest.approx(table.cost(top))  # keep-all on both
