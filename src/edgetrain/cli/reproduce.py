"""``edgetrain reproduce``: the founding paper's tables and figure, and POET's results, regenerated from the code.

The main app registers ``reproduce_app`` in :mod:`edgetrain.cli`; the library is imported inside each
command, so ``edgetrain --help`` does not pay for PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..units import format_bytes
from .common import clean_errors, console, host_for, memory_of, with_progress

__all__ = ["reproduce_app"]

reproduce_app = typer.Typer(help="Regenerate the founding paper's results from the code.", no_args_is_help=True)


@reproduce_app.command("tables")
@clean_errors
def reproduce_tables(out: Path = typer.Option(Path("out/tables"), "--out", "-o", help="Output directory."),
                     device: str = typer.Option("odroid-xu4", "--device", "-d",
                                                help="Whose memory marks cells that do not fit.")) -> None:
    """Tables I-III of Kukreja et al. 2019: published, the paper's accounting recomputed, a real step; claims."""
    from ..reports.tables import reproduce_tables as build

    budget = memory_of(device)
    cells = with_progress("estimating cells", lambda progress: build(out, budget, progress=progress))
    from ..reports.tables import claim_verdicts

    accounting = [c.accounting_ratio for c in cells]
    ours = [c.ratio for c in cells]
    console.print(f"wrote {out / 'tables.md'} and {out / 'tables.csv'}: {len(cells)} cells; the paper's accounting "
                  f"recomputed is {min(accounting):.3f}..{max(accounting):.3f} of the paper, a real training "
                  f"step {min(ours):.2f}..{max(ours):.2f}; cells that do not fit {format_bytes(budget)}: paper "
                  f"{sum(not c.paper_fits for c in cells)}, its accounting "
                  f"{sum(not c.accounting_fits for c in cells)}, ours {sum(not c.fits for c in cells)}")
    for claim, paper, accounting_holds, ours_holds in claim_verdicts(cells):
        verdicts = ", ".join(f"{who} {'confirms' if holds else 'refutes'}" for who, holds in
                             (("paper", paper), ("its accounting", accounting_holds), ("ours", ours_holds)))
        console.print(f"  '{claim.text}' ({claim.test}): {verdicts}")


@reproduce_app.command("figure1")
@clean_errors
def reproduce_figure1(out: Path = typer.Option(Path("out/figure1"), "--out", "-o", help="Output directory."),
                      device: str = typer.Option("odroid-xu4", "--device", "-d",
                                                 help="Whose memory is the horizontal line.")) -> None:
    """Fig. 1 of Kukreja et al. 2019: peak memory vs recompute factor, LinearResNet and real ResNets."""
    from ..reports.figure1 import CLAIM_RHO, FAMILIES, PNG_NAMES
    from ..reports.figure1 import reproduce_figure1 as build

    budget = memory_of(device)
    figure = with_progress("computing curves", lambda progress: build(out, budget, progress=progress))
    console.print(f"wrote {', '.join(f'{out}/{name}' for name in PNG_NAMES)}, figure1.csv, figure1.md")
    verdicts = {True: "[green]holds[/]", False: "[red]does not hold[/]"}
    for family in FAMILIES:
        factors = ", ".join(f"{d}: {'-' if f is None else f'{f:.2f}'}" for d, f in figure.claim(family).items())
        peak = figure.plain_peak_bytes(family).get(18)
        rho_one = "" if peak is None else (
            f"; at ρ = 1 ResNet-18 needs {format_bytes(peak)}, claim 'even ResNet-18 does not fit' "
            f"{verdicts[bool(figure.resnet18_misses_at_rho_one(family))]}")
        console.print(f"{family}, batch 8 at 500 px, least ρ that fits {format_bytes(budget)} per depth: {factors}; "
                      f"claim 'all fit with ρ > {CLAIM_RHO}' {verdicts[figure.claim_holds(family)]}{rho_one}")


@reproduce_app.command("poet")
@clean_errors
def reproduce_poet(out: Path = typer.Option(Path("out/poet"), "--out", "-o", help="Output directory."),
                   budgets: int = typer.Option(12, "--budgets", min=2, help="Budgets per model and device (>= 2: "
                                               "keep-all's peak and the least feasible, evenly between)."),
                   milp: bool = typer.Option(False, "--milp", help="Add the MILP series (ResNet-18; slower).")) -> None:
    """POET's Fig. 3 and 4 shapes (energy vs memory and vs runtime budget) and its results beside ours."""
    from ..costs.timemodel import needs_calibration
    from ..devices import get_device
    from ..reports.poet import DEFAULT_DEVICES
    from ..reports.poet import reproduce_poet as build

    # the kept (or $EDGETRAIN_HOST_CALIBRATION's) calibration where a device needs one, so a rerun gives the same times
    host = host_for(next((d for d in map(get_device, DEFAULT_DEVICES) if needs_calibration(d)), None))
    figure = with_progress("sweeping budgets", lambda progress: build(out, budgets=budgets, include_milp=milp,
                                                                      host=host, progress=progress))
    console.print(f"wrote {figure.json_path}, {figure.png_path} and {figure.md_path}")
    verdicts = {True: "[green]holds[/]", False: "[red]does not hold[/]", None: "untestable"}
    for panel in figure.data["panels"]:  # type: ignore[attr-defined]
        claim, poets = panel["claim"], panel["claim_activations"]
        lowest = claim.get("lowest_budget_pct")
        within = "-" if lowest is None else f"{lowest:.0f}% ({poets['lowest_budget_pct']:.0f}% in POET's accounting)"
        console.print(f"  {panel['model']} on {panel['device']}: paging-dp within 1% of unconstrained energy down to "
                      f"{within} of keep-all's peak (least feasible {claim['least_feasible_pct']:.0f}%); POET's claim "
                      f"{verdicts[claim['holds']]} for whole-step budgets, {verdicts[poets['holds']]} in its "
                      "accounting")
    for name, reason in figure.data["skipped_devices"].items():  # type: ignore[attr-defined]
        console.print(f"  {name}: skipped ({reason})")
    console.print(f"POET's results, point by point (sources and reasons in {figure.md_path}):")
    for row in figure.data["claims"]:  # type: ignore[attr-defined]
        console.print(f"  {row['id']}: {row['claim']}; published {row['published']}; ours {row['ours']}",
                      markup=False)
