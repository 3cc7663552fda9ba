"""Figure 1 of the founding paper: peak memory against the recompute factor ρ, and its claim.

Kukreja et al. (PAISE 2019, §VI, Fig. 1) plot, for LinearResNet-18..152 at 224 and 500 px and
batch 1 and 8, the least memory Revolve needs for a recompute factor ρ, against a 2 GB node,
and claim two things of batch 8 and 500 px (panel d): at ρ = 1 "even ResNet18 does not fit into
the 2GB limit", and "all models fit into the 2GB memory with ρ > 1.6".

Three families of curves: LinearResNet built on the paper's own numbers (each panel's total
from Tables I-III, the fixed part FP32 weights, the rest spread over the layers), LinearResNet
built on our activation sizes, and the real ResNets with the optimal planner.

Cost convention for ρ (NOTE [ Recompute factor ] in ``schedule.py``): ρ is the simulated time of a training step
with recomputation over the time of the same step without (every stage's forward and backward
once). LinearResNet has unit forward and unit backward per layer, so ``ρ = (2l + advances) / 2l``,
the paper's ``2ρl`` budget of forward and backward steps. For the real ResNets, stage times are
FLOPs counted on the meta device (backward about twice forward), so ρ is FLOP-weighted.

Memory: LinearResNet counts what the paper counts, weights plus activations (our simulator also
keeps the input batch and the activation gradient of the step being reversed). The real
ResNets count the whole training step: weights, gradients, SGD momentum, input, activations and
workspace, as a device's RAM has to hold them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.chain import Chain
from ..core.schedule import Schedule, keep_all
from ..core.simulator import simulate
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..planners.dp.optimal import solve
from ..planners.revolve import revolve
from ..profiling.estimate import chain_for
from ..profiling.linear_resnet import LINEAR_RESNET_DEPTHS, linear_resnet, linear_resnet_from_total
from ..sysutil.fileio import write_atomic
from ..units import format_bytes
from .tables import paper_values

__all__ = ["CurvePoint", "Curve", "Figure1", "PANELS", "CLAIM_RHO", "FAMILIES", "linear_curve", "paper_curve",
           "resnet_curve", "figure1_curves", "figure1_markdown", "reproduce_figure1"]

PANELS = ((224, 1), (224, 8), (500, 1), (500, 8))  # the paper's panels (a)-(d): image, batch
CLAIM_RHO = 1.6
PAPER_FAMILY = "LinearResNet on the paper's Tables (Revolve)"
LINEAR_FAMILY = "LinearResNet (Revolve)"
RESNET_FAMILY = "ResNet (optimal)"
FAMILIES = (PAPER_FAMILY, LINEAR_FAMILY, RESNET_FAMILY)
PNG_NAMES = ("figure1_paper.png", "figure1_linear.png", "figure1_resnet.png")


@dataclass(frozen=True)
class CurvePoint:
    recompute_factor: float
    peak_bytes: int
    strategy: str


@dataclass(frozen=True)
class Curve:
    """The least peak reachable at each recompute factor for one model, batch and image size."""

    family: str
    depth: int
    batch: int
    image: int
    points: tuple[CurvePoint, ...]  # Pareto front: ρ ascending, peak strictly descending

    def least_factor_within(self, budget_bytes: int) -> float | None:
        """The smallest ρ whose schedule fits ``budget_bytes``, or None if none does."""
        return next((p.recompute_factor for p in self.points if p.peak_bytes <= budget_bytes), None)


def _pareto(points: Iterable[CurvePoint]) -> tuple[CurvePoint, ...]:
    front: list[CurvePoint] = []
    for point in sorted(points, key=lambda p: (p.recompute_factor, p.peak_bytes)):
        if not front or point.peak_bytes < front[-1].peak_bytes:
            front.append(point)
    return tuple(front)


def _point(chain: Chain, schedule: Schedule) -> CurvePoint:
    stats = simulate(chain, schedule)
    return CurvePoint(stats.recompute_factor, stats.peak_bytes, schedule.strategy)


def linear_curve(depth: int, batch: int, image: int) -> Curve:
    """Revolve on LinearResNet-``depth``: one point per number of checkpoint slots, plus no checkpointing."""
    chain = linear_resnet(depth, batch, image)
    points = [_point(chain, keep_all(depth))]
    points += [_point(chain, revolve(chain, slots)) for slots in range(1, depth)]
    return Curve(LINEAR_FAMILY, depth, batch, image, _pareto(points))


def paper_curve(depth: int, batch: int, image: int) -> Curve:
    """Revolve on LinearResNet-``depth`` whose total is the paper's own figure for this batch and image.

    Panels (a)-(d) are all in the tables: batch 1 at 224 px (Table I), batch 1 at 500 px
    (Table II), batch 8 at 224 and 500 px (Table III).
    """
    totals = {(v.model, v.batch, v.image): v.bytes for v in paper_values()}
    chain = linear_resnet_from_total(depth, batch, image, int(totals[(f"resnet{depth}", batch, image)]))
    points = [_point(chain, keep_all(depth))]
    points += [_point(chain, revolve(chain, slots)) for slots in range(1, depth)]
    return Curve(PAPER_FAMILY, depth, batch, image, _pareto(points))


def resnet_curve(depth: int, batch: int, image: int, budgets: int = 150) -> Curve:
    """The optimal planner on the real ResNet-``depth``: one table, rebuilt at evenly spaced budgets."""
    chain = chain_for(f"resnet{depth}", batch, image)
    plain = keep_all(chain.length)
    points = [_point(chain, plain)]
    try:
        table = solve(chain, points[0].peak_bytes)
    except InfeasibleBudgetError:  # resident state dominates: nothing to trade below keep-all
        return Curve(RESNET_FAMILY, depth, batch, image, tuple(points))
    low, high = table.min_memory_bytes, table.max_memory_bytes
    for index in range(budgets):
        budget = low + (high - low) * index // max(budgets - 1, 1)
        points.append(_point(chain, table.schedule(budget)))
    return Curve(RESNET_FAMILY, depth, batch, image, _pareto(points))


@dataclass(frozen=True)
class Figure1:
    curves: tuple[Curve, ...]
    budget_bytes: int

    def claim(self, family: str) -> dict[int, float | None]:
        """Least ρ that fits the budget for each depth at batch 8 and 500 px."""
        return {c.depth: c.least_factor_within(self.budget_bytes) for c in self.curves
                if c.family == family and (c.image, c.batch) == (500, 8)}

    def claim_holds(self, family: str) -> bool:
        factors = self.claim(family).values()
        return all(f is not None and f <= CLAIM_RHO for f in factors)

    def plain_peak_bytes(self, family: str) -> dict[int, int]:
        """The peak at ρ = 1 (no recomputation) for each depth at batch 8 and 500 px."""
        return {c.depth: c.points[0].peak_bytes for c in self.curves
                if c.family == family and (c.image, c.batch) == (500, 8)}

    def to_dict(self) -> dict[str, Any]:
        """The figure as plain data: the budget and every curve's Pareto points."""
        return {"budget_bytes": self.budget_bytes,
                "curves": [{"family": c.family, "depth": c.depth, "batch": c.batch, "image": c.image,
                            "points": [[p.recompute_factor, p.peak_bytes, p.strategy] for p in c.points]}
                           for c in self.curves]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figure1:
        """The figure :meth:`to_dict` wrote."""
        curves = tuple(Curve(c["family"], c["depth"], c["batch"], c["image"],
                             tuple(CurvePoint(factor, peak, strategy) for factor, peak, strategy in c["points"]))
                       for c in data["curves"])
        return cls(curves, data["budget_bytes"])

    def resnet18_misses_at_rho_one(self, family: str) -> bool | None:
        """The paper's other half: at ρ = 1, batch 8 and 500 px, even ResNet-18 does not fit; None without it."""
        peak = self.plain_peak_bytes(family).get(18)
        return None if peak is None else peak > self.budget_bytes


def figure1_curves(budget_bytes: int, depths: tuple[int, ...] = LINEAR_RESNET_DEPTHS,
                   progress: Callable[[int, int], None] | None = None) -> Figure1:
    """Every curve of every family and panel for ``depths``, judged against ``budget_bytes``."""
    jobs = [(family, depth, image, batch) for family in FAMILIES for image, batch in PANELS for depth in depths]
    curves = []
    for index, (family, depth, image, batch) in enumerate(jobs):
        build = {PAPER_FAMILY: paper_curve, LINEAR_FAMILY: linear_curve, RESNET_FAMILY: resnet_curve}[family]
        curves.append(build(depth, batch, image))
        if progress is not None:
            progress(index + 1, len(jobs))
    return Figure1(tuple(curves), budget_bytes)


def reproduce_figure1(out_dir: str | Path, budget_bytes: int, depths: tuple[int, ...] = LINEAR_RESNET_DEPTHS,
                      progress: Callable[[int, int], None] | None = None) -> Figure1:
    """Compute every curve, write ``figure1.csv``, ``figure1.md`` and the two PNG figures."""
    figure = figure1_curves(budget_bytes, depths, progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "figure1.csv", _to_csv(figure))
    write_atomic(out / "figure1.md", "# Figure 1, regenerated: peak memory vs recompute factor\n\n"
                 + figure1_markdown(figure) + "\nThe points are in figure1.csv.\n")
    for family, name in zip(FAMILIES, PNG_NAMES, strict=True):
        _plot(figure, family, out / name)
    return figure


def _to_csv(figure: Figure1) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["family", "model", "batch", "image", "recompute_factor", "peak_bytes", "strategy"])
    for c in figure.curves:
        for p in c.points:
            writer.writerow([c.family, f"resnet{c.depth}", c.batch, c.image, f"{p.recompute_factor:.6f}",
                             p.peak_bytes, p.strategy])
    return buffer.getvalue()


def _verdict_lines(figure: Figure1, family: str) -> list[str]:
    factors = figure.claim(family)
    holds = figure.claim_holds(family)
    lines = [f"### {family}", "", "| model | least ρ that fits |", "|---|---|"]
    lines += [f"| {depth} | {'does not fit at any ρ' if f is None else f'{f:.3f}'} |" for depth, f in factors.items()]
    lines += ["", f"Claim \"batch 8 at 500 px: all models fit into {format_bytes(figure.budget_bytes)} with "
                  f"ρ > {CLAIM_RHO}\": **{'holds' if holds else 'does not hold'}**."]
    peak = figure.plain_peak_bytes(family).get(18)
    misses = figure.resnet18_misses_at_rho_one(family)
    if peak is not None:
        lines.append(f"Claim \"at ρ = 1 even ResNet-18 does not fit\": its peak is {format_bytes(peak)}: "
                     f"**{'holds' if misses else 'does not hold'}**.")
    return [*lines, ""]


def figure1_markdown(figure: Figure1) -> str:
    """How ρ and memory are counted, then each family's least ρ per depth and the claims' verdicts (no title)."""
    lines = ["ρ = simulated step time with recomputation / without. LinearResNet: unit forward and backward per",
             "layer, weights + activations, Revolve; on the paper's Tables the total of each panel is the",
             "paper's figure (fixed part: FP32 weights and BatchNorm buffers), otherwise our activation sizes.",
             "ResNet: FLOP-weighted",
             "stage times, the whole training step (weights, gradients, SGD momentum, activations), the optimal",
             "planner.",
             "Regenerate with `edgetrain reproduce figure1`, which also plots every curve.", ""]
    for family in FAMILIES:
        lines += _verdict_lines(figure, family)
    return "\n".join(lines)


def _plot(figure: Figure1, family: str, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plotting needs matplotlib: pip install 'edgetrain[reports]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.8), sharey=False)
    for axis, (image, batch), letter in zip(axes, PANELS, "abcd", strict=True):
        for curve in (c for c in figure.curves if c.family == family and (c.image, c.batch) == (image, batch)):
            xs = [p.recompute_factor for p in curve.points] + [3.0]
            ys = [p.peak_bytes / 2**30 for p in curve.points]
            ys.append(ys[-1])
            axis.step(xs, ys, where="post", label=f"{'Linear' if 'Linear' in family else ''}ResNet-{curve.depth}")
        axis.axhline(figure.budget_bytes / 2**30, color="black", linestyle="--", linewidth=1, label="2 GiB node")
        axis.set_xlim(1.0, 3.0)
        axis.set_yscale("log")
        axis.set_title(f"({letter}) {image}x{image} px, batch {batch}")
        axis.set_xlabel("recompute factor ρ")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("peak memory (GiB)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"Peak memory vs recompute factor: {family}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
