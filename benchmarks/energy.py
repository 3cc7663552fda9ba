"""Energy of a training step against the memory budget (POET's figure), and how fast the paging DP solves.

Runs :func:`edgetrain.reports.poet.reproduce_poet` on ResNet-18 (batch 8 at 224 px: at 32 px the
activations are 3% of the step's RAM, weights, momentum and gradients the rest, so no budget
sweep is possible; at 224 px they are about half) and the BERT-base-like ``transformer`` encoder
(batch 8, 256 tokens, activations about two thirds of the step) on the boards that can hold
them (the microcontrollers get the report's tiny models instead), with POET's MILP on ResNet-18
when :mod:`edgetrain.planners.milp.solve` imports.
Then times :func:`~edgetrain.planners.dp.paging.solve_paging` (500 slots, the rpi4 profile) on
152-stage chains: ``Chain.uniform(152)`` and LinearResNet-152 (batch 8, 224 px); target < 1 s.

Usage::

    nice -n 10 python benchmarks/energy.py            # full run (docs/guide/paging-energy.md has its numbers)
    python benchmarks/energy.py --quick               # small inputs, 4 budgets, no MILP: a smoke check
    python benchmarks/energy.py --solve-times-only --milp-repeats 3   # the solver timings alone, with spreads
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetrain.bench.stats import Spread, software_setup, spread
from edgetrain.core.chain import Chain
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.costs.timemodel import HostCalibration, needs_calibration, training_rate
from edgetrain.devices import Device, get_device
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.profiling.host import calibrate_host
from edgetrain.profiling.linear_resnet import linear_resnet
from edgetrain.reports.poet import DEFAULT_DEVICES, PoetFigure, reproduce_poet

FULL_MODELS = (("resnet18", 8, 224), ("transformer", 8, 256))
QUICK_MODELS = (("resnet18", 2, 128), ("transformer_small", 4, 32))
TIMING_SLOTS = 500



def _rpi4_profile() -> EnergyProfile:
    """The Raspberry Pi 4's profile at its training rate (NOTE [ One time model ]: measured on the board)."""
    rpi4 = get_device("rpi4")
    return EnergyProfile.from_device(rpi4, training_rate(rpi4, _host_if_needed([rpi4])))


def _host_if_needed(devices: Sequence[Device]) -> HostCalibration | None:
    """This machine's calibration when a device's training rate derives from its LINPACK rate, else None."""
    return calibrate_host() if any(needs_calibration(d) for d in devices) else None

def _timed(repeats: int, run: Callable[[], object]) -> Spread:
    """Wall-clock seconds of ``repeats`` calls: median, IQR and CoV (the machine's load shows in the spread)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return spread(times)


def time_solve_paging(chains: dict[str, Chain], profile: EnergyProfile, repeats: int) -> dict[str, Spread]:
    """Seconds of one :func:`solve_paging` up to keep-all's peak per chain (after a warm-up that loads numba)."""
    solve_paging(Chain.uniform(4), profile, simulate(Chain.uniform(4), keep_all(4)).peak_bytes)
    seconds = {}
    for name, chain in chains.items():
        top = simulate(chain, keep_all(chain.length)).peak_bytes
        seconds[name] = _timed(repeats, functools.partial(solve_paging, chain, profile, top, slots=TIMING_SLOTS))
    return seconds


def milp_solve_times(figure: PoetFigure) -> dict[str, object]:
    """Per device, the MILP's solve seconds (max and median over budgets) and statuses; else why it is missing."""
    found: dict[str, object] = {}
    for panel in figure.data["panels"]:  # type: ignore[attr-defined]
        if "unavailable" in panel:
            found[panel["device"]] = panel["unavailable"]["milp"]
            continue
        runs = [p["strategies"].get("milp") for p in panel["points"]]
        if not any(r is not None for r in runs) and panel["model"] != "resnet18":
            continue
        solved = [r for r in runs if r is not None]
        found[panel["device"]] = {
            "max_s": max((r["solve_time_s"] for r in solved), default=None),
            "median_s": statistics.median([r["solve_time_s"] for r in solved]) if solved else None,
            "statuses": sorted({r["status"] for r in solved}), "budgets_without_schedule": len(runs) - len(solved)}
    return found


@dataclass(frozen=True)
class MilpVariant:
    """One row of the operator-graph MILP's table: a budget, the graph's cost model and the MILP's options."""

    activation_fraction: float
    label: str = "paging"
    memory_bps: float | None = None  # a memory-traffic floor per node (J for every op): no recomputation is free
    options: tuple[tuple[str, Any], ...] = ()  # keyword arguments of ``milp``


BASE_VARIANTS = tuple(MilpVariant(f) for f in (1.0, 0.75, 0.6))
FLOOR_BPS = 2e9
#: POET's model size with the variants docs/concepts/milp.md compares: paging against none (Checkmate's energy-weighted
#: MILP), POET's any-stage page-out (``write_once=False``), and an assumed memory-traffic floor.
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


def operator_milp_times(time_limit_s: float, repeats: int = 1,
                        variants: Sequence[MilpVariant] = BASE_VARIANTS) -> list[dict[str, Any]]:
    """POET's own model size: the MILP on ResNet-18's operator graph (batch 8, 224 px, rpi4), ``repeats`` solves each.

    Budgets are the resident part plus a fraction of the activations of keep-all (whole-peak
    fractions such as 75% are below the graph's least feasible peak). Each budget's solves run
    one after another; the row keeps the first solve's result and the spread of all solve times
    (a solve that stops at the time limit reports the limit, so its spread is the limit's).
    """
    import torch

    from edgetrain.models import resnet18
    from edgetrain.planners.milp.solve import keep_all_schedule, milp, simulate_graph_schedule, training_graph
    from edgetrain.profiling.graph import capture_graph

    with torch.device("meta"):
        model = resnet18()
    graph = capture_graph(model, (8, 3, 224, 224), target=torch.zeros(8, dtype=torch.long))
    graphs = {bps: training_graph(graph, _rpi4_profile(), memory_bps=bps) for bps in {v.memory_bps for v in variants}}
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
    """docs/concepts/milp.md's table: per variant, energy over one pass of compute, solve time with its spread."""
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


def summary(figure: PoetFigure, timings: dict[str, Spread], milp: dict[str, object],
            operator_milp: list[dict[str, Any]]) -> str:
    lines = [figure.md_path.read_text(), "## Solve times", "", *_solve_paging_lines(timings)]
    lines += [f"- milp (ResNet-18 chain) on {device}: {info}" for device, info in milp.items()]
    return "\n".join([*lines, *_operator_milp_lines(operator_milp)])


def _solve_paging_lines(timings: dict[str, Spread]) -> list[str]:
    return [f"- solve_paging, {name}, {TIMING_SLOTS} slots: {seconds.text('{:.3f}')} s"
            for name, seconds in timings.items()]


def _operator_milp_lines(operator_milp: list[dict[str, Any]]) -> list[str]:
    return [f"- milp (ResNet-18 operator graph, {row['nodes']} nodes, {row['variables']} variables), resident + "
            f"{row['activation_fraction']:.0%} of activations{_variant_words(row)}: {row['status']}, "
            f"{row['energy_j']:.3f} J, "
            f"{_solve_seconds(row)}" for row in operator_milp]


def _variant_words(row: dict[str, Any]) -> str:
    floor = "" if row.get("memory_bps") is None else f", {row['memory_bps'] / 1e9:g} GB/s memory floor"
    return "" if row.get("variant", "paging") == "paging" and not floor else f" ({row['variant']}{floor})"


def _solve_seconds(row: dict[str, Any]) -> str:
    """One solve's seconds, or the median, IQR and CoV of the repeated solves with their statuses."""
    times = row["solve_time_spread"]
    if times["n"] == 1:
        return f"{row['solve_time_s']:.1f} s"
    cov = Spread.from_dict(times).cov_text
    return (f"median {times['median']:.2f} s (IQR {times['q1']:.2f}-{times['q3']:.2f} s, CoV {cov}, "
            f"{times['n']} solves; statuses {sorted(set(row['statuses']))}, "
            f"energy {min(row['energies_j']):.3f}-{max(row['energies_j']):.3f} J)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small inputs, 4 budgets, no MILP: a smoke check")
    parser.add_argument("--out", type=Path, default=Path("out/energy"), help="directory for poet.* and timings")
    parser.add_argument("--budgets", type=int, help="budgets per panel (default 12; 4 with --quick)")
    parser.add_argument("--milp-time-limit", type=float, default=60.0, help="HiGHS seconds per budget")
    parser.add_argument("--repeats", type=int, default=5, help="timed solves per chain (median, IQR, CoV)")
    parser.add_argument("--milp-repeats", type=int, default=1,
                        help="solves per budget of the operator-graph MILP (median, IQR, CoV; default 1)")
    parser.add_argument("--milp-variants", action="store_true",
                        help="with --solve-times-only: the operator-graph MILP's variants of docs/concepts/milp.md "
                        "(no paging, POET's any-stage page-out, a 2 GB/s memory-traffic floor) instead of its three "
                        "budgets")
    parser.add_argument("--solve-times-only", action="store_true",
                        help="skip the energy sweep (and its chain MILP): time solve_paging and the operator-graph "
                        "MILP only")
    args = parser.parse_args(argv)
    if args.solve_times_only:
        return solve_times_only(args)

    budgets = args.budgets or (4 if args.quick else 12)
    models = QUICK_MODELS if args.quick else FULL_MODELS
    host = _host_if_needed([get_device(name) for name in DEFAULT_DEVICES])
    if host is not None:
        print(f"  calibration: {host.source}; efficiency {host.efficiency:.3f}", flush=True)
    start = time.perf_counter()
    figure = reproduce_poet(args.out, models=models, devices=DEFAULT_DEVICES, budgets=budgets,
                            include_milp=not args.quick,
                            milp_time_limit_s=args.milp_time_limit, host=host,
                            progress=lambda done, total: print(f"  panel {done}/{total}", flush=True))
    sweep_s = time.perf_counter() - start

    rpi4 = _rpi4_profile()
    chains = {"Chain.uniform(152)": Chain.uniform(152)}
    if not args.quick:
        chains["LinearResNet-152 b8 224px"] = linear_resnet(152, batch=8, image_size=224)
    timings = time_solve_paging(chains, rpi4, args.repeats)
    milp = milp_solve_times(figure) if not args.quick else {}
    operator_milp = operator_milp_times(args.milp_time_limit, args.milp_repeats) if not args.quick else []
    (args.out / "timings.json").write_text(json.dumps(
        {"sweep_s": sweep_s, "solve_paging_s": {name: t.to_dict() for name, t in timings.items()},
         "slots": TIMING_SLOTS, "milp": milp, "operator_milp": operator_milp}, indent=1))
    print(summary(figure, timings, milp, operator_milp))
    print(f"sweep took {sweep_s:.1f} s; files in {args.out}")
    return 0


def solve_times_only(args: argparse.Namespace) -> int:
    """The solver timings without the sweep: solve_paging on both 152-stage chains, then the operator-graph MILP."""
    chains = {"Chain.uniform(152)": Chain.uniform(152),
              "LinearResNet-152 b8 224px": linear_resnet(152, batch=8, image_size=224)}
    timings = time_solve_paging(chains, _rpi4_profile(), args.repeats)
    variants = ALL_VARIANTS if args.milp_variants else BASE_VARIANTS
    operator_milp = operator_milp_times(args.milp_time_limit, args.milp_repeats, variants)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "solve_times.json").write_text(json.dumps(
        {"solve_paging_s": {name: t.to_dict() for name, t in timings.items()}, "slots": TIMING_SLOTS,
         "operator_milp": operator_milp, "milp_time_limit_s": args.milp_time_limit,
         "setup": software_setup()}, indent=1))
    print("\n".join([*_solve_paging_lines(timings), *_operator_milp_lines(operator_milp)]))
    if args.milp_variants:
        print(variants_table(operator_milp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
