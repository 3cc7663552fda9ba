"""Tables I-III of the founding paper: the published value, the paper's accounting recomputed, ours.

Kukreja et al. (PAISE 2019) give the memory "to keep all weights and activations" of
ResNet-18..152 by batch (224 px) and by image size (batch 1 and 8). Their MB and GB are read
as MiB and GiB: Table III's 2.22 GB for ResNet-50 at batch 8 is Table I's batch-5/10 line
interpolated at batch 8 (2268 MB) divided by 1024, not by 1000.

NOTE [ The paper's accounting ]
The paper does not say how it counted. One rule recomputes all 80 of its cells from layer
shapes within 1-5% (always above): **16 bytes per parameter plus 8 bytes per element of every
layer's output**, where "layer" is every leaf module (each convolution, BatchNorm, ReLU,
pooling and the classifier) and an in-place ReLU's output is counted again although it shares
its input's storage; the residual additions and the input batch are not counted
(:func:`paper_accounting_bytes`). Read in FP32, that is weights, gradients and two more
parameter-sized buffers, plus each output and its gradient; read in FP64, weights, gradients
and outputs. Either way it is not what a PyTorch training step holds: autograd keeps one
storage for an in-place ReLU and its input, frees what backward no longer needs and saves only
what each op's backward reads. "Ours" is that step (:func:`edgetrain.profiling.estimate_memory`:
weights, gradients, SGD momentum, the batch, saved activations, activation gradients and
workspace at the step's peak), within 1% of live bytes measured on real steps.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.chain import Chain
from ..profiling.estimate import estimate_memory
from ..sysutil.fileio import write_atomic
from ..units import format_bytes

if TYPE_CHECKING:
    import torch

__all__ = ["PaperValue", "TableCell", "Claim", "CLAIMS", "claim_verdicts", "paper_values", "paper_accounting_bytes",
           "weights_and_activations_bytes", "table_cells", "reproduce_tables", "tables_markdown", "TABLE_TITLES"]

PAPER_BYTES_PER_PARAMETER = 16
PAPER_BYTES_PER_OUTPUT_ELEMENT = 8

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
    """One cell: the paper's figure, the paper's accounting recomputed, and our whole training step.

    ``weights_activations_bytes`` is our estimate of the paper's stated quantity (weights, the
    input and what autograd keeps), for the line fit that shows where the two differ.
    """

    paper: PaperValue
    paper_accounting_bytes: int
    training_peak_bytes: int
    weights_activations_bytes: int
    budget_bytes: int

    @property
    def accounting_ratio(self) -> float:
        """The paper's accounting, recomputed, over the published value."""
        return self.paper_accounting_bytes / self.paper.bytes

    @property
    def ratio(self) -> float:
        """Our training step's peak over the published value."""
        return self.training_peak_bytes / self.paper.bytes

    @property
    def fits(self) -> bool:
        """Whether a whole training step (weights, gradients, momentum, activations) fits the budget."""
        return self.training_peak_bytes <= self.budget_bytes

    @property
    def accounting_fits(self) -> bool:
        return self.paper_accounting_bytes <= self.budget_bytes

    @property
    def paper_fits(self) -> bool:
        return self.paper.bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, str | int | float]:
        """The cell as plain data (its budget apart: every cell of a run shares it)."""
        paper = self.paper
        return {"table": paper.table, "batch": paper.batch, "image": paper.image, "model": paper.model,
                "value": paper.value, "unit": paper.unit, "paper_accounting_bytes": self.paper_accounting_bytes,
                "training_peak_bytes": self.training_peak_bytes,
                "weights_activations_bytes": self.weights_activations_bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any], budget_bytes: int) -> TableCell:
        """The cell :meth:`to_dict` wrote, judged against ``budget_bytes``."""
        paper = PaperValue(data["table"], data["batch"], data["image"], data["model"], data["value"], data["unit"])
        return cls(paper=paper, paper_accounting_bytes=data["paper_accounting_bytes"],
                   training_peak_bytes=data["training_peak_bytes"],
                   weights_activations_bytes=data["weights_activations_bytes"], budget_bytes=budget_bytes)


Verdicts = Callable[[str, int, int], bool]   # (model, batch, image) -> fits the budget


@dataclass(frozen=True)
class Claim:
    """A sentence of the paper's Section III and the fit verdicts that make it true."""

    text: str
    test: str
    holds: Callable[[Verdicts], bool]


_ALL = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
CLAIMS = (
    Claim("Table I: all models fit in 2GB memory (batch 1, 224 px)",
          "all five fit at batch 1, 224 px", lambda fits: all(fits(m, 1, 224) for m in _ALL)),
    Claim("increasing the batch size to 3 makes it impossible to keep ResNet152 in memory",
          "ResNet-152 does not fit at batch 3, 224 px", lambda fits: not fits("resnet152", 3, 224)),
    Claim("further increase makes even the smallest models require more than 2GB",
          "ResNet-18 does not fit at Table I's largest batch, 50", lambda fits: not fits("resnet18", 50, 224)),
    Claim("problems with memory could also emerge for images with higher resolution ... even for the smallest "
          "batch_size", "at batch 1 and 1500 px none of the five fits",
          lambda fits: not any(fits(m, 1, 1500) for m in _ALL)),
    Claim("for batch_size = 8 ... one cannot use a neural network with more than 50 layers even for the smallest "
          "possible image size", "at batch 8 and 224 px ResNet-101 and ResNet-152 do not fit",
          lambda fits: not fits("resnet101", 8, 224) and not fits("resnet152", 8, 224)),
)


def paper_values() -> list[PaperValue]:
    text = resources.files("edgetrain.reports").joinpath("paper_tables.csv").read_text()
    rows = csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#"))
    return [PaperValue(table=r["table"], batch=int(r["batch"]), image=int(r["image"]), model=r["model"],
                       value=float(r["value"]), unit=r["unit"]) for r in rows]


def weights_and_activations_bytes(chain: Chain) -> int:
    """The paper's quantity: weights, the input and everything a full forward keeps for backward."""
    return chain.weights_bytes + chain.input_bytes + sum(stage.saved_bytes for stage in chain.stages)


def paper_accounting_bytes(model: str, batch: int, image: int) -> int:
    """The paper's accounting (NOTE [ The paper's accounting ]) from the model's layer shapes.

    ``16 * parameters + 8 * batch * (elements of every leaf module's output for one image)``,
    from a forward pass on the meta device (no memory is allocated).

    Example:
        >>> paper_accounting_bytes("resnet18", 1, 224) / 2**20  # the paper: 230.05 MB  # doctest: +SKIP
        235.3...
    """
    parameters, elements = _layer_counts(model, image)
    return PAPER_BYTES_PER_PARAMETER * parameters + PAPER_BYTES_PER_OUTPUT_ELEMENT * batch * elements


@functools.lru_cache(maxsize=64)
def _layer_counts(model: str, image: int) -> tuple[int, int]:
    """Parameters, and elements of every leaf module's output for one image (in-place outputs again)."""
    import torch

    from ..models import get_model_spec

    spec = get_model_spec(model)
    net = _meta_model(model)
    elements = [0]

    def count(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        elements[0] += output.numel()

    hooks = [module.register_forward_hook(count) for module in net.modules() if next(module.children(), None) is None]
    try:
        with torch.no_grad():
            net(spec.example_input(1, image).to("meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return sum(p.numel() for p in net.parameters()), elements[0]


@functools.lru_cache(maxsize=8)
def _meta_model(model: str) -> torch.nn.Module:
    import torch

    from ..models import get_model_spec

    with torch.device("meta"):
        net = get_model_spec(model).build()
    return net.eval()  # same output shapes; BatchNorm's meta kernel is twice as fast without running statistics


def table_cells(budget_bytes: int, values: list[PaperValue] | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[TableCell]:
    """Every cell of ``values`` (default: all 80 of Tables I-III) three ways, fit verdicts against ``budget_bytes``."""
    values = paper_values() if values is None else values
    cache: dict[tuple[str, int, int], tuple[int, int, int]] = {}
    cells = []
    for index, value in enumerate(values):
        key = (value.model, value.batch, value.image)
        if key not in cache:
            estimate = estimate_memory(value.model, value.batch, value.image)
            cache[key] = (paper_accounting_bytes(*key), estimate.total_bytes,
                          weights_and_activations_bytes(estimate.chain))
        accounting, peak, weights_activations = cache[key]
        cells.append(TableCell(paper=value, paper_accounting_bytes=accounting, training_peak_bytes=peak,
                               weights_activations_bytes=weights_activations, budget_bytes=budget_bytes))
        if progress is not None:
            progress(index + 1, len(values))
    return cells


def reproduce_tables(out_dir: str | Path, budget_bytes: int,
                     progress: Callable[[int, int], None] | None = None) -> list[TableCell]:
    """Every cell of Tables I-III three ways; write ``tables.md`` and ``tables.csv`` under ``out_dir``."""
    cells = table_cells(budget_bytes, progress=progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "tables.csv", _to_csv(cells))
    write_atomic(out / "tables.md", "# Founding-paper memory tables, regenerated\n\n" + tables_markdown(cells))
    return cells


def claim_verdicts(cells: list[TableCell]) -> list[tuple[Claim, bool, bool, bool]]:
    """Each claim of :data:`CLAIMS` judged by the paper's numbers, its accounting recomputed, and ours."""
    by_key = {(c.paper.model, c.paper.batch, c.paper.image): c for c in cells}

    def judge(fits: Callable[[TableCell], bool]) -> Verdicts:
        return lambda model, batch, image: fits(by_key[(model, batch, image)])

    return [(claim, claim.holds(judge(lambda c: c.paper_fits)), claim.holds(judge(lambda c: c.accounting_fits)),
             claim.holds(judge(lambda c: c.fits))) for claim in CLAIMS]


def _to_csv(cells: list[TableCell]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["table", "batch", "image", "model", "paper_value", "paper_unit", "paper_bytes",
                     "paper_accounting_bytes", "accounting_ratio", "ours_training_peak_bytes", "ours_ratio",
                     "ours_weights_activations_bytes", "paper_fits", "accounting_fits", "ours_fits", "budget_bytes"])
    for c in cells:
        writer.writerow([c.paper.table, c.paper.batch, c.paper.image, c.paper.model, c.paper.value, c.paper.unit,
                         int(c.paper.bytes), c.paper_accounting_bytes, f"{c.accounting_ratio:.4f}",
                         c.training_peak_bytes, f"{c.ratio:.4f}", c.weights_activations_bytes, c.paper_fits,
                         c.accounting_fits, c.fits, c.budget_bytes])
    return buffer.getvalue()


def _batch_fit_lines(cells: list[TableCell]) -> list[str]:
    """Where the difference comes from: Table I is linear in the batch, so fit intercept and slope.

    The intercept is the batch-independent part (weights and what else the paper counted), the
    slope the activation memory of one image.
    """
    lines = ["## Where the difference comes from (least-squares fit of Table I over the batch)", "",
             "Ours here is the paper's stated quantity as autograd holds it: weights, the input and what a full",
             "forward keeps for backward.", "",
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


def _mark(fits: bool) -> str:
    return "" if fits else " ✗"


def tables_markdown(cells: list[TableCell]) -> str:
    """The tables, their ratios, the paper's claims judged three ways and the line fit, as markdown (no title)."""
    budget_bytes = cells[0].budget_bytes
    lines = [
        "Each cell: **paper** (the published value) / **paper's accounting** recomputed from layer shapes",
        "(16 B per parameter + 8 B per element of every layer's output, in-place outputs counted again;",
        "NOTE [ The paper's accounting ] in `edgetrain/reports/tables.py`) / **ours**, the peak of a real PyTorch",
        "training step (weights, gradients, SGD momentum, batch, saved activations, gradients, workspace).",
        f"✗ marks a figure above {format_bytes(budget_bytes)}. Units as in the paper, read as MiB/GiB.",
        "Regenerate with `edgetrain reproduce tables`.",
        "",
    ]
    for table, title in TABLE_TITLES.items():
        rows = [c for c in cells if c.paper.table == table]
        if not rows:
            continue
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
                cols.append(f"{c.paper.value:.2f}{_mark(c.paper_fits)} / "
                            f"{c.paper_accounting_bytes / unit:.2f}{_mark(c.accounting_fits)} / "
                            f"{c.training_peak_bytes / unit:.2f}{_mark(c.fits)}")
            lines.append(f"| {key} | " + " | ".join(cols) + " |")
        lines.append("")
    accounting = [c.accounting_ratio for c in cells]
    ours = [c.ratio for c in cells]
    lines.append(f"Over all {len(cells)} cells, the paper's accounting recomputed is {min(accounting):.3f}-"
                 f"{max(accounting):.3f} of the published value, ours {min(ours):.2f}-{max(ours):.2f}.")
    disagree = sum(c.paper_fits != c.fits for c in cells)
    lines.append(f"Fit verdicts against {format_bytes(budget_bytes)}: the paper's and ours disagree in {disagree} "
                 f"cells, the paper's and its accounting recomputed in "
                 f"{sum(c.paper_fits != c.accounting_fits for c in cells)}.")
    if {key for key in _CLAIM_CELLS} <= {(c.paper.model, c.paper.batch, c.paper.image) for c in cells}:
        lines += ["", "## The paper's claims (Section III)", "",
                  "| claim | tested as | paper's numbers | paper's accounting | ours |", "|---|---|---|---|---|"]
        for claim, paper, accounting_holds, ours_holds in claim_verdicts(cells):
            lines.append(f"| {claim.text} | {claim.test} | {_verdict(paper)} | {_verdict(accounting_holds)} "
                         f"| {_verdict(ours_holds)} |")
        lines += ["", *_claim_numbers(cells)]
    lines += ["", *_batch_fit_lines(cells)]
    return "\n".join(lines) + "\n"


# Every cell a claim reads; the last five are the ones that decide them.
_CLAIM_CELLS = (*((m, 1, 224) for m in _ALL), *((m, 1, 1500) for m in _ALL[1:]),
                ("resnet152", 3, 224), ("resnet18", 50, 224), ("resnet18", 1, 1500), ("resnet101", 8, 224),
                ("resnet152", 8, 224))


def _verdict(holds: bool) -> str:
    return "confirmed" if holds else "refuted"


def _claim_numbers(cells: list[TableCell]) -> list[str]:
    """The cells the claims rest on, in MiB, paper / its accounting / ours."""
    by_key = {(c.paper.model, c.paper.batch, c.paper.image): c for c in cells}
    lines = ["Cells the claims rest on (MiB, paper / paper's accounting / ours):", ""]
    for model, batch, image in _CLAIM_CELLS[-5:]:
        c = by_key[(model, batch, image)]
        lines.append(f"- {model}, batch {batch}, {image} px: {c.paper.bytes / 2**20:.0f} / "
                     f"{c.paper_accounting_bytes / 2**20:.0f} / {c.training_peak_bytes / 2**20:.0f}")
    return lines
