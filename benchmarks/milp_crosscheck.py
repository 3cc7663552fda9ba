"""paging-dp against POET's MILP on random chains where their cost models coincide, and MILP → ops.

Chains whose records hold only their output (``saved_bytes == out_bytes``, input not kept, no
gradients, no workspace), 2-7 stages of 1-4 bytes, alternately on two storage profiles. For every
budget from paging-dp's least to keep-all's peak: the MILP (HiGHS, gap 1e-9, a page-in consumes
the flash copy as the executor's does) against paging-dp's exact table, and the MILP's solution
converted to executor ops (:func:`edgetrain.planners.milp.ops.milp_schedule`) replayed by the
simulator (peak within the budget, energy equal to the MILP's).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from edgetrain import Chain
from edgetrain.core.chain import StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import EdgetrainError
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.milp.ops import milp_schedule
from edgetrain.planners.milp.solve import chain_training_graph, milp

log = logging.getLogger("milp_crosscheck")

TITLE = "paging-dp against POET's MILP"
CHAINS = 100        # random chains of the full run (seeds 0..CHAINS-1)
QUICK_CHAINS = 12   # the quick run's: its first chains, so its cases are a subset of the full run's
PROFILES = (EnergyProfile("slow-storage", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8),
            EnergyProfile("cheap-storage", 1.0, 3.0, 1e-3, 40.0, 0.1, 1e-3, 20.0, 0.1))
TOLERANCE = 1e-9


def output_record_chain(rng: random.Random) -> Chain:
    """A chain of 2-7 stages whose records hold only their output: the case where both cost models coincide."""
    stages = []
    for i in range(rng.randint(2, 7)):
        out = rng.randint(1, 4)
        stages.append(StageCost(f"s{i}", rng.choice([0.5, 1.0, 2.0]), rng.choice([1.0, 2.0]), out, out,
                                input_saved=False, output_saved=True))
    return Chain(tuple(stages), input_bytes=1, name="output-records")


def run(quick: bool) -> dict[str, Any]:
    """Every (chain, budget) case: equal energies, converted solutions, and each mismatch or refusal named."""
    chains = QUICK_CHAINS if quick else CHAINS
    equal = converted = 0
    differ: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    start = time.perf_counter()
    for seed in range(chains):
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
                differ.append({"chain": seed, "budget_bytes": budget, "milp_j": result.energy_j,
                               "paging_dp_j": table.cost(budget)})
            try:
                stats = simulate(chain, milp_schedule(chain, result), profile)
            except EdgetrainError as exc:
                refused.append({"chain": seed, "budget_bytes": budget, "why": str(exc)})
                continue
            if stats.peak_bytes <= budget and abs(stats.energy_j - result.energy_j) <= TOLERANCE * result.energy_j:
                converted += 1
            else:
                refused.append({"chain": seed, "budget_bytes": budget,
                                "why": f"ops peak {stats.peak_bytes} B, energy {stats.energy_j} J against the "
                                       f"MILP's {result.energy_j} J"})
        log.info("chain %d/%d done", seed + 1, chains)
    return {"chains": chains, "tolerance": TOLERANCE, "profiles": [p.device_name for p in PROFILES],
            "cases": equal + len(differ), "equal": equal, "differ": differ, "converted": converted,
            "not_converted": refused, "seconds": time.perf_counter() - start}


def render(result: dict[str, Any]) -> str:
    """The counts, then every mismatch and every solution the ops could not run."""
    lines = [
        "On chains whose records hold only their output (no input kept, no gradients, no workspace) the cost models "
        "of `paging-dp` and POET's MILP coincide. Over random chains of 2-7 stages of 1-4 bytes, alternately on "
        f"two storage profiles ({', '.join(result['profiles'])}), and every budget from `paging-dp`'s least to "
        f"keep-all's peak, the MILP (HiGHS, `read_back_once=True`, gap {result['tolerance']:g}) is set against "
        "`paging-dp`'s exact table (1-byte units), and each MILP solution is turned into executor ops "
        "(`milp_schedule`) and replayed by the simulator.",
        "",
        "| chains | (chain, budget) cases | same energy | solutions run as ops within the budget at the MILP's "
        "energy | not | seconds |",
        "|---|---|---|---|---|---|",
        f"| {result['chains']} | {result['cases']} | {result['equal']} | {result['converted']} | "
        f"{len(result['not_converted'])} | {result['seconds']:.1f} |",
    ]
    if result["differ"]:
        lines += ["", "Cases where the energies differ:", "", "| chain | budget (B) | MILP (J) | paging-dp (J) |",
                  "|---|---|---|---|"]
        lines += [f"| {d['chain']} | {d['budget_bytes']} | {d['milp_j']:.9g} | {d['paging_dp_j']:.9g} |"
                  for d in result["differ"]]
    if result["not_converted"]:
        lines += ["", "Solutions the ops did not run as the MILP planned:", ""]
        lines += [f"* chain {r['chain']}, budget {r['budget_bytes']} B: {r['why']}" for r in result["not_converted"]]
    return "\n".join(lines)


def headline(result: dict[str, Any]) -> str:
    """The README's figure: in how many cases the two reach the same energy."""
    same = "all" if result["equal"] == result["cases"] else f"{result['equal']} of"
    return f"{same} {result['cases']} cases of {result['chains']} random chains"
