"""POET's MILP at POET's own model size: ResNet-18's operator graph (batch 8, 224 px, ``rpi4``) under variants of its
cost model and options, each solved repeatedly, with the energies and solve times docs/concepts/milp.md gives.

The variants (:data:`edgetrain.planners.milp.variants.ALL_VARIANTS`): budgets of the resident state plus 100%, 75% and
60% of keep-all's activations; paging against none (Checkmate's energy-weighted MILP) and POET's any-stage page-out;
with and without an assumed 2 GB/s memory-traffic floor per node, so that no recomputation is free.
"""

from __future__ import annotations

from typing import Any

from edgetrain.planners.milp.variants import ALL_VARIANTS, BASE_VARIANTS, operator_milp_times, variants_table

TITLE = "POET's MILP on ResNet-18's operator graph"
TIME_LIMIT_S, QUICK_TIME_LIMIT_S = 60.0, 10.0   # HiGHS seconds per solve
REPEATS, QUICK_REPEATS = 3, 1                   # solves per variant


def run(quick: bool) -> dict[str, Any]:
    """Every variant (the quick run: the largest budget alone, one solve), ``REPEATS`` solves each."""
    limit = QUICK_TIME_LIMIT_S if quick else TIME_LIMIT_S
    rows = operator_milp_times(limit, QUICK_REPEATS if quick else REPEATS,
                               BASE_VARIANTS[:1] if quick else ALL_VARIANTS)
    return {"time_limit_s": limit, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """The graph's size, then one row per variant."""
    first = result["rows"][0]
    return (f"ResNet-18's operator graph at batch 8, 224 px, on `rpi4`: {first['nodes']} nodes, "
            f"{first['variables']} columns and {first['constraints']} rows with paging. Budgets are `resident + f x "
            f"(keep-all - resident)`. HiGHS's time limit is {result['time_limit_s']:g} s, `mip_gap=1e-4` unless "
            "stated; wall-clock solve times with their spread over the repeated solves.\n\n"
            + variants_table(result["rows"]))
