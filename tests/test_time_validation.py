"""benchmarks/time_validation.toml: the published step times the time model is checked against are well formed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from edgetrain.core.chain import NOMINAL_FLOPS_PER_S
from edgetrain.devices import get_device
from edgetrain.devices.catalog import tomllib
from edgetrain.models import MODELS
from edgetrain.profiling import chain_for

FIGURES_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "time_validation.toml"
KEYS = {"device", "cite", "model", "published_model", "batch", "image", "classes", "optimizer", "published_total_s",
        "published_steps", "framework", "source", "where", "conditions", "role"}


def _figures() -> list[dict[str, Any]]:
    figures: list[dict[str, Any]] = tomllib.loads(FIGURES_PATH.read_text())["figure"]
    return figures


@pytest.mark.parametrize("figure", _figures(), ids=lambda f: f"{f['device']}-{f['model']}")
def test_figure_names_a_zoo_model_a_catalog_device_and_its_source(figure: dict[str, Any]) -> None:
    assert set(figure) == KEYS
    assert figure["model"] in MODELS
    assert get_device(figure["device"]).name == figure["device"]
    assert "https://" in figure["source"]
    assert figure["published_total_s"] > 0 and figure["published_steps"] >= 1


@pytest.mark.parametrize("figure", [f for f in _figures() if "t_train_batch" in f["where"]],
                         ids=lambda f: f"{f['device']}-{f['model']}")
def test_published_total_and_steps_match_the_per_step_figure_quoted_from_the_source(figure: dict[str, Any]) -> None:
    """Flower's benchmark prints the total time and the per-batch time; our transcription agrees with both."""
    quoted = re.search(r"t_train ([0-9.]+) s, train_batches (\d+), t_train_batch ([0-9.]+)", figure["where"])
    assert quoted is not None
    assert float(quoted.group(1)) == figure["published_total_s"]
    assert int(quoted.group(2)) == figure["published_steps"]
    assert round(figure["published_total_s"] / figure["published_steps"], 2) == float(quoted.group(3))


def test_the_calibration_figure_gives_the_catalog_rate_and_every_other_figure_is_held_out() -> None:
    """rpi4's compute_flops_per_s is exactly our FLOP count of the published ResNet-18 step over its time."""
    calibrations = [f for f in _figures() if f["role"] != "held out"]
    assert [(f["device"], f["model"]) for f in calibrations] == [("rpi4", "resnet18")]
    assert all(f["role"] == "held out" for f in _figures() if f not in calibrations)
    figure = calibrations[0]
    # FLOPs are linear in the batch (every layer's work is per sample), so one sample's count suffices
    step_flops = figure["batch"] * chain_for(figure["model"], 1, figure["image"]).compute_time_s * NOMINAL_FLOPS_PER_S
    published_step_s = figure["published_total_s"] / figure["published_steps"]
    for board in ("rpi4", "rpi4-8gb"):
        assert get_device(board).compute_flops_per_s == pytest.approx(step_flops / published_step_s, rel=1e-9)
