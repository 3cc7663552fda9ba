"""POET's energy-versus-memory figure, and its claim, re-run with edgetrain's planners and simulator.

POET (Patil et al., ICML 2022) claims that integrating paging with rematerialisation keeps a
training step's energy within about 1% of the unconstrained step down to roughly half the
memory, where rematerialisation alone pays far more. For each model and device this sweeps
memory budgets from plain backprop's simulated peak down to the least budget ``paging-dp``
fits, and prices every strategy's schedule with :func:`~edgetrain.core.simulator.simulate` on the
device's energy profile:

* ``paging-dp``: recompute + paging, least energy (:mod:`edgetrain.planners.dp.paging`);
* ``recompute-only``: the optimal-checkpointing DP, least time (hence least compute energy);
* ``paging-only``: ``paging-dp`` without recomputation;
* ``capuchin``: the swap-first greedy (:mod:`edgetrain.planners.capuchin`);
* ``milp``: POET's MILP (:mod:`edgetrain.planners.milp.solve`), when asked for and importable.

Energies are relative to plain backprop (keep-all) on the same device; budgets are percentages
of keep-all's peak, the whole step's RAM (weights, optimizer state, gradients included), and
also in POET's accounting: POET's memory budget counts only the graph's node outputs
(activations and their gradients, ``poet/poet_solver.py``), not weights, weight gradients or
optimizer state, so each budget is also given as a percentage of keep-all's peak *above the
fixed part* (resident state, every gradient, the optimizer's workspace). The claim is judged on
both axes.

Beside the sweep, :mod:`edgetrain.reports.poet_claims` adds POET's published results next to ours
(the claims table), energy against the runtime budget on one panel (POET's Fig. 4 shape), and the
tiny models the microcontrollers plan instead of the zoo's (NOTE [ Microcontroller panels ]).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.chain import Chain
from ..core.schedule import Schedule, keep_all
from ..core.simulator import simulate
from ..costs.energy import EnergyProfile, scale_chain
from ..costs.timemodel import HostCalibration, needs_calibration, training_rate
from ..devices import get_device
from ..errors import EdgetrainError, InfeasibleBudgetError
from ..planners.capuchin import capuchin
from ..planners.dp.optimal import OptimalTable, solve
from ..planners.dp.paging import PagingTable, solve_paging
from ..profiling.estimate import chain_for
from ..sysutil.fileio import write_atomic
from .poet_claims import (
    TINY_MODELS,
    TinyModel,
    claims_markdown,
    claims_table,
    deadline_sweep,
    sweep_markdown,
    tiny_chain,
)

__all__ = ["PoetFigure", "DEFAULT_MODELS", "DEFAULT_DEVICES", "STRATEGIES", "CLAIM_TOLERANCE", "CLAIM_BUDGET_PCT",
           "poet_markdown", "reproduce_poet"]

# ResNet-18 at 224 px (POET's ImageNet-size input): activations are about half of the step's peak,
# so a sweep to "half the memory" is possible at all; at 32 px they are 3% (weights, momentum and
# gradients dominate). The small encoder at 128 tokens is activation-dominated. Both run in seconds.
DEFAULT_MODELS: tuple[tuple[str, int, int], ...] = (("resnet18", 8, 224), ("transformer_small", 8, 128))
# The zoo models run on the boards that can hold them; the microcontrollers get TINY_MODELS instead
# (NOTE [ Microcontroller panels ] in poet_claims.py): ResNet-18 b8/224 needs ~290 MiB.
DEFAULT_DEVICES = ("rpi4", "jetson-tx2")
# The deadline sweep (POET's Fig. 4 shape) runs on this panel, at the budget this far from keep-all's
# peak towards paging-dp's least feasible one.
SWEEP_PANEL = ("resnet18", "rpi4")
SWEEP_BUDGET_FRACTION = 0.8
STRATEGIES = ("paging-dp", "recompute-only", "paging-only", "capuchin")
CLAIM_TOLERANCE = 0.01    # "within ~1% of the unconstrained energy"
CLAIM_BUDGET_PCT = 55.0   # "down to roughly half the memory": we accept 55% of keep-all's peak or lower
WHOLE_STEP = "budget_pct_of_keep_all_peak"   # the claim's axes: % of keep-all's whole peak,
ACTIVATIONS = "activation_budget_pct"        # or of its part above the fixed state (POET's accounting)
ASSUMPTIONS = (
    "Energy per training step = compute power x compute time + per-transfer paging energy "
    "(latency + bytes / throughput) x storage power, POET's model (edgetrain.costs.energy).",
    "Stage times are FLOPs (counted on the meta device) / the device's training rate (NOTE [ One time model ]: "
    "measured on the device, or its LINPACK rate x the training efficiency measured here); every stage runs at "
    "the same achieved rate.",
    "Budgets and peaks are the whole step's RAM as edgetrain.core.simulator.simulate counts it: weights, optimizer "
    "state (SGD momentum), input batch, gradients, activations and workspace.",
    "Paging time is charged serially (no overlap with compute); what each planner may page is in its module "
    "(paging-dp: NOTE [ The paging DP ]; capuchin: stage inputs its records keep).",
    "The milp series prices its schedule with the MILP's own graph accounting (edgetrain.planners.milp.solve), "
    "not with simulate; its peak is that model's.",
)

Progress = Callable[[int, int], None]
Planner = Callable[[int], Schedule]


@dataclass(frozen=True)
class PoetFigure:
    """Where the report went and what it says: the JSON's content and the claim's verdict per panel."""

    json_path: Path
    png_path: Path
    md_path: Path
    data: dict[str, object]


def _profiles(devices: Sequence[str], host: HostCalibration | None) -> tuple[dict[str, EnergyProfile], dict[str, str]]:
    """Energy profiles of the devices that have figures, and why each other one is skipped."""
    profiles, skipped = {}, {}
    for name in devices:
        device = get_device(name)
        try:
            if needs_calibration(device) and host is None:
                raise EdgetrainError(f"device {name!r} needs this machine's calibration (host=) for its training rate")
            profiles[name] = EnergyProfile.from_device(device, training_rate(device, host))
        except EdgetrainError as exc:
            skipped[name] = str(exc)
    return profiles, skipped


def _planners(chain: Chain, profile: EnergyProfile, top_bytes: int, slots: int) -> dict[str, Planner]:
    """One schedule builder per strategy, each table solved once for every budget up to ``top_bytes``.

    The tables' strategies run keep-all wherever it fits, as :func:`edgetrain.planners.plan` does:
    it is in all three classes and optimal there, but a grid rounds each local peak up, so at
    exactly keep-all's peak a table misses it. Below it every strategy plans ``Chain.rng_reserve_bytes``
    lower, as :func:`~edgetrain.planners.energy_plan.plan_energy` does (NOTE [ Generator states in the plan ]).
    """
    reserve = chain.rng_reserve_bytes

    def table(make: Callable[[], OptimalTable | PagingTable]) -> Planner:
        try:
            solved: OptimalTable | PagingTable | None = make()
        except InfeasibleBudgetError:   # nothing but keep-all fits in keep-all's peak on this grid
            solved = None

        def schedule(budget: int) -> Schedule:
            if budget >= top_bytes:
                return keep_all(chain.length)
            if solved is None:
                raise InfeasibleBudgetError(f"no table schedule fits below {top_bytes} bytes", budget_bytes=budget)
            return solved.schedule(budget - reserve)
        return schedule

    return {"paging-dp": table(lambda: solve_paging(chain, profile, top_bytes, slots=slots)),
            "recompute-only": table(lambda: solve(chain, top_bytes, slots=slots)),
            "paging-only": table(lambda: solve_paging(chain, profile, top_bytes, slots=slots, recompute=False)),
            "capuchin": lambda budget: capuchin(chain, profile, budget - reserve)}


def _point(energy_j: float, time_s: float, peak_bytes: int, base_energy_j: float) -> dict[str, float | int]:
    return {"energy_j": energy_j, "time_s": time_s, "peak_bytes": peak_bytes,
            "energy_rel_keep_all": energy_j / base_energy_j}


class _Milp:
    """POET's MILP on the chain's training graph; why it cannot run, and why a budget got no schedule.

    It is another module's work in progress, so any failure is recorded, never raised: the rest
    of the report stands without it.
    """

    def __init__(self, chain: Chain, profile: EnergyProfile, time_limit_s: float) -> None:
        self.time_limit_s, self.reason = time_limit_s, None
        self.failures: dict[int, str] = {}
        try:
            from ..planners.milp.graph import chain_training_graph
            from ..planners.milp.solve import milp

            self.solve, self.graph = milp, chain_training_graph(chain, profile)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            self.reason = f"edgetrain.planners.milp.solve is unavailable: {type(exc).__name__}: {exc}"

    def point(self, budget: int, base_energy_j: float) -> dict[str, object] | None:
        if self.reason is not None:
            return None
        try:
            result = self.solve(self.graph, budget, time_limit_s=self.time_limit_s)
        except Exception as exc:  # noqa: BLE001 - infeasible, no schedule in time, or a failure
            self.failures[budget] = f"{type(exc).__name__}: {exc}"
            return None
        point = _point(result.energy_j, result.time_s, result.peak_bytes, base_energy_j)
        return {**point, "status": result.status, "solve_time_s": result.solve_time_s}


def _budgets(top_bytes: int, bottom_bytes: int, count: int) -> list[int]:
    """``count`` budgets evenly from ``top_bytes`` down to ``bottom_bytes``, both included."""
    if count < 2 or bottom_bytes >= top_bytes:
        return [top_bytes]
    step = (top_bytes - bottom_bytes) / (count - 1)
    return sorted({round(top_bytes - k * step) for k in range(count)}, reverse=True)  # a set: tiny ranges repeat


def _panel(model: str, batch: int, size: int, chain: Chain, profile: EnergyProfile, budgets: int, slots: int,
           milp: _Milp | None) -> dict[str, object]:
    """Every strategy at every budget of one model on one device."""
    base = simulate(chain, keep_all(chain.length), profile)
    base_energy = base.energy_j or 0.0
    planners = _planners(chain, profile, base.peak_bytes, slots)
    try:
        bottom = solve_paging(chain, profile, base.peak_bytes, slots=slots).min_memory_bytes + chain.rng_reserve_bytes
    except InfeasibleBudgetError:
        bottom = base.peak_bytes
    fixed = chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes
    points = []
    for budget in _budgets(base.peak_bytes, bottom, budgets):
        row: dict[str, object] = {}
        for name, planner in planners.items():
            try:
                stats = simulate(chain, planner(budget), profile)
            except InfeasibleBudgetError:
                row[name] = None
                continue
            row[name] = _point(stats.energy_j or 0.0, stats.time_s, stats.peak_bytes, base_energy)
        if milp is not None:
            row["milp"] = milp.point(budget, base_energy)
        points.append({"budget_bytes": budget, "budget_pct_of_keep_all_peak": 100.0 * budget / base.peak_bytes,
                       "activation_budget_pct": 100.0 * (budget - fixed) / (base.peak_bytes - fixed),
                       "strategies": row})
    panel: dict[str, object] = {
        "model": model, "batch": batch, "size": size, "device": profile.device_name, "stages": chain.length,
        "keep_all": _point(base_energy, base.time_s, base.peak_bytes, base_energy),
        "fixed_bytes": fixed, "fixed_pct_of_keep_all_peak": 100.0 * fixed / base.peak_bytes,
        "points": points}
    if milp is not None and milp.reason is not None:
        panel["unavailable"] = {"milp": milp.reason}
    elif milp is not None:
        panel["milp_without_schedule"] = {str(budget): why for budget, why in milp.failures.items()}
    panel["claim"] = _claim(panel, WHOLE_STEP)
    panel["claim_activations"] = _claim(panel, ACTIVATIONS)
    return panel


def _rel(point: dict[str, object], strategy: str) -> float | None:
    found = point["strategies"].get(strategy)  # type: ignore[attr-defined]
    return None if found is None else float(found["energy_rel_keep_all"])


def _claim(panel: dict[str, object], axis: str) -> dict[str, object]:
    """The lowest budget down to which paging-dp stays within 1% of keep-all, and the others' extra there.

    ``axis`` is the point's percentage the claim's "half the memory" is read on: ``WHOLE_STEP``
    or ``ACTIVATIONS`` (POET's accounting). ``holds`` is None (untestable) when paging-dp stays
    within 1% down to its least feasible budget and that is above the claim's: the claim speaks
    of budgets no schedule reaches.
    """
    lowest = None
    for point in panel["points"]:  # type: ignore[attr-defined]
        rel = _rel(point, "paging-dp")
        if rel is None or rel > 1 + CLAIM_TOLERANCE:
            break
        lowest = point
    least = float(panel["points"][-1][axis])  # type: ignore[index]
    if lowest is None:
        return {"lowest_budget_pct": None, "least_feasible_pct": least, "holds": False}

    def extra(strategy: str) -> float | None:
        rel = _rel(lowest, strategy)
        return None if rel is None else 100.0 * (rel - 1)

    pct = float(lowest[axis])
    recompute_extra = extra("recompute-only")
    holds = pct <= CLAIM_BUDGET_PCT and (recompute_extra is None or recompute_extra > 100 * CLAIM_TOLERANCE)
    return {"lowest_budget_pct": pct, "least_feasible_pct": least, "paging_dp_extra_pct": extra("paging-dp"),
            "recompute_only_extra_pct": recompute_extra, "capuchin_extra_pct": extra("capuchin"),
            "holds": None if pct == least and least > CLAIM_BUDGET_PCT else holds}


def _plot(data: dict[str, object], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise EdgetrainError("plotting needs matplotlib: pip install 'edgetrain[reports]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[dict[str, object]] = data["panels"]  # type: ignore[assignment]
    cols = min(2, len(panels))   # one cell per panel: a tiny model runs on its own board only
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for index, panel in enumerate(panels):
        ax = axes[index // cols][index % cols]
        for strategy in data["strategies"]:  # type: ignore[attr-defined]
            xy = [(p["budget_pct_of_keep_all_peak"], _rel(p, strategy))
                  for p in panel["points"]]  # type: ignore[attr-defined]
            xy = [(x, y) for x, y in xy if y is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), marker=".", label=strategy)
        ax.set_title(f"{panel['model']} on {panel['device']}", fontsize=9)
        ax.set_xlabel("budget (% of keep-all peak)")
        ax.set_ylabel("energy / keep-all energy")
        fixed = float(panel["fixed_pct_of_keep_all_peak"])  # type: ignore[arg-type]
        top = ax.secondary_xaxis("top", functions=(lambda x, f=fixed: 100 * (x - f) / (100 - f),
                                                   lambda a, f=fixed: f + a * (100 - f) / 100))
        top.set_xlabel("activation budget, POET's accounting (%)", fontsize=7)
        top.tick_params(labelsize=7)
        ax.axhline(1 + CLAIM_TOLERANCE, color="grey", linestyle=":", linewidth=0.8)
        ax.invert_xaxis()
    for index in range(len(panels), rows * cols):
        axes[index // cols][index % cols].set_visible(False)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_VERDICT = {True: "yes", False: "no", None: "untestable"}


def _fmt(value: object) -> str:
    return "does not fit" if value is None else f"{value:+.2f}%"


def poet_markdown(data: dict[str, object]) -> str:
    """The report's tables from its data (``poet.json``): the claim per panel, POET's results point by point, the
    runtime sweep and the assumptions, without a title."""
    panels: list[dict[str, object]] = data["panels"]  # type: ignore[assignment]
    lines = [f"Claim: with paging + recomputation a step's energy stays within {100 * CLAIM_TOLERANCE:.0f}% of the "
             f"unconstrained step down to roughly half the memory (here: {CLAIM_BUDGET_PCT:.0f}% of keep-all's "
             "peak or lower), where recompute-only pays more than that.", "",
             "Budgets as % of keep-all's whole peak / of its part above the fixed state (POET's accounting: "
             "node outputs only).", "",
             "| model | device | fixed part of peak | least feasible budget | lowest budget within 1% "
             "| paging-dp extra | recompute-only extra | capuchin extra | holds (whole / POET's) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in panels:
        c: dict[str, object] = p["claim"]  # type: ignore[assignment]
        a: dict[str, object] = p["claim_activations"]  # type: ignore[assignment]
        low = ("none" if c["lowest_budget_pct"] is None
               else f"{c['lowest_budget_pct']:.1f}% / {a['lowest_budget_pct']:.1f}%")
        lines.append(f"| {p['model']} b{p['batch']}x{p['size']} | {p['device']} "
                     f"| {p['fixed_pct_of_keep_all_peak']:.1f}% "
                     f"| {c['least_feasible_pct']:.1f}% / {a['least_feasible_pct']:.1f}% | {low} "
                     f"| {_fmt(c.get('paging_dp_extra_pct'))} "
                     f"| {_fmt(c.get('recompute_only_extra_pct'))} | {_fmt(c.get('capuchin_extra_pct'))} "
                     f"| {_VERDICT[c['holds']]} / {_VERDICT[a['holds']]} |")  # type: ignore[index]
    for key, what in (("claim", "whole-step budgets"), ("claim_activations", "POET's accounting")):
        verdicts = [p[key]["holds"] for p in panels]  # type: ignore[index]
        lines.append(f"\nWith {what} the claim holds on {verdicts.count(True)} of {len(panels)} model x device "
                     f"panels, fails on {verdicts.count(False)} and cannot be tested on {verdicts.count(None)} "
                     f"(within 1% down to the least feasible budget, which is above {CLAIM_BUDGET_PCT:.0f}%).")
    lines += ["", "Extras are at the lowest budget within 1%. The fixed part (weights, optimizer state, gradients) "
              "bounds how low any whole-step budget can go."]
    for name, reason in data["skipped_devices"].items():  # type: ignore[attr-defined]
        lines.append(f"- skipped {name}: {reason}")
    host = data.get("host_calibration")
    if host is not None:
        lines.append(f"- this machine's calibration (NOTE [ One time model ]): {host['source']}")  # type: ignore[index]
    lines += ["", *claims_markdown(data["claims"]),  # type: ignore[arg-type]
              "", *sweep_markdown(data["deadline_sweep"])]  # type: ignore[arg-type]
    lines += ["", "Assumptions:", *(f"- {a}" for a in ASSUMPTIONS)]
    return "\n".join(lines) + "\n"


def _sweep_budget(panel: dict[str, object]) -> int:
    top = int(panel["keep_all"]["peak_bytes"])  # type: ignore[index]
    least = int(panel["points"][-1]["budget_bytes"])  # type: ignore[index]
    return round(top - SWEEP_BUDGET_FRACTION * (top - least))


def reproduce_poet(out_dir: str | Path, *, models: Sequence[tuple[str, int, int]] = DEFAULT_MODELS,
                   devices: Sequence[str] = DEFAULT_DEVICES, tiny_models: Sequence[TinyModel] = TINY_MODELS,
                   sweep_panel: tuple[str, str] | None = SWEEP_PANEL, budgets: int = 12, slots: int = 2000,
                   include_milp: bool = False, milp_models: Sequence[str] = ("resnet18",),
                   milp_time_limit_s: float = 60.0, host: HostCalibration | None = None,
                   progress: Progress | None = None) -> PoetFigure:
    """Sweep budgets for every model x device, write ``poet.json``, ``poet.png`` and ``poet.md`` into ``out_dir``.

    Args:
        out_dir: created if missing.
        models: ``(zoo model name, batch, size)``; size is pixels or tokens.
        devices: catalog names the zoo models run on; a device without energy figures is listed
            under ``skipped_devices`` with the catalog's reason.
        tiny_models: models each planned on its own microcontroller, sized so that every budget
            swept fits the board's RAM (NOTE [ Microcontroller panels ]).
        sweep_panel: ``(model, device)`` of the panel whose deadline sweep (energy against runtime
            budget, POET's Fig. 4 shape) is run, at the middle of its budget range; None for none.
        budgets: budgets per panel, from keep-all's peak down to paging-dp's least feasible budget.
        slots: memory units of the DP tables; a schedule may lose one unit per stage to rounding,
            so the default is finer than the planners' 500 (model chains here have ~10 stages).
        include_milp: add POET's MILP for the models in ``milp_models`` (it takes up to
            ``milp_time_limit_s`` per budget); recorded as unavailable when it cannot import.
        host: this machine's calibration, for devices whose training rate is calibrated (NOTE [ One
            time model ]); without it they are skipped.
        progress: called with ``(done, total)`` panels after each one.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profiles, skipped = _profiles([*devices, *(m.device for m in tiny_models if m.device not in devices)], host)
    jobs: list[tuple[str, int, int, Callable[[], Chain], str]] = [
        (model, batch, size, functools.partial(chain_for, model, batch, size), device)
        for model, batch, size in models for device in devices if device in profiles]
    jobs += [(m.name, m.batch, m.size, functools.partial(tiny_chain, m), m.device) for m in tiny_models
             if m.device in profiles]
    panels: list[dict[str, object]] = []
    sweep: dict[str, object] | None = None
    for model, batch, size, make_chain, device in jobs:
        profile = profiles[device]
        scaled = scale_chain(make_chain(), profile)
        milp = _Milp(scaled, profile, milp_time_limit_s) if include_milp and model in milp_models else None
        panel = _panel(model, batch, size, scaled, profile, budgets, slots, milp)
        panel["device_memory_bytes"] = get_device(device).memory_bytes
        panels.append(panel)
        if (model, device) == sweep_panel:
            sweep = {"model": model, "batch": batch, "size": size, "device": device,
                     **deadline_sweep(scaled, profile, _sweep_budget(panel))}
        if progress is not None:
            progress(len(panels), len(jobs))
    strategies = [*STRATEGIES, *(["milp"] if include_milp else [])]
    where = "" if sweep is None else (f"{sweep['model']} b{sweep['batch']}x{sweep['size']} on {sweep['device']} at "
                                      f"{sweep['budget_bytes']:,} B")
    ram = {name: get_device(name).memory_bytes for name in ("mkr1000", "nrf52840")}
    data: dict[str, object] = {
        "strategies": strategies, "slots": slots, "assumptions": list(ASSUMPTIONS),
        "claim": {"tolerance_rel": CLAIM_TOLERANCE, "budget_pct": CLAIM_BUDGET_PCT,
                  "axes": {"claim": WHOLE_STEP, "claim_activations": ACTIVATIONS}},
        "devices": {name: dataclasses.asdict(p) for name, p in profiles.items()},
        "host_calibration": None if host is None else {
            "gemm_fp64_flops_per_s": host.gemm_fp64_flops_per_s, "training_flops_per_s": host.training_flops_per_s,
            "source": host.source},
        "skipped_devices": skipped, "panels": panels, "deadline_sweep": sweep,
        "claims": claims_table(panels, skipped, sweep, where, ram)}
    figure = PoetFigure(out / "poet.json", out / "poet.png", out / "poet.md", data)
    write_atomic(figure.json_path, json.dumps(data, indent=1))
    _plot(data, figure.png_path)
    write_atomic(figure.md_path, "# POET's claim, re-run\n\n" + poet_markdown(data))
    return figure
