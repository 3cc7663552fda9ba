"""Measuring a device's energy figures on the device: paging fit, compute rate, the device file, the CLI."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
import tomli_w
from torch import nn
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.costs.energy import EnergyProfile, scale_chain
from edgetrain.devices import DeviceCatalogError, get_device, load_devices_file
from edgetrain.devices.catalog import DEVICES_ENV
from edgetrain.errors import EdgetrainError
from edgetrain.models import get_model_spec
from edgetrain.profiling import chain_for
from edgetrain.profiling import device_probe as probe_module
from edgetrain.profiling.device_probe import (
    ComputeProbe,
    PowerMeter,
    PowerRail,
    StorageProbe,
    Transfer,
    TransferFit,
    device_entry,
    fit_transfers,
    measured_powers,
    probe_compute,
    probe_storage,
    write_device_entry,
)

SIZES = (4096, 65536, 1 << 20)
POWERS = {"compute_power_w": 4.0, "pagein_power_w": 0.3, "pageout_power_w": 0.5}


def _exact(direction: str, latency_s: float, bps: float, sizes=SIZES) -> list[Transfer]:
    return [Transfer(direction, n, latency_s + n / bps) for n in sizes for _ in range(2)]  # type: ignore[arg-type]


# --- the fit --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("latency_s", "bps"), [(5.09561e-6, 45.5e6), (4.23532e-3, 17.1e6), (2e-4, 1.2e9)])
def test_the_fit_recovers_latency_and_throughput_of_exact_times(latency_s: float, bps: float) -> None:
    fit = fit_transfers(_exact("out", latency_s, bps))

    assert fit.latency_from == "fit"
    assert fit.latency_s == pytest.approx(latency_s, rel=1e-9)
    assert fit.bps == pytest.approx(bps, rel=1e-9)
    assert fit.transfers == 6


def test_a_fitted_latency_below_zero_becomes_the_smallest_transfers_median() -> None:
    # Times with no latency and a little noise that pushes the intercept below zero.
    transfers = [Transfer("in", 4096, 4096 / 1e8 * 0.9), Transfer("in", 4096, 4096 / 1e8 * 0.95),
                 Transfer("in", 1 << 20, (1 << 20) / 1e8), Transfer("in", 1 << 24, (1 << 24) / 1e8)]

    fit = fit_transfers(transfers)

    assert fit.latency_from == "smallest transfer"
    assert fit.latency_s == pytest.approx(4096 / 1e8 * 0.925)
    assert fit.bps > 0


def test_the_fit_refuses_one_size_and_times_that_shrink_with_size() -> None:
    with pytest.raises(EdgetrainError, match="two sizes"):
        fit_transfers([Transfer("in", 4096, 1e-3)] * 3)
    with pytest.raises(EdgetrainError, match="do not grow with size"):
        fit_transfers([Transfer("in", 4096, 1e-2), Transfer("in", 1 << 20, 1e-3)])


# --- storage --------------------------------------------------------------------------------------

WRITE, READ = (4e-3, 17.1e6), (5e-6, 45.5e6)   # (latency s, bytes/s) the steady storage reports


@pytest.fixture
def steady_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real file I/O whose reported time is ``latency + bytes / bps``: a 4 KiB fsync on this shared machine
    can outlast a 4 MiB one, which the fit rightly refuses, so tests must not depend on its noise."""
    for name, (latency, bps) in (("_write_synced", WRITE), ("_read_into", READ)):
        real = getattr(probe_module, name)
        monkeypatch.setattr(probe_module, name, lambda path, data, real=real, latency=latency, bps=bps:
                            (real(path, data), latency + len(data) / bps)[1])


def test_probing_storage_times_every_transfer_and_leaves_nothing(tmp_path: Path, steady_storage: None) -> None:
    done: list[tuple[int, int]] = []

    probe = probe_storage(tmp_path, sizes=(4096, 4 << 20), repeats=2, progress=lambda i, n: done.append((i, n)))

    assert [(t.direction, t.n_bytes) for t in probe.transfers] == [
        (d, n) for n in (4096, 4 << 20, 4096, 4 << 20) for d in ("out", "in")]
    assert all(t.seconds > 0 for t in probe.transfers)
    assert probe.pagein.bps > 0 and probe.pageout.bps > 0
    assert probe.pagein.latency_s > 0 and probe.pageout.latency_s > 0
    assert (probe.pageout.latency_s, probe.pageout.bps) == pytest.approx(WRITE, rel=1e-9)
    assert (probe.pagein.latency_s, probe.pagein.bps) == pytest.approx(READ, rel=1e-9)
    assert done == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert list(tmp_path.iterdir()) == []
    assert json.loads(json.dumps(probe.to_dict()))["directory"] == str(tmp_path.resolve())


def test_probing_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(EdgetrainError, match="does not exist"):
        probe_storage(tmp_path / "no-such-dir")


def test_a_full_disk_while_probing_is_a_clear_error_and_leaves_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)

    with pytest.raises(EdgetrainError, match="No space left on device"):
        probe_storage(tmp_path, sizes=(4096, 8192), repeats=1)
    assert list(tmp_path.iterdir()) == []


def test_probing_refuses_fewer_than_two_sizes(tmp_path: Path) -> None:
    with pytest.raises(EdgetrainError, match="two distinct"):
        probe_storage(tmp_path, sizes=(4096, 4096))


# --- compute --------------------------------------------------------------------------------------

def test_the_measured_rate_makes_the_planner_predict_the_measured_step() -> None:
    probe = probe_compute("resnet18", 2, 32, repeats=2)
    profile = EnergyProfile("probe", probe.flops_per_s, 1.0, 1e-3, 1e7, 0.1, 1e-3, 1e7, 0.1)

    scaled = scale_chain(chain_for("resnet18", 2, 32), profile)

    assert len(probe.steps_s) == 2 and all(s > 0 for s in probe.steps_s)
    assert scaled.compute_time_s == pytest.approx(probe.step_s, rel=1e-12)
    # The FLOPs the rate divides: counted a second way, on a real step of the whole model ...
    from torch.utils.flop_counter import FlopCounterMode

    spec = get_model_spec("resnet18")
    net = spec.build()
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(net(spec.example_input(2, 32)), spec.example_target(2)).backward()
    assert probe.flops == pytest.approx(counter.get_total_flops(), rel=1e-12)
    # ... and by hand for the stem's convolution: 2 x batch 2 x 64 x 16 x 16 outputs x 3 x 7 x 7 MACs.
    assert scaled.stages[0].fwd_time_s * profile.compute_flops_per_s == pytest.approx(2 * 2 * 64 * 16 * 16 * 3 * 7 * 7)


# --- power sensors --------------------------------------------------------------------------------

def _sensor(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    return path


def test_a_rail_reads_a_power_file_or_a_voltage_current_product_in_watts(tmp_path: Path) -> None:
    power = _sensor(tmp_path / "in_power0_input", "5000")          # mW
    volts = _sensor(tmp_path / "in1_input", "5000")                 # mV
    amps = _sensor(tmp_path / "curr1_input", "2000")                # mA
    micro = _sensor(tmp_path / "power1_input", "12000000")          # µW

    assert PowerRail.parse(str(power)).read_w() == 5.0
    assert PowerRail.parse(f"{volts}*{amps}").read_w() == 10.0
    assert PowerRail.parse(f"{micro}@1e-6").read_w() == 12.0
    assert PowerMeter((PowerRail.parse(str(power)), PowerRail.parse(f"{micro}@1e-6"))).read_w() == 17.0


@pytest.mark.parametrize("spec", ["a*b*c", "a@zero", "a@0", "a@-1", "*b"])
def test_a_bad_rail_spec_is_refused(spec: str) -> None:
    with pytest.raises(EdgetrainError, match="power sensor"):
        PowerRail.parse(spec)


def test_an_unreadable_sensor_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EdgetrainError, match="cannot read power sensor"):
        PowerRail.parse(str(tmp_path / "missing")).read_w()
    with pytest.raises(EdgetrainError, match="cannot read power sensor"):
        PowerRail.parse(str(_sensor(tmp_path / "text", "n/a"))).read_w()


def test_sampling_reads_at_entry_and_exit_and_averages_a_constant_exactly(tmp_path: Path) -> None:
    meter = PowerMeter((PowerRail.parse(str(_sensor(tmp_path / "p", "4250"))),), interval_s=0.001)
    samples: list[float] = []

    with meter.sampling(samples):
        time.sleep(0.02)

    assert len(samples) >= 2 and set(samples) == {4.25}
    assert meter.idle_w(0.01) == 4.25


def test_a_sensor_that_vanishes_while_sampling_fails_the_phase(tmp_path: Path) -> None:
    path = _sensor(tmp_path / "p", "1000")
    meter = PowerMeter((PowerRail.parse(str(path)),), interval_s=0.001)

    with pytest.raises(EdgetrainError, match="cannot read power sensor"), meter.sampling([]):
        path.unlink()
        time.sleep(0.01)


def _sampled(compute_w: tuple[float, ...], in_w: tuple[float, ...], out_w: tuple[float, ...]) -> tuple:
    compute = ComputeProbe("resnet18", 8, 64, 7e9, (0.5,), 4, compute_w)
    storage = StorageProbe("/mnt/sd", "vfat", True, TransferFit(5e-6, 45.5e6, "fit", 6),
                           TransferFit(4e-3, 17.1e6, "fit", 6), (), in_w, out_w)
    return compute, storage


def test_measured_powers_are_phase_means_above_idle_or_whole(tmp_path: Path) -> None:
    meter = PowerMeter((PowerRail.parse(str(tmp_path / "p")),))
    compute, storage = _sampled((6.0, 8.0), (4.5,), (5.0, 6.0))

    above, above_source = measured_powers(meter, compute=compute, storage=storage, idle_w=4.0)
    whole, whole_source = measured_powers(meter, compute=compute, storage=storage, idle_w=None)

    assert above == {"compute_power_w": 3.0, "pagein_power_w": 0.5, "pageout_power_w": 1.5}
    assert whole == {"compute_power_w": 7.0, "pagein_power_w": 4.5, "pageout_power_w": 5.5}
    assert "above the idle mean" in above_source and "idle included" in whole_source
    with pytest.raises(EdgetrainError, match="not above idle"):
        measured_powers(meter, compute=compute, storage=storage, idle_w=5.0)


# --- the device entry and file --------------------------------------------------------------------

def _storage() -> StorageProbe:
    return StorageProbe("/mnt/sd", "vfat", True, TransferFit(5e-6, 45.5e6, "fit", 6),
                        TransferFit(4e-3, 17.1e6, "smallest transfer", 6), tuple(_exact("in", 5e-6, 45.5e6)))


def _compute() -> ComputeProbe:
    return ComputeProbe("resnet18", 8, 64, 7e9, (0.5, 0.4, 0.6), 4)


def test_a_measured_entry_round_trips_through_a_device_file_into_an_energy_profile(tmp_path: Path) -> None:
    entry = device_entry("my-xu4", storage=_storage(), compute=_compute(), powers=POWERS,
                         power_source="USB meter", when="2026-11-21")
    path = tmp_path / "devices.toml"
    path.write_text(tomli_w.dumps({"devices": {"my-xu4": entry}}))

    device = load_devices_file(path)["my-xu4"]
    profile = EnergyProfile.from_device(device)

    assert profile.compute_flops_per_s == 7e9 / 0.5
    assert (profile.pagein_latency_s, profile.pagein_bps) == (5e-6, 45.5e6)
    assert (profile.pageout_latency_s, profile.pageout_bps) == (4e-3, 17.1e6)
    assert (profile.compute_power_w, profile.pagein_power_w, profile.pageout_power_w) == (4.0, 0.3, 0.5)
    assert "upper bound" in device.sources["pageout_latency_s"]
    assert "USB meter" in device.sources["compute_power_w"]


def test_without_powers_the_entry_says_so_and_energy_planning_names_them(tmp_path: Path) -> None:
    device = write_device_entry(tmp_path / "d.toml", "b", device_entry("b", storage=_storage(), compute=_compute(),
                                                                       powers={}, power_source=None))

    assert device.compute_power_w is None
    assert device.sources["compute_power_w"].startswith("unknown:")
    with pytest.raises(EdgetrainError, match="compute_power_w, pagein_power_w, pageout_power_w") as refused:
        EnergyProfile.from_device(device)
    assert "edgetrain bench device" in str(refused.value)


def test_powers_need_a_source_and_a_positive_value() -> None:
    with pytest.raises(EdgetrainError, match="need a source"):
        device_entry("b", storage=None, compute=None, powers={"compute_power_w": 3.0}, power_source=" ")
    with pytest.raises(EdgetrainError, match="positive number"):
        device_entry("b", storage=None, compute=None, powers={"compute_power_w": 0.0}, power_source="meter")


def test_writing_an_entry_keeps_the_files_other_devices_and_refuses_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "devices.toml"
    write_device_entry(path, "first", device_entry("first", storage=None, compute=_compute(), powers={},
                                                   power_source=None))
    write_device_entry(path, "second", device_entry("second", storage=_storage(), compute=None, powers={},
                                                    power_source=None))

    assert list(load_devices_file(path)) == ["first", "second"]
    assert not list(tmp_path.glob("*.partial"))
    path.write_text("[devices.x]\ntitle = 'x'\n")
    with pytest.raises(DeviceCatalogError, match="lacks required"):
        write_device_entry(path, "third", device_entry("third", storage=None, compute=None, powers={},
                                                       power_source=None))


def test_a_user_device_file_replaces_a_shipped_device_of_the_same_name(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "devices.toml"
    write_device_entry(path, "odroid-xu4", device_entry("odroid-xu4", storage=_storage(), compute=_compute(),
                                                        powers=POWERS, power_source="meter"))
    assert get_device("odroid-xu4").compute_flops_per_s is None

    monkeypatch.setenv(DEVICES_ENV, str(path))

    assert get_device("odroid-xu4").compute_flops_per_s == 7e9 / 0.5
    assert EnergyProfile.from_device(get_device("odroid-xu4")).pageout_bps == 17.1e6


# --- the command ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_bench_device_writes_a_file_the_energy_planner_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            steady_storage: None) -> None:
    monkeypatch.setenv(DEVICES_ENV, "")   # restored after the test: the command sets it in this process
    runner = CliRunner()
    path = tmp_path / "devices.toml"
    page_dir = tmp_path / "sd"
    page_dir.mkdir()

    measured = runner.invoke(app, [
        "bench", "device", "--name", "probe-board", "--page-dir", str(page_dir), "--sizes", "4KiB,4MiB",
        "--repeats", "1", "--model", "resnet18", "--batch", "2", "--image", "32", "--steps", "1",
        "--gemm-seconds", "0.1", "--compute-power-w", "5", "--pagein-power-w", "0.4", "--pageout-power-w", "0.6",
        "--power-source", "test figures", "--output", str(path), "--json"])
    assert measured.exit_code == 0, measured.output
    report = json.loads(measured.output)
    planned = runner.invoke(app, ["--devices-file", str(path), "plan", "-m", "resnet18", "-b", "2", "--image", "32",
                                  "--device", "probe-board", "--objective", "energy", "--json"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)

    assert report["device"]["compute_flops_per_s"] == report["compute"]["compute_flops_per_s"]
    assert report["device"]["pageout_bps"] == pytest.approx(WRITE[1], rel=1e-9)
    # the microbenchmark the time model calibrates with (NOTE [ One time model ]), measured too
    assert report["device"]["gemm_fp64_flops_per_s"] > 0
    assert report["device"]["sources"]["gemm_fp64_flops_per_s"].startswith("measured by `edgetrain bench device`")
    assert list(page_dir.iterdir()) == []
    assert plan["device"] == "probe-board"
    # Keep-all fits the board's memory, so the plan is one plain step: the measured one.
    assert plan["predicted_time_s"] == pytest.approx(report["compute"]["step_s"], rel=1e-9)
    assert plan["energy_compute_j"] == pytest.approx(5.0 * report["compute"]["step_s"], rel=1e-9)


def test_bench_device_measures_powers_from_a_sensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    steady_storage: None) -> None:
    monkeypatch.setenv(DEVICES_ENV, "")
    sensor = _sensor(tmp_path / "in_power0_input", "3500")
    path = tmp_path / "devices.toml"
    common = ["bench", "device", "--name", "rails", "--page-dir", str(tmp_path), "--sizes", "4KiB,4MiB",
              "--repeats", "1", "--model", "resnet18", "--batch", "2", "--image", "32", "--steps", "1",
              "--gemm-seconds", "0.1", "--power-sensor", str(sensor), "--idle-s", "0.02", "--output", str(path)]

    whole = CliRunner().invoke(app, [*common, "--whole-power", "--json"])
    flat = CliRunner().invoke(app, common)   # a constant rail is never above its idle

    assert whole.exit_code == 0, whole.output
    device = json.loads(whole.output)["device"]
    assert (device["compute_power_w"], device["pagein_power_w"], device["pageout_power_w"]) == (3.5, 3.5, 3.5)
    assert "idle included" in device["sources"]["compute_power_w"]
    assert flat.exit_code == 2 and "not above idle" in flat.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["devices.toml", "in_power0_input"]


def test_the_device_list_shows_a_device_files_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICES_ENV, "")
    path = tmp_path / "devices.toml"
    write_device_entry(path, "my-board", device_entry("my-board", storage=_storage(), compute=_compute(),
                                                      powers=POWERS, power_source="meter"))

    listed = CliRunner().invoke(app, ["--devices-file", str(path), "devices", "--json"])

    assert listed.exit_code == 0, listed.output
    names = [d["name"] for d in json.loads(listed.output)]
    assert "my-board" in names and names[-1] == "this-machine"
