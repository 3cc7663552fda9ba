"""The POET report: a tiny sweep writes its three files, and its numbers obey what the planners promise."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from calibration import TEST_HOST
from typer.testing import CliRunner

from edgetrain.bench import read_result
from edgetrain.cli import main
from edgetrain.core.chain import Chain
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile, scale_chain
from edgetrain.costs.timemodel import training_rate
from edgetrain.devices import get_device
from edgetrain.planners.capuchin import capuchin
from edgetrain.planners.dp.paging import solve_paging
from edgetrain.planners.energy_plan import plan_energy
from edgetrain.profiling.estimate import chain_for
from edgetrain.profiling.host import CALIBRATION_ENV
from edgetrain.reports.poet import STRATEGIES, PoetFigure, poet_markdown, reproduce_poet
from edgetrain.reports.poet_claims import (
    DEADLINE_FACTORS,
    POET_LINEAR_WIDTHS,
    TINY_MODELS,
    claims_markdown,
    sweep_markdown,
)


@pytest.fixture(scope="module")
def figure(tmp_path_factory: pytest.TempPathFactory) -> PoetFigure:
    calls: list[tuple[int, int]] = []
    out = tmp_path_factory.mktemp("poet")
    result = reproduce_poet(out, models=(("transformer_small", 4, 32), ("resnet18", 2, 128)),
                            devices=("rpi4", "jetson-tx2"), budgets=3, host=TEST_HOST, sweep_panel=("resnet18", "rpi4"),
                            progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (4, 4)
    return result


def points(figure: PoetFigure) -> list[dict[str, object]]:
    return [point for panel in figure.data["panels"] for point in panel["points"]]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_writes_json_plot_and_summary(figure: PoetFigure) -> None:
    for path in (figure.json_path, figure.png_path, figure.md_path):
        assert Path(path).is_file() and Path(path).stat().st_size > 0
    data = json.loads(figure.json_path.read_text())
    assert {"strategies", "assumptions", "devices", "skipped_devices", "panels", "claim"} <= data.keys()
    assert set(data["devices"]) == {"rpi4", "mkr1000", "nrf52840"}   # the boards of the tiny models too
    panel = data["panels"][0]
    assert {"model", "device", "keep_all", "fixed_pct_of_keep_all_peak", "points", "claim"} <= panel.keys()
    assert len(data["panels"]) == 4 and all(len(p["points"]) == 3 for p in data["panels"])
    point = panel["points"][0]
    assert point["budget_pct_of_keep_all_peak"] == pytest.approx(100.0)
    assert set(point["strategies"]) == set(STRATEGIES)
    assert {"energy_j", "time_s", "peak_bytes", "energy_rel_keep_all"} <= point["strategies"]["paging-dp"].keys()
    assert "POET" in figure.md_path.read_text()


def test_poets_accounting_counts_the_budget_above_the_fixed_state(figure: PoetFigure) -> None:
    for panel in figure.data["panels"]:  # type: ignore[attr-defined]
        top, fixed = panel["keep_all"]["peak_bytes"], panel["fixed_bytes"]
        for point in panel["points"]:
            assert point["activation_budget_pct"] == pytest.approx(
                100.0 * (point["budget_bytes"] - fixed) / (top - fixed), rel=1e-12)
        assert panel["points"][0]["activation_budget_pct"] == pytest.approx(100.0)
        whole, poets = panel["claim"], panel["claim_activations"]
        assert poets["least_feasible_pct"] == pytest.approx(panel["points"][-1]["activation_budget_pct"])
        assert poets["least_feasible_pct"] <= whole["least_feasible_pct"]   # the fixed part is left out
        if whole["lowest_budget_pct"] is not None:   # the same point, read on the other axis
            assert poets["paging_dp_extra_pct"] == whole["paging_dp_extra_pct"]


def test_a_device_without_energy_figures_is_skipped_with_its_reason(figure: PoetFigure) -> None:
    reason = figure.data["skipped_devices"]["jetson-tx2"]  # type: ignore[index]
    assert "compute_flops_per_s" in reason
    assert "jetson-tx2" in figure.md_path.read_text()


def test_no_strategy_beats_the_unconstrained_step(figure: PoetFigure) -> None:
    for point in points(figure):
        for found in point["strategies"].values():  # type: ignore[attr-defined]
            if found is not None:
                assert found["energy_rel_keep_all"] >= 1 - 1e-9
                assert found["peak_bytes"] <= point["budget_bytes"]


def test_paging_dp_is_never_beaten_where_both_fit(figure: PoetFigure) -> None:
    for point in points(figure):
        strategies = point["strategies"]
        best = strategies["paging-dp"]  # type: ignore[index]
        assert best is not None   # budgets go down to paging-dp's own least budget
        for found in strategies.values():  # type: ignore[attr-defined]
            if found is not None:
                assert best["energy_j"] <= found["energy_j"] * (1 + 1e-9)


# The claims table, the deadline sweep and the microcontroller panels (NOTE [ POET's results and where each
# comes from ]): every "ours" figure is what a direct planner call on the same setting gives.

def device_chain(model: str, batch: int, size: int, device: str) -> tuple[Chain, EnergyProfile]:
    found = get_device(device)
    profile = EnergyProfile.from_device(found, training_rate(found, TEST_HOST))
    return scale_chain(chain_for(model, batch, size), profile), profile


def claim(figure: PoetFigure, name: str) -> dict[str, object]:
    return next(row for row in figure.data["claims"] if row["id"] == name)  # type: ignore[attr-defined]


def test_fig5_rows_are_direct_planner_calls(figure: PoetFigure) -> None:
    chain, profile = device_chain("resnet18", 2, 128, "rpi4")
    base = simulate(chain, keep_all(chain.length), profile).energy_j or 0.0
    capuchin_row, poet_row = claim(figure, "fig5-capuchin"), claim(figure, "fig5-poet")
    found = capuchin_row["values"]
    assert found is not None   # this setting has a budget below keep-all that capuchin fits
    for key in ("min", "max"):
        stats = simulate(chain, capuchin(chain, profile, found[f"{key}_budget_bytes"]), profile)  # type: ignore[index]
        assert 100 * ((stats.energy_j or 0.0) / base - 1) == pytest.approx(found[f"{key}_extra_pct"], abs=1e-9)  # type: ignore[index]
    table = solve_paging(chain, profile, simulate(chain, keep_all(chain.length)).peak_bytes, slots=2000)
    dp = poet_row["values"]
    assert dp is not None
    for key in ("min", "max"):
        stats = simulate(chain, table.schedule(dp[f"{key}_budget_bytes"]), profile)  # type: ignore[index]
        assert 100 * ((stats.energy_j or 0.0) / base - 1) == pytest.approx(dp[f"{key}_extra_pct"], abs=1e-9)  # type: ignore[index]
    assert dp["max_extra_pct"] <= found["max_extra_pct"] + 1e-9  # type: ignore[index, operator]


def test_deadline_sweep_is_each_planner_call_and_never_costs_more_for_more_time(figure: PoetFigure) -> None:
    sweep: dict[str, object] = figure.data["deadline_sweep"]  # type: ignore[assignment]
    chain, profile = device_chain("resnet18", 2, 128, "rpi4")
    base_s = simulate(chain, keep_all(chain.length), profile).time_s
    assert sweep["base_time_s"] == pytest.approx(base_s, rel=1e-12)
    factors: list[float | None] = sweep["factors"]  # type: ignore[assignment]
    assert factors == list(DEADLINE_FACTORS)
    for strategy, points in sweep["series"].items():  # type: ignore[attr-defined]
        for factor, point in zip(factors, points, strict=True):
            direct = plan_energy(chain, profile, sweep["budget_bytes"], strategy=strategy,  # type: ignore[arg-type]
                                 deadline_s=None if factor is None else factor * base_s)
            if point is None:
                assert not direct.deadline_met
                continue
            assert point["energy_j"] == direct.stats.energy_j and point["time_s"] == direct.stats.time_s
            assert factor is None or point["time_s"] <= factor * base_s * (1 + 1e-12)
        met = [p["energy_j"] for p in points if p is not None]
        assert met == sorted(met, reverse=True), strategy   # more time allowed: energy never higher
    dp = sweep["series"]["paging-dp"]  # type: ignore[index]
    assert dp[-1] is not None and dp[0] is None   # no deadline: fits; 1x keep-all's time below its peak: cannot
    assert "runtime budget" in figure.md_path.read_text()


def test_microcontroller_panels_fit_the_board(figure: PoetFigure) -> None:
    tiny = {m.name: m for m in TINY_MODELS}
    panels = [p for p in figure.data["panels"] if p["model"] in tiny]  # type: ignore[attr-defined]
    assert {(p["model"], p["device"]) for p in panels} == {(m.name, m.device) for m in TINY_MODELS}
    for panel in panels:
        ram = get_device(panel["device"]).memory_bytes
        assert panel["device_memory_bytes"] == ram
        assert panel["keep_all"]["peak_bytes"] <= ram
        assert all(p["budget_bytes"] <= ram for p in panel["points"])
        assert panel["points"][-1]["budget_bytes"] < panel["keep_all"]["peak_bytes"]   # something to plan
    row = claim(figure, "mcu-panels")
    assert {v["model"] for v in row["values"]} == set(tiny)  # type: ignore[attr-defined]
    assert all(panel["model"] not in {"resnet18", "transformer_small"} for panel in figure.data["panels"]  # type: ignore
               if panel["device"] in {"mkr1000", "nrf52840"})


def test_poets_own_microcontroller_examples_against_the_board(figure: PoetFigure) -> None:
    linear = claim(figure, "repo-linear-m0")["values"]
    widths = POET_LINEAR_WIDTHS
    params = sum(a * b + b for a, b in itertools.pairwise(widths))
    assert params == 43_590 and linear["weights_bytes"] == 4 * params  # type: ignore[index]
    assert linear["keep_all_peak_bytes"] > linear["ram_bytes"] == 32_768  # type: ignore[index, operator]
    m4 = claim(figure, "readme-m4")["values"]
    assert m4["budget_over_ram"] == pytest.approx(737_719 / 262_144)  # type: ignore[index]
    assert m4["weights_bytes"] >= 4 * 11_173_962   # resnet18_cifar's parameters, FP32  # type: ignore[index, operator]


def test_claims_table_is_in_every_output(figure: PoetFigure) -> None:
    rows: list[dict[str, object]] = figure.data["claims"]  # type: ignore[assignment]
    assert [r["id"] for r in rows] == ["fig5-capuchin", "fig5-poet", "table3-pofo", "fig4-deadline",
                                       "table2-devices", "models", "readme-m4", "repo-linear-m0", "mcu-panels"]
    assert claim(figure, "models")["values"] == {
        "matched": {"resnet18": "resnet18", "resnet50": "resnet50", "resnet18_cifar": "resnet18_cifar",
                    "bert": "transformer"}, "missing": ["linear", "transformer", "vgg16", "vgg16_cifar"]}
    assert claim(figure, "table2-devices")["values"] == {"planned": ["mkr1000", "nrf52840", "rpi4"],
                                                         "skipped": ["jetson-tx2"]}
    text, saved = figure.md_path.read_text(), json.loads(figure.json_path.read_text())["claims"]
    assert saved == rows
    for row in rows:
        assert all(row[k] for k in ("source", "published", "ours"))
        assert str(row["ours"]).replace("|", "/") in text


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "poet.json"   # the committed run of `python -m benchmarks run poet`
PAGE = ROOT / "docs" / "results" / "poet.md"               # its results page


def test_the_docs_tables_are_the_reports_own() -> None:
    """docs/results/poet.md's claims and sweep tables are what the committed results render to."""
    data, text = read_result(RESULTS).result, PAGE.read_text()
    for line in [*claims_markdown(data["claims"]), *sweep_markdown(data["deadline_sweep"])]:
        assert line in text.splitlines()


@pytest.mark.slow
def test_the_docs_report_regenerates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command docs/guide/reproduce.md gives writes the committed report, whatever this machine's calibration."""
    # every device of the report has a rate measured on the board, so this machine's calibration plays no part
    committed = read_result(RESULTS).result
    assert committed["host_calibration"] is None
    monkeypatch.setenv(CALIBRATION_ENV, "1e9,1e8")
    with CliRunner().isolation():
        try:
            main(["reproduce", "poet", "--out", str(tmp_path)])
        except SystemExit as exit_:
            assert exit_.code in (0, None)
    assert (tmp_path / "poet.md").read_text() == "# POET's claim, re-run\n\n" + poet_markdown(committed)
