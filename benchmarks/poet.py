"""POET's claim and results, re-run: energy against the memory budget, and POET's published points beside ours.

Patil et al., *POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization and Paging* (ICML
2022), claim that paging with recomputation keeps a step's energy within 1% of the unconstrained step down to about
half the memory. Every model x device panel sweeps budgets from keep-all's peak down to the least feasible one under
paging-dp, recompute-only and capuchin (:func:`edgetrain.reports.poet.reproduce_poet`); every device of the report has
a training rate measured on the board, so the result is the same on every machine. The same report as
``edgetrain reproduce poet``, which also plots energy against the budget.
"""

from __future__ import annotations

import tempfile
from typing import Any

from edgetrain.reports.poet import poet_markdown, reproduce_poet

TITLE = "POET, point by point"
BUDGETS, QUICK_BUDGETS = 12, 4   # per panel, keep-all's peak down to the least feasible


def run(quick: bool) -> dict[str, Any]:
    """The report's data: every panel's points, the claim's verdicts, POET's results and the runtime sweep."""
    with tempfile.TemporaryDirectory(prefix="edgetrain-poet-") as out:
        return dict(reproduce_poet(out, budgets=QUICK_BUDGETS if quick else BUDGETS).data)


def render(result: dict[str, Any]) -> str:
    return poet_markdown(result)
