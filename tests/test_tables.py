"""The founding paper's tables: published values loaded intact, our cells computed and written."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.bench import read_result
from edgetrain.core.chain import Chain
from edgetrain.profiling import estimate_memory
from edgetrain.reports import tables
from edgetrain.reports.tables import (
    PaperValue,
    TableCell,
    paper_accounting_bytes,
    paper_values,
    weights_and_activations_bytes,
)


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
    # Hand-worked: 3 stages of 1000 parameter bytes, a 100-byte input, 250 bytes kept per stage:
    # 3000 + 100 + 750. Gradients (3000) and the 150-byte outputs beyond what is kept are not in it.
    chain = Chain.uniform(3, act_bytes=100, saved_bytes=250, param_bytes=1000)
    assert weights_and_activations_bytes(chain) == 3850
    estimate = estimate_memory("resnet18", 2, 64)
    # ResNet-18 (1000 classes) has 11,689,512 parameters (torchvision's published count): 4 bytes each.
    assert weights_and_activations_bytes(estimate.chain) > 11_689_512 * 4 + 2 * 3 * 64 * 64 * 4
    assert weights_and_activations_bytes(estimate.chain) < estimate.total_bytes  # gradients and momentum on top


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "paper_tables.json"


def _docs_rows() -> dict[tuple[str, int, int, str], TableCell]:
    """The cells of the committed results file of `python -m benchmarks run paper_tables`."""
    result = read_result(RESULTS).result
    cells = [TableCell.from_dict(cell, result["budget_bytes"]) for cell in result["cells"]]
    return {(c.paper.table, c.paper.batch, c.paper.image, c.paper.model): c for c in cells}


def test_the_papers_accounting_reproduces_all_80_cells_within_5_percent() -> None:
    docs = _docs_rows()
    values = paper_values()
    assert len(docs) == len(values) == 80

    for value in values:
        recomputed = paper_accounting_bytes(value.model, value.batch, value.image)
        assert 1.0 <= recomputed / value.bytes <= 1.05, (value, recomputed / value.bytes)
        # the docs' copy is what the command writes
        assert docs[(value.table, value.batch, value.image, value.model)].paper_accounting_bytes == recomputed


def test_the_papers_accounting_is_16_bytes_per_parameter_and_8_per_output_element() -> None:
    one, two = paper_accounting_bytes("resnet18", 1, 224), paper_accounting_bytes("resnet18", 2, 224)
    per_image = two - one
    # ResNet-18 has 11,689,512 parameters (torchvision's count); its leaf outputs for one 224-px image,
    # in-place ReLUs counted again, are per_image / 8 elements.
    assert one - per_image == 16 * 11_689_512
    assert per_image % 8 == 0
    # The stem alone: conv1, bn1 and relu at 64 x 112 x 112 and the max-pool at 64 x 56 x 56 are part of it.
    assert per_image // 8 > 3 * 64 * 112 * 112 + 64 * 56 * 56


def _cell(model: str, batch: int, image: int, paper_mib: float, accounting_mib: float, ours_mib: float) -> TableCell:
    value = PaperValue("I", batch, image, model, paper_mib, "MB")
    return TableCell(paper=value, paper_accounting_bytes=int(accounting_mib * 2**20),
                     training_peak_bytes=int(ours_mib * 2**20), weights_activations_bytes=0, budget_bytes=2 * 2**30)


def test_claims_are_judged_by_each_accounting() -> None:
    # Every claim's cells, fitting 2 GiB (2048 MiB) under "ours" only, except ResNet-152 at batch 3.
    keys = [(m, 1, 224) for m in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")] + \
        [(m, 1, 1500) for m in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")] + \
        [("resnet152", 3, 224), ("resnet18", 50, 224), ("resnet101", 8, 224), ("resnet152", 8, 224)]
    cells = [_cell(m, b, i, 100 if i == 224 and b == 1 else 3000, 100 if i == 224 and b == 1 else 3000,
                   3000 if (m, b) == ("resnet152", 3) else 1000) for m, b, i in keys]

    verdicts = {claim.test: (paper, accounting, ours)
                for claim, paper, accounting, ours in tables.claim_verdicts(cells)}

    assert len(verdicts) == len(tables.CLAIMS) == 5
    assert verdicts["all five fit at batch 1, 224 px"] == (True, True, True)
    assert verdicts["ResNet-152 does not fit at batch 3, 224 px"] == (True, True, True)
    assert verdicts["ResNet-18 does not fit at Table I's largest batch, 50"] == (True, True, False)
    assert verdicts["at batch 1 and 1500 px none of the five fits"] == (True, True, False)
    assert verdicts["at batch 8 and 224 px ResNet-101 and ResNet-152 do not fit"] == (True, True, False)


@pytest.mark.slow
def test_reproduce_writes_markdown_and_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the test fast: only the ResNet-18 column of every table (the claims, which need every model, are left out).
    monkeypatch.setattr(tables, "paper_values", lambda: [v for v in paper_values() if v.model == "resnet18"])
    cells = tables.reproduce_tables(tmp_path, budget_bytes=2 * 2**30)
    assert len(cells) == 16
    text = (tmp_path / "tables.md").read_text()
    assert "Table I" in text and "Table III" in text and "MiB/image" in text and "paper's accounting" in text
    rows = (tmp_path / "tables.csv").read_text().splitlines()
    assert len(rows) == 17 and rows[0].startswith("table,batch,image,model,paper_value")
    # The committed results hold what the command computes, the real training step's peak included.
    docs = _docs_rows()
    for cell in cells:
        assert docs[(cell.paper.table, cell.paper.batch, cell.paper.image, cell.paper.model)] == cell
    big = next(c for c in cells if c.paper.table == "I" and c.paper.batch == 50)
    small = next(c for c in cells if c.paper.table == "I" and c.paper.batch == 1)
    # The paper's Table I, ResNet-18: 230.05 MB at batch 1, MB read as MiB (docs/concepts/memory.md).
    assert small.paper.bytes == 230.05 * 2**20
    # A real step needs less than the paper says even with gradients and momentum: ResNet-18 at batch 50
    # fits 2 GiB, which the paper's 2925 MB and its accounting deny.
    assert big.fits and not big.paper_fits and not big.accounting_fits
    assert all(c.training_peak_bytes > 3 * 11_689_512 * 4 for c in cells)
