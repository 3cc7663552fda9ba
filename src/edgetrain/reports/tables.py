"""Tables I-III of the founding paper, regenerated from our estimator beside the published values.

Kukreja et al. (PAISE 2019) give the memory "to keep all weights and activations" of
ResNet-18..152 by batch (224 px) and by image size (batch 1 and 8). Their MB and GB are read
as MiB and GiB: Table III's 2.22 GB for ResNet-50 at batch 8 is Table I's batch-5/10 line
interpolated at batch 8 (2268 MB) divided by 1024, not by 1000.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..chain import Chain
from ..fileio import write_atomic
from ..profile.estimate import estimate_memory
from ..units import format_bytes

__all__ = ["PaperValue", "TableCell", "paper_values", "weights_and_activations_bytes", "reproduce_tables",
           "TABLE_TITLES"]

_UNIT_BYTES = {"MB": 2**20, "GB": 2**30}
TABLE_TITLES = {
    "I": "Table I: batch size vs model, 224x224 images (MB)",
    "II": "Table II: image size vs model, batch 1 (MB)",
    "III": "Table III: image size vs model, batch 8 (GB)",
}


@dataclass(frozen=True)
class PaperValue:
    table: str
    batch: int
    image: int
    model: str
    value: float
    unit: str

    @property
    def row(self) -> int:
        return self.batch if self.table == "I" else self.image

    @property
    def bytes(self) -> float:
        return self.value * _UNIT_BYTES[self.unit]


@dataclass(frozen=True)
class TableCell:
    """One cell: the paper's figure, our same-definition estimate and our whole training peak."""

    paper: PaperValue
    weights_activations_bytes: int
    training_peak_bytes: int
    budget_bytes: int

    @property
    def ratio(self) -> float:
        return self.weights_activations_bytes / self.paper.bytes

    @property
    def fits(self) -> bool:
        """Whether a whole training step (weights, gradients, momentum, activations) fits the budget."""
        return self.training_peak_bytes <= self.budget_bytes

    @property
    def paper_fits(self) -> bool:
        return self.paper.bytes <= self.budget_bytes


def paper_values() -> list[PaperValue]:
    text = resources.files("edgetrain.reports").joinpath("paper_tables.csv").read_text()
    rows = csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#"))
    return [PaperValue(table=r["table"], batch=int(r["batch"]), image=int(r["image"]), model=r["model"],
                       value=float(r["value"]), unit=r["unit"]) for r in rows]


def weights_and_activations_bytes(chain: Chain) -> int:
    """The paper's quantity: weights, the input and everything a full forward keeps for backward."""
    return chain.weights_bytes + chain.input_bytes + sum(stage.saved_bytes for stage in chain.stages)


def reproduce_tables(out_dir: str | Path, budget_bytes: int,
                     progress: Callable[[int, int], None] | None = None) -> list[TableCell]:
    """Estimate every cell of Tables I-III, write ``tables.md`` and ``tables.csv`` under ``out_dir``."""
    values = paper_values()
    cache: dict[tuple[str, int, int], tuple[int, int]] = {}
    cells = []
    for index, value in enumerate(values):
        key = (value.model, value.batch, value.image)
        if key not in cache:
            estimate = estimate_memory(value.model, value.batch, value.image)
            cache[key] = (weights_and_activations_bytes(estimate.chain), estimate.total_bytes)
        ours, peak = cache[key]
        cells.append(TableCell(paper=value, weights_activations_bytes=ours, training_peak_bytes=peak,
                               budget_bytes=budget_bytes))
        if progress is not None:
            progress(index + 1, len(values))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "tables.csv", _to_csv(cells))
    write_atomic(out / "tables.md", _to_markdown(cells, budget_bytes))
    return cells


def _to_csv(cells: list[TableCell]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["table", "batch", "image", "model", "paper_value", "paper_unit", "paper_bytes",
                     "ours_weights_activations_bytes", "ratio", "ours_training_peak_bytes", "fits_budget",
                     "budget_bytes"])
    for c in cells:
        writer.writerow([c.paper.table, c.paper.batch, c.paper.image, c.paper.model, c.paper.value, c.paper.unit,
                         int(c.paper.bytes), c.weights_activations_bytes, f"{c.ratio:.4f}", c.training_peak_bytes,
                         c.fits, c.budget_bytes])
    return buffer.getvalue()


def _batch_fit_lines(cells: list[TableCell]) -> list[str]:
    """Where the difference comes from: Table I is linear in the batch, so fit intercept and slope.

    The intercept is the batch-independent part (weights and what else the paper counted), the
    slope the activation memory of one image.
    """
    lines = ["## Where the difference comes from (least-squares fit of Table I over the batch)", "",
             "| model | paper intercept | ours intercept | paper MiB/image | ours MiB/image | slope ratio |",
             "|---|---|---|---|---|---|"]
    table_one = [c for c in cells if c.paper.table == "I"]
    for model in dict.fromkeys(c.paper.model for c in table_one):
        rows = [c for c in table_one if c.paper.model == model]
        batches = [float(c.paper.batch) for c in rows]
        paper_fit = _line_fit(batches, [c.paper.bytes / 2**20 for c in rows])
        ours_fit = _line_fit(batches, [c.weights_activations_bytes / 2**20 for c in rows])
        lines.append(f"| {model} | {paper_fit[0]:.1f} | {ours_fit[0]:.1f} | {paper_fit[1]:.2f} | {ours_fit[1]:.2f} "
                     f"| {paper_fit[1] / ours_fit[1]:.2f} |")
    return lines


def _line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope of the least-squares line through the points."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def _to_markdown(cells: list[TableCell], budget_bytes: int) -> str:
    lines = [
        "# Founding-paper memory tables, regenerated",
        "",
        "Each cell: **ours** (weights + input + everything a full forward keeps for backward, the paper's",
        "definition) / paper's published value (ratio ours/paper). Units as in the paper, read as MiB/GiB.",
        f"A cell marked ✗ does not fit {format_bytes(budget_bytes)} once a whole training step is counted",
        "(weights, gradients, SGD momentum, activations and workspace); the second block of each table",
        "gives that training peak. Regenerate with `edgetrain reproduce tables`.",
        "",
    ]
    for table, title in TABLE_TITLES.items():
        rows = [c for c in cells if c.paper.table == table]
        models = list(dict.fromkeys(c.paper.model for c in rows))
        keys = list(dict.fromkeys(c.paper.row for c in rows))
        unit = _UNIT_BYTES[rows[0].paper.unit]
        row_name = "batch" if table == "I" else "image"
        by_key = {(c.paper.row, c.paper.model): c for c in rows}
        lines += [f"## {title}", "", f"| {row_name} | " + " | ".join(models) + " |",
                  "|---" * (len(models) + 1) + "|"]
        for key in keys:
            cols = []
            for model in models:
                c = by_key[(key, model)]
                mark = "" if c.fits else " ✗"
                cols.append(f"{c.weights_activations_bytes / unit:.2f} / {c.paper.value:g} ({c.ratio:.2f}){mark}")
            lines.append(f"| {key} | " + " | ".join(cols) + " |")
        lines += ["", f"Whole training step peak ({rows[0].paper.unit}):", "",
                  f"| {row_name} | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
        for key in keys:
            cols = [f"{by_key[(key, m)].training_peak_bytes / unit:.2f}{'' if by_key[(key, m)].fits else ' ✗'}"
                    for m in models]
            lines.append(f"| {key} | " + " | ".join(cols) + " |")
        lines.append("")
    ratios = [c.ratio for c in cells]
    lines.append(f"Ratio ours/paper over all {len(cells)} cells: min {min(ratios):.2f}, max {max(ratios):.2f}.")
    lines += ["", *_batch_fit_lines(cells)]
    return "\n".join(lines) + "\n"

