"""One time model (NOTE [ One time model ]): the same device and schedule give one time whatever the objective."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from calibration import TEST_HOST
from test_cli import run

from edgetrain.core.chain import NOMINAL_FLOPS_PER_S
from edgetrain.costs.timemodel import HostCalibration, training_rate
from edgetrain.devices import get_device
from edgetrain.errors import EdgetrainError
from edgetrain.profiling import chain_for
from edgetrain.profiling import host as rate
from edgetrain.profiling.host import (
    CACHE_DIR_ENV,
    CALIBRATION_ENV,
    calibration_cache_path,
    host_calibration,
    probe_gemm,
)


def plan_json(device: str, *extra: str) -> dict[str, object]:
    code, out, err = run("plan", "-m", "resnet18", "-b", "2", "--image", "64", "--device", device,
                         "--memory", "2GiB", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_both_objectives_give_the_same_time_for_the_same_device_and_schedule() -> None:
    fastest, least_energy = plan_json("rpi4"), plan_json("rpi4", "--objective", "energy")
    flops = chain_for("resnet18", 2, 64).compute_time_s * NOMINAL_FLOPS_PER_S

    assert fastest["params"] == {"segments": 1} and least_energy["params"] == {"paging": False, "recompute": False}
    assert fastest["predicted_time_s"] == least_energy["predicted_time_s"]
    # the rate measured on the board (a published ResNet-18 step), whatever this machine's calibration
    rate_flops_per_s = get_device("rpi4").compute_flops_per_s
    assert fastest["training_flops_per_s"] == least_energy["training_flops_per_s"] == rate_flops_per_s
    assert fastest["predicted_time_s"] == pytest.approx(flops / rate_flops_per_s, rel=1e-12)
    assert least_energy["energy_j"] == pytest.approx(3.0 * flops / rate_flops_per_s, rel=1e-12)  # 3 W x the time


def test_a_device_without_a_sourced_rate_has_no_time() -> None:
    report = plan_json("odroid-xu4")

    assert report["predicted_time_s"] is None and report["training_flops_per_s"] is None
    assert report["baseline"]["time_s"] is None  # type: ignore[index]
    assert str(report["time_source"]).startswith("unknown: device 'odroid-xu4' has no measured training rate")


def test_no_device_means_no_time() -> None:
    code, out, err = run("plan", "-m", "resnet18", "-b", "2", "--image", "64", "--memory", "1GiB", "--json")
    assert code == 0, err
    assert json.loads(out)["predicted_time_s"] is None


def test_training_rate_is_measured_calibrated_or_unknown() -> None:
    rpi, mkr, nano = get_device("rpi4"), get_device("mkr1000"), get_device("jetson-nano")
    linpack_only = dataclasses.replace(rpi, compute_flops_per_s=None)  # a board known only by its LINPACK

    calibrated = training_rate(linpack_only, TEST_HOST)
    assert calibrated is not None and calibrated.flops_per_s == 15.5e9 * 10e9 / 20e9
    assert "LINPACK" in calibrated.source and "Mwase, Kahira, Zou" in calibrated.source
    for board in (rpi, mkr):  # a rate measured on the board is used as it is, without calibration
        measured = training_rate(board)
        assert measured is not None and measured.flops_per_s == board.compute_flops_per_s
        assert measured.source.startswith("measured on the device")
    assert training_rate(nano, TEST_HOST) is None
    with pytest.raises(EdgetrainError, match="needs this machine's calibration"):
        training_rate(linpack_only)


def test_the_calibration_rejects_non_positive_rates() -> None:
    with pytest.raises(EdgetrainError, match="gemm_fp64_flops_per_s must be a finite number > 0"):
        HostCalibration(0.0, 1e9, "bad")


def test_the_gemm_probe_counts_two_n_cubed_flops_per_product() -> None:
    probe = probe_gemm(64, 0.01)

    assert probe.products >= 1 and probe.elapsed_s >= 0.01
    assert probe.flops == 2 * 64**3 * probe.products
    assert probe.flops_per_s == probe.flops / probe.elapsed_s
    with pytest.raises(EdgetrainError, match="n >= 1 and seconds > 0"):
        probe_gemm(0, 1.0)


def test_a_given_calibration_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CALIBRATION_ENV, "3e10,1.5e10")
    assert host_calibration().efficiency == 0.5
    monkeypatch.setenv(CALIBRATION_ENV, "fast")
    with pytest.raises(EdgetrainError, match="must be 'GEMM_FLOPS_PER_S,TRAINING_FLOPS_PER_S'"):
        host_calibration()


def test_a_measured_calibration_is_kept_per_machine_and_reused(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    # Prepare: no calibration given, a cache folder of the test's own, a measurement that counts its calls.
    monkeypatch.delenv(CALIBRATION_ENV)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    measured: list[int] = []

    def measure() -> HostCalibration:
        measured.append(1)
        return HostCalibration(4e10, 1e10 * len(measured), "measured by the test")

    monkeypatch.setattr(rate, "calibrate_host", measure)
    # Execute / Assert: measured once, then the same figures from the file, whatever the process.
    first, second = host_calibration(), host_calibration()
    assert len(measured) == 1 and calibration_cache_path() == tmp_path / "host_calibration.json"
    assert (second.gemm_fp64_flops_per_s, second.training_flops_per_s) == (4e10, 1e10)
    assert first.source == "measured by the test" and second.source.startswith("measured by the test, ")
    assert str(calibration_cache_path()) in second.source
    # Another thread count is another machine for the time model: measured again; a broken file too.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert host_calibration().training_flops_per_s == 2e10 and len(measured) == 2
    finally:
        torch.set_num_threads(threads)
    calibration_cache_path().write_text("{not json")
    assert host_calibration().training_flops_per_s == 3e10 and len(measured) == 3
