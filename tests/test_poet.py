"""The POET report: a tiny sweep writes its three files, and its numbers obey what the planners promise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calibration import TEST_HOST

from edgetrain.reports.poet import STRATEGIES, PoetFigure, reproduce_poet


@pytest.fixture(scope="module")
def figure(tmp_path_factory: pytest.TempPathFactory) -> PoetFigure:
    calls: list[tuple[int, int]] = []
    out = tmp_path_factory.mktemp("poet")
    result = reproduce_poet(out, models=(("transformer_small", 4, 32), ("resnet18", 2, 128)),
                            devices=("rpi4", "nrf52840", "jetson-tx2"), budgets=3, host=TEST_HOST,
                            progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (4, 4)
    return result


def points(figure: PoetFigure) -> list[dict[str, object]]:
    return [point for panel in figure.data["panels"] for point in panel["points"]]  # type: ignore[attr-defined]


def test_writes_json_plot_and_summary(figure: PoetFigure) -> None:
    for path in (figure.json_path, figure.png_path, figure.md_path):
        assert Path(path).is_file() and Path(path).stat().st_size > 0
    data = json.loads(figure.json_path.read_text())
    assert {"strategies", "assumptions", "devices", "skipped_devices", "panels", "claim"} <= data.keys()
    assert set(data["devices"]) == {"rpi4", "nrf52840"}
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
