"""POET's own model size for the MILP: ResNet-18's operator graph (batch 8, 224 px, on ``rpi4``) under variants of
its cost model and options, solved repeatedly, and the table of energies and solve times ``docs/concepts/milp.md``
gives.

A :class:`MilpVariant` is a budget (resident state plus a fraction of keep-all's activations), the graph's cost
model (with or without an assumed memory-traffic floor per node, so that no recomputation is free) and the keyword
arguments of :func:`~edgetrain.planners.milp.solve.milp` (no paging, POET's any-stage page-out, a tighter gap).
:func:`operator_milp_times` solves each; :func:`variants_table` tables the rows it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...bench.stats import Spread, spread
from ...costs.energy import EnergyProfile

__all__ = ["ALL_VARIANTS", "BASE_VARIANTS", "FLOOR_BPS", "MilpVariant", "operator_milp_times", "rpi4_profile",
           "variants_table"]


@dataclass(frozen=True)
class MilpVariant:
    """One row of the operator-graph MILP's table: a budget, the graph's cost model and the MILP's options."""

    activation_fraction: float
    label: str = "paging"
    memory_bps: float | None = None  # a memory-traffic floor per node (J for every op): no recomputation is free
    options: tuple[tuple[str, Any], ...] = ()  # keyword arguments of ``milp``


#: Resident state plus 100%, 75% and 60% of keep-all's activations, paging allowed, the graph's FLOP costs.
BASE_VARIANTS = tuple(MilpVariant(f) for f in (1.0, 0.75, 0.6))
#: The assumed memory-traffic floor, bytes/s per node.
FLOOR_BPS = 2e9
#: The variants docs/concepts/milp.md compares: paging against none (Checkmate's energy-weighted MILP), POET's
#: any-stage page-out (``write_once=False``), and the memory-traffic floor.
ALL_VARIANTS = (
    *BASE_VARIANTS,
    MilpVariant(0.6, "no paging", options=(("paging", False),)),
    MilpVariant(0.6, "POET's any-stage page-out", options=(("write_once", False),)),
    *(MilpVariant(f, "paging", FLOOR_BPS) for f in (1.0, 0.75, 0.6)),
    MilpVariant(0.6, "paging, mip_gap 1e-6", FLOOR_BPS, (("mip_gap", 1e-6),)),
    MilpVariant(0.75, "no paging", FLOOR_BPS, (("paging", False),)),
    MilpVariant(0.6, "no paging", FLOOR_BPS, (("paging", False),)),
    MilpVariant(0.6, "POET's any-stage page-out", FLOOR_BPS, (("write_once", False),)),
)


def rpi4_profile() -> EnergyProfile:
    """The Raspberry Pi 4's energy profile at its training rate (NOTE [ One time model ]: measured on the board;
    this machine is calibrated only if the catalog says the rate derives from a LINPACK rate)."""
    from ...costs.timemodel import needs_calibration, training_rate
    from ...devices import get_device
    from ...profiling.host import calibrate_host

    rpi4 = get_device("rpi4")
    return EnergyProfile.from_device(rpi4, training_rate(rpi4, calibrate_host() if needs_calibration(rpi4) else None))


def operator_milp_times(time_limit_s: float, repeats: int = 1,
                        variants: Sequence[MilpVariant] = BASE_VARIANTS) -> list[dict[str, Any]]:
    """The MILP on ResNet-18's operator graph (batch 8, 224 px, rpi4), ``repeats`` solves of each variant.

    Budgets are the resident part plus a fraction of the activations of keep-all (whole-peak
    fractions such as 75% are below the graph's least feasible peak). Each budget's solves run
    one after another; the row keeps the first solve's result and the spread of all solve times
    (a solve that stops at the time limit reports the limit, so its spread is the limit's).
    Needs HiGHS (the ``milp`` extra).
    """
    import torch

    from ...models import resnet18
    from ...profiling.graph import capture_graph
    from .solve import keep_all_schedule, milp, simulate_graph_schedule, training_graph

    with torch.device("meta"):
        model = resnet18()
    graph = capture_graph(model, (8, 3, 224, 224), target=torch.zeros(8, dtype=torch.long))
    profile = rpi4_profile()
    graphs = {bps: training_graph(graph, profile, memory_bps=bps) for bps in {v.memory_bps for v in variants}}
    rows = []
    for variant in variants:
        tg = graphs[variant.memory_bps]
        keep = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
        budget = int(tg.resident_bytes + variant.activation_fraction * (keep - tg.resident_bytes))
        results = [milp(tg, budget, time_limit_s=time_limit_s, **dict(variant.options)) for _ in range(repeats)]
        result = results[0]
        rows.append({"activation_fraction": variant.activation_fraction, "variant": variant.label,
                     "memory_bps": variant.memory_bps, "options": dict(variant.options), "budget_bytes": budget,
                     "nodes": len(tg.nodes), "variables": result.n_variables, "constraints": result.n_constraints,
                     "status": result.status, "energy_j": result.energy_j,
                     "one_pass_energy_j": tg.compute_energy_j, "solve_time_s": result.solve_time_s,
                     "mip_gap": result.mip_gap,
                     "solve_time_spread": spread([r.solve_time_s for r in results]).to_dict(),
                     "statuses": [r.status for r in results], "energies_j": [r.energy_j for r in results],
                     "mip_gaps": [r.mip_gap for r in results]})
    return rows


def variants_table(rows: list[dict[str, Any]]) -> str:
    """Per variant: every status seen, the energies' range, the energy over one pass of compute, the largest gap and
    the solve time's median with its IQR, CoV and count, as a Markdown table."""
    lines = ["| memory floor | f | variant | status | energy (J) | extra over one pass (J) | mip gap | "
             "solve s (median, IQR, CoV, n) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        floor = "none" if row["memory_bps"] is None else f"{row['memory_bps'] / 1e9:g} GB/s"
        times = row["solve_time_spread"]
        cov = Spread.from_dict(times).cov_text
        statuses = "/".join(sorted(set(row["statuses"])))
        energies = sorted(set(round(e, 3) for e in row["energies_j"]))
        energy = f"{energies[0]:.3f}" if len(energies) == 1 else f"{energies[0]:.3f}-{energies[-1]:.3f}"
        lines.append(f"| {floor} | {row['activation_fraction']:.2f} | {row['variant']} | {statuses} | {energy} | "
                     f"{round(row['energy_j'] - row['one_pass_energy_j'], 3) + 0.0:.3f} | {max(row['mip_gaps']):.1e} | "
                     f"{times['median']:.2f} (IQR {times['q3'] - times['q1']:.2f}, CoV {cov}, n={times['n']}) |")
    return "\n".join(lines)
