"""The founding paper's Tables I-III three ways: the published value, the paper's accounting recomputed, a real step.

Kukreja et al., *Training on the Edge: The why and the how* (PAISE 2019), give the memory of ResNet-18..152 by batch
and image size against a 2 GB node. Each cell is recomputed from layer shapes by the paper's own rule (NOTE [ The
paper's accounting ] in ``edgetrain/reports/tables.py``) and estimated as the peak of a real PyTorch training step;
the paper's claims are judged by each (:func:`edgetrain.reports.tables.table_cells`). The same tables as
``edgetrain reproduce tables``.
"""

from __future__ import annotations

from typing import Any

from edgetrain.devices import get_device
from edgetrain.reports.tables import TableCell, paper_values, table_cells, tables_markdown

TITLE = "The paper's Tables I-III"
DEVICE = "odroid-xu4"   # the paper's 2 GB node


def run(quick: bool) -> dict[str, Any]:
    """Every cell (quick: Table I's batches up to 10, the cheap estimates), judged against the node's memory."""
    budget_bytes = get_device(DEVICE).memory_bytes
    assert budget_bytes is not None
    values = [v for v in paper_values() if v.table == "I" and v.batch <= 10] if quick else None
    return {"device": DEVICE, "budget_bytes": budget_bytes,
            "cells": [cell.to_dict() for cell in table_cells(budget_bytes, values)]}


def cells_of(result: dict[str, Any]) -> list[TableCell]:
    return [TableCell.from_dict(cell, result["budget_bytes"]) for cell in result["cells"]]


def render(result: dict[str, Any]) -> str:
    return tables_markdown(cells_of(result))


def headline(result: dict[str, Any]) -> str:
    """The README's figure: the accounting's and a real step's range over the published cells."""
    cells = cells_of(result)
    accounting, step = [c.accounting_ratio for c in cells], [c.ratio for c in cells]
    return (f"the paper's accounting is {min(accounting):.3f}-{max(accounting):.3f} of all {len(cells)} published "
            f"cells; a real PyTorch step needs {min(step):.2f}-{max(step):.2f} of them")
