"""The founding paper's tables: published values loaded intact, our cells computed and written."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.profile import estimate_memory
from edgetrain.reports import tables
from edgetrain.reports.tables import paper_values, weights_and_activations_bytes


def test_paper_values_are_the_published_tables() -> None:
    values = paper_values()
    assert len(values) == 30 + 30 + 20
    lookup = {(v.table, v.row, v.model): v.value for v in values}
    assert lookup[("I", 1, "resnet18")] == 230.05
    assert lookup[("I", 50, "resnet152")] == 25776.48
    assert lookup[("II", 1500, "resnet50")] == 10944.42
    assert lookup[("III", 650, "resnet101")] == 24.13
    # Table I batch 1 and Table II 224 px are the same configuration.
    assert all(lookup[("I", 1, m)] == lookup[("II", 224, m)] for m in ("resnet18", "resnet152"))


def test_weights_and_activations_is_weights_input_and_saved() -> None:
    estimate = estimate_memory("resnet18", 2, 64)
    chain = estimate.chain
    expected = chain.weights_bytes + chain.input_bytes + sum(s.saved_bytes for s in chain.stages)
    assert weights_and_activations_bytes(chain) == expected
    assert expected < estimate.total_bytes  # gradients and momentum come on top


def test_reproduce_writes_markdown_and_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the test fast: only the ResNet-18 column of every table.
    monkeypatch.setattr(tables, "paper_values", lambda: [v for v in paper_values() if v.model == "resnet18"])
    cells = tables.reproduce_tables(tmp_path, budget_bytes=2 * 2**30)
    assert len(cells) == 16
    text = (tmp_path / "tables.md").read_text()
    assert "Table I" in text and "Table III" in text and "MiB/image" in text
    rows = (tmp_path / "tables.csv").read_text().splitlines()
    assert len(rows) == 17 and rows[0].startswith("table,batch,image,model,paper_value")
    for cell in cells:
        assert cell.ratio == cell.weights_activations_bytes / cell.paper.bytes
        assert cell.fits == (cell.training_peak_bytes <= 2 * 2**30)
    big = next(c for c in cells if c.paper.table == "I" and c.paper.batch == 50)
    small = next(c for c in cells if c.paper.table == "I" and c.paper.batch == 1)
    assert big.weights_activations_bytes > small.weights_activations_bytes
