"""Figure 1: Pareto curves of peak memory vs recompute factor, and the paper's claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain import keep_all, simulate
from edgetrain.planners import revolve_advances
from edgetrain.profile import linear_resnet
from edgetrain.reports.figure1 import Curve, CurvePoint, linear_curve, reproduce_figure1, resnet_curve


def test_linear_curve_follows_griewank_and_the_paper_convention() -> None:
    curve = linear_curve(18, 1, 224)
    chain = linear_resnet(18, 1, 224)
    first = curve.points[0]
    assert first.recompute_factor == 1.0
    assert first.peak_bytes == simulate(chain, keep_all(18)).peak_bytes
    # ρ = (2l + advances) / 2l with unit forward and backward steps, for every slot count on the front.
    allowed = {1 + revolve_advances(18, s) / 36 for s in range(1, 18)} | {1.0}
    assert all(any(abs(p.recompute_factor - a) < 1e-12 for a in allowed) for p in curve.points)


@pytest.mark.parametrize("build", [linear_curve, resnet_curve])
def test_curves_are_pareto_fronts(build) -> None:  # type: ignore[no-untyped-def]
    curve = build(50, 8, 224)
    factors = [p.recompute_factor for p in curve.points]
    peaks = [p.peak_bytes for p in curve.points]
    assert factors == sorted(factors) and peaks == sorted(peaks, reverse=True)
    assert len(set(peaks)) == len(peaks) > 2


def test_least_factor_within_a_budget() -> None:
    curve = Curve("x", 18, 1, 224, (CurvePoint(1.0, 100, "none"), CurvePoint(1.5, 60, "revolve"),
                                     CurvePoint(2.0, 40, "revolve")))
    assert curve.least_factor_within(100) == 1.0
    assert curve.least_factor_within(59) == 2.0
    assert curve.least_factor_within(39) is None


def test_reproduce_writes_csv_markdown_and_plots(tmp_path: Path) -> None:
    figure = reproduce_figure1(tmp_path, 2 * 2**30, depths=(18,))
    assert len(figure.curves) == 8
    for name in ("figure1.csv", "figure1.md", "figure1_linear.png", "figure1_resnet.png"):
        assert (tmp_path / name).stat().st_size > 0
    text = (tmp_path / "figure1.md").read_text()
    # ResNet-18 at batch 8 and 500 px fits 2 GiB without recomputation (weights, gradients and
    # momentum 3 x 44.6 MiB; docs/accounting.md's 21.2 MiB per 224-px image x 8 x (500/224)^2 ~ 845 MiB).
    assert figure.claim("ResNet (optimal)") == {18: 1.0}
    assert figure.claim_holds("ResNet (optimal)")
    verdict = text.split("### ResNet (optimal)")[1].split("###")[0]
    assert "| 18 | 1.000 |" in verdict and "with ρ > 1.6\": **holds**." in verdict
