"""paging-dp against POET's MILP on random chains where their cost models coincide, and MILP → ops.

Chains whose records hold only their output (``saved_bytes == out_bytes``, input not kept, no
gradients, no workspace), 2-7 stages of 1-4 bytes, alternately on two storage profiles. For every
budget from paging-dp's least to keep-all's peak: the MILP (HiGHS, gap 1e-9, a page-in consumes
the flash copy as the executor's does) against paging-dp's exact table, and the MILP's solution
converted to executor ops (:func:`edgetrain.planners.milp.ops.milp_schedule`) replayed by the
simulator (peak within the budget, energy equal to the MILP's).

Usage: ``python benchmarks/milp_crosscheck.py [--chains 100]``; prints counts and any mismatch.
"""

from __future__ import annotations

import argparse
import random
import time

from edgetrain import Chain
from edgetrain.core.chain import StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import EdgetrainError
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.milp.ops import milp_schedule
from edgetrain.planners.milp.solve import chain_training_graph, milp

PROFILES = (EnergyProfile("slow-storage", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8),
            EnergyProfile("cheap-storage", 1.0, 3.0, 1e-3, 40.0, 0.1, 1e-3, 20.0, 0.1))
TOLERANCE = 1e-9


def output_record_chain(rng: random.Random) -> Chain:
    stages = []
    for i in range(rng.randint(2, 7)):
        out = rng.randint(1, 4)
        stages.append(StageCost(f"s{i}", rng.choice([0.5, 1.0, 2.0]), rng.choice([1.0, 2.0]), out, out,
                                input_saved=False, output_saved=True))
    return Chain(tuple(stages), input_bytes=1, name="output-records")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=100)
    args = parser.parse_args()
    equal = differ = converted = refused = 0
    start = time.perf_counter()
    for seed in range(args.chains):
        rng, profile = random.Random(seed), PROFILES[seed % 2]
        chain = output_record_chain(rng)
        top = simulate(chain, keep_all(chain.length)).peak_bytes
        table = solve_paging(chain, profile, top, slots=1000)   # 1-byte units: exact
        graph = chain_training_graph(chain, profile)
        for budget in range(table.min_memory_bytes, top + 1):
            result = milp(graph, budget, mip_gap=TOLERANCE, read_back_once=True)
            if abs(result.energy_j - table.cost(budget)) <= TOLERANCE * result.energy_j:
                equal += 1
            else:
                differ += 1
                print(f"chain {seed}, budget {budget}: milp {result.energy_j} J, paging-dp {table.cost(budget)} J")
            try:
                stats = simulate(chain, milp_schedule(chain, result), profile)
            except EdgetrainError as exc:
                refused += 1
                print(f"chain {seed}, budget {budget}: not converted: {exc}")
                continue
            ok = stats.peak_bytes <= budget and abs(stats.energy_j - result.energy_j) <= TOLERANCE * result.energy_j
            converted += ok
            refused += not ok
    print(f"{args.chains} chains: paging-dp = milp in {equal} of {equal + differ} (chain, budget) cases; "
          f"milp solutions run as ops at the same energy within the budget: {converted}, not: {refused}; "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
