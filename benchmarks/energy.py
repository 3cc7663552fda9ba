"""Energy of a training step against the memory budget (POET's figure), and how fast the paging DP solves.

Runs :func:`edgetrain.reports.poet.reproduce_poet` on ResNet-18 (batch 8 at 224 px: at 32 px the
activations are 3% of the step's RAM, weights, momentum and gradients the rest, so no budget
sweep is possible; at 224 px they are about half) and the BERT-base-like ``transformer`` encoder
(batch 8, 256 tokens, activations about two thirds of the step) on the boards that can hold
them (the microcontrollers get the report's tiny models instead), with POET's MILP on ResNet-18's
chain when :mod:`edgetrain.planners.milp.solve` imports.
Then times :func:`~edgetrain.planners.dp.paging.solve_paging` (500 slots, the rpi4 profile) on
152-stage chains: ``Chain.uniform(152)`` and LinearResNet-152 (batch 8, 224 px); target < 1 s.
The MILP on ResNet-18's operator graph is the ``milp_variants`` benchmark.
"""

from __future__ import annotations

import functools
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from edgetrain.bench.stats import Spread, spread
from edgetrain.core.chain import Chain
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.costs.timemodel import needs_calibration
from edgetrain.devices import get_device
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.milp.variants import rpi4_profile
from edgetrain.profiling.host import calibrate_host
from edgetrain.profiling.linear_resnet import linear_resnet
from edgetrain.reports.poet import DEFAULT_DEVICES, reproduce_poet

log = logging.getLogger("energy")

TITLE = "Energy against the memory budget, and paging-dp's solve time"
MODELS = (("resnet18", 8, 224), ("transformer", 8, 256))
QUICK_MODELS = (("resnet18", 2, 128), ("transformer_small", 4, 32))
BUDGETS, QUICK_BUDGETS = 12, 4          # budgets per panel, keep-all's peak down to paging-dp's least
MILP_TIME_LIMIT_S = 60.0                # HiGHS seconds per budget of the chain MILP (not in the quick run)
TIMING_SLOTS = 500
REPEATS, QUICK_REPEATS = 5, 3           # timed solves per chain


def _timed(repeats: int, call: Callable[[], object]) -> Spread:
    """Wall-clock seconds of ``repeats`` calls: median, IQR and CoV (the machine's load shows in the spread)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
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


def milp_solve_times(panels: list[dict[str, Any]]) -> dict[str, Any]:
    """Per device, the chain MILP's solve seconds (max and median over budgets) and statuses; else why it is
    missing."""
    found: dict[str, Any] = {}
    for panel in panels:
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


def _panel(panel: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of one panel: its claim verdicts and, per budget, each strategy's energy over keep-all's."""
    points = [{"budget_pct": p["budget_pct_of_keep_all_peak"], "activation_budget_pct": p["activation_budget_pct"],
               "energy_rel": {name: None if s is None else s["energy_rel_keep_all"]
                              for name, s in p["strategies"].items()}} for p in panel["points"]]
    return {key: panel[key] for key in ("model", "batch", "size", "device", "stages", "fixed_pct_of_keep_all_peak",
                                        "claim", "claim_activations")} | {"points": points}


def run(quick: bool) -> dict[str, Any]:
    """The budget sweep (with the chain MILP in the full run), then the paging DP's solve times."""
    devices = [get_device(name) for name in DEFAULT_DEVICES]
    host = calibrate_host() if any(needs_calibration(d) for d in devices) else None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgetrain-energy-") as out:
        figure = reproduce_poet(out, models=QUICK_MODELS if quick else MODELS, devices=DEFAULT_DEVICES,
                                budgets=QUICK_BUDGETS if quick else BUDGETS, include_milp=not quick,
                                milp_time_limit_s=MILP_TIME_LIMIT_S, host=host,
                                progress=lambda done, total: log.info("panel %d/%d", done, total))
    sweep_s = time.perf_counter() - start
    panels: list[dict[str, Any]] = figure.data["panels"]  # type: ignore[assignment]
    chains = {"Chain.uniform(152)": Chain.uniform(152)}
    if not quick:
        chains["LinearResNet-152 b8 224px"] = linear_resnet(152, batch=8, image_size=224)
    timings = time_solve_paging(chains, rpi4_profile(), QUICK_REPEATS if quick else REPEATS)
    return {"budgets": QUICK_BUDGETS if quick else BUDGETS, "milp": not quick, "milp_time_limit_s": MILP_TIME_LIMIT_S,
            "sweep_s": sweep_s, "panels": [_panel(p) for p in panels],
            "skipped_devices": figure.data["skipped_devices"], "milp_solve_times": milp_solve_times(panels),
            "slots": TIMING_SLOTS, "solve_paging_s": {name: t.to_dict() for name, t in timings.items()}}


def _pct(value: float | None) -> str:
    return "does not fit" if value is None else f"{value:+.2f}%"


def _verdict(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "untestable"}[value]


def render(result: dict[str, Any]) -> str:
    """The claim per panel, each panel's energies by budget, then the solve times."""
    lines = ["POET claims that paging combined with recomputation keeps a step's energy within 1% of the "
             "unconstrained step down to roughly half the memory. Each model x device panel sweeps "
             f"{result['budgets']} budgets from keep-all's peak down to `paging-dp`'s least; budgets are given as % of "
             "keep-all's whole peak / of its part above the fixed weights, momentum and gradients (POET's "
             "accounting).", "",
             "| model | device | fixed part of peak | least feasible budget | lowest budget within 1% "
             "| paging-dp extra | recompute-only extra | capuchin extra | holds (whole / POET's) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in result["panels"]:
        c, a = p["claim"], p["claim_activations"]
        low = ("none" if c["lowest_budget_pct"] is None
               else f"{c['lowest_budget_pct']:.1f}% / {a['lowest_budget_pct']:.1f}%")
        lines.append(f"| {p['model']} b{p['batch']}x{p['size']} | {p['device']} "
                     f"| {p['fixed_pct_of_keep_all_peak']:.1f}% "
                     f"| {c['least_feasible_pct']:.1f}% / {a['least_feasible_pct']:.1f}% | {low} "
                     f"| {_pct(c.get('paging_dp_extra_pct'))} | {_pct(c.get('recompute_only_extra_pct'))} "
                     f"| {_pct(c.get('capuchin_extra_pct'))} | {_verdict(c['holds'])} / {_verdict(a['holds'])} |")
    lines += ["", "Extras are at the lowest budget within 1%; a device without energy figures is skipped:", ""]
    lines += [f"* {name}: {why}" for name, why in result["skipped_devices"].items()]
    for p in result["panels"]:
        strategies = sorted({name for point in p["points"] for name in point["energy_rel"]})
        lines += ["", f"### {p['model']} b{p['batch']}x{p['size']} on {p['device']}", "",
                  "Energy over keep-all's, per budget:", "",
                  "| budget (% whole / POET's) | " + " | ".join(strategies) + " |",
                  "|---|" + "---|" * len(strategies)]
        for point in p["points"]:
            cells = ["-" if point["energy_rel"].get(s) is None else f"{point['energy_rel'][s]:.4f}" for s in strategies]
            lines.append(f"| {point['budget_pct']:.1f}% / {point['activation_budget_pct']:.1f}% | "
                         + " | ".join(cells) + " |")
    lines += ["", "## Solve times", "",
              f"`solve_paging` up to keep-all's peak, {result['slots']} slots, the rpi4 profile, wall-clock:", "",
              "| chain | median (s) | IQR (s) | CoV | solves |", "|---|---|---|---|---|"]
    for name, item in result["solve_paging_s"].items():
        s = Spread.from_dict(item)
        lines.append(f"| {name} | {s.median:.3f} | {s.iqr:.3f} | {s.cov_text} | {s.n} |")
    if result["milp"]:
        lines += ["", f"POET's MILP on ResNet-18's chain (HiGHS, {result['milp_time_limit_s']:g} s limit per budget):",
                  ""]
        for device, info in result["milp_solve_times"].items():
            if isinstance(info, str):
                lines.append(f"* {device}: unavailable: {info}")
            else:
                median = "-" if info["median_s"] is None else f"{info['median_s']:.2f}"
                largest = "-" if info["max_s"] is None else f"{info['max_s']:.2f}"
                lines.append(f"* {device}: median {median} s, largest {largest} s over the budgets; statuses "
                             f"{', '.join(info['statuses'])}; {info['budgets_without_schedule']} budgets without a "
                             "schedule")
    lines += ["", f"The sweep took {result['sweep_s']:.0f} s."]
    return "\n".join(lines)
