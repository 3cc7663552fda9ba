"""The energy cost model: profiles from the catalog, POET's paging formula, rate scaling."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from calibration import TEST_HOST
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edgetrain.core.chain import NOMINAL_FLOPS_PER_S, Chain, StageCost
from edgetrain.costs.energy import EnergyProfile, compute_energy_j, page_energy_j, page_time_s, scale_chain
from edgetrain.costs.timemodel import training_rate
from edgetrain.devices import get_device
from edgetrain.devices.catalog import ENERGY_FIELDS
from edgetrain.errors import EdgetrainError
from edgetrain.profiling import profile

FULL = ["mkr1000", "nrf52840"]
RPI4 = EnergyProfile.from_device(get_device("rpi4"), training_rate(get_device("rpi4"), TEST_HOST))

# Powers of two and small integers throughout, so every expected value is exact in binary.
TOY = EnergyProfile(device_name="toy", compute_flops_per_s=1024.0, compute_power_w=2.0,
                    pagein_latency_s=0.5, pagein_bps=256.0, pagein_power_w=4.0,
                    pageout_latency_s=0.25, pageout_bps=128.0, pageout_power_w=8.0)


def _toy_chain(timed: bool | None) -> Chain:
    stages = (StageCost("a", fwd_time_s=1.0, bwd_time_s=2.0, out_bytes=64, saved_bytes=64),
              StageCost("b", fwd_time_s=0.5, bwd_time_s=0.25, out_bytes=32, saved_bytes=32))
    return Chain(stages=stages, input_bytes=16, name="toy", meta={} if timed is None else {"timed": timed})


@pytest.mark.parametrize("name", FULL)
def test_poet_devices_give_a_profile_with_every_figure(name: str) -> None:
    device = get_device(name)

    energy = EnergyProfile.from_device(device)

    assert energy.device_name == name
    for key in ENERGY_FIELDS:
        assert getattr(energy, key) == getattr(device, key) > 0
        assert "POET" in device.sources[key]


@pytest.mark.parametrize(("name", "missing"), [
    ("jetson-tx2", ["compute_flops_per_s"]),
    ("odroid-xu4", list(ENERGY_FIELDS)),
])
def test_a_device_without_figures_is_refused_naming_them(name: str, missing: list[str]) -> None:
    device = get_device(name)
    for key in missing:
        assert getattr(device, key) is None and device.sources[key].startswith("unknown")

    with pytest.raises(EdgetrainError) as info:
        EnergyProfile.from_device(device)

    message = str(info.value)
    assert name in message
    assert all(key in message for key in missing)
    assert all(key not in message for key in set(ENERGY_FIELDS) - set(missing))


def test_jetson_tx2_has_poets_paging_figures_but_no_compute_rate() -> None:
    tx2 = get_device("jetson-tx2")

    assert (tx2.pagein_latency_s, tx2.pagein_bps, tx2.pageout_latency_s, tx2.pageout_bps) == \
        (0.00054, 108.5e6, 0.002396, 94.37e6)
    assert tx2.compute_power_w == pytest.approx(0.995 - 0.229, rel=1e-12)
    assert tx2.pagein_power_w == tx2.pageout_power_w == 0.309


def test_the_profile_rejects_a_zero_or_negative_figure() -> None:
    with pytest.raises(EdgetrainError, match="pagein_bps must be a finite number > 0"):
        dataclasses.replace(TOY, pagein_bps=0.0)


def test_catalog_figures_reproduce_poets_chipsets() -> None:
    mkr, m4f = (EnergyProfile.from_device(get_device(n)) for n in ("mkr1000", "nrf52840"))
    rpi = RPI4

    # POET's FLOPS_PER_WATT (FLOP per joule) is the inverse of our J per FLOP.
    assert 1 / mkr.compute_j_per_flop == pytest.approx(2000 / (0.012 * 0.020 * 3.3), rel=1e-7)
    assert 1 / m4f.compute_j_per_flop == pytest.approx((16283 * 100 * 1000) / (255.6237 * 0.003328 * 3.3), rel=1e-8)
    assert rpi.compute_power_w == 0.6 * 5  # the rate is LINPACK's (NOTE [ One time model ]), not POET's kernel's
    # POET's energy_sd2ram for a 4000-byte activation on the MKR1000.
    assert page_energy_j(4000, mkr, "in") == pytest.approx((0.109e-3 + 4000 / 4616.51e3) * 0.1 * 3.3, rel=1e-12)
    assert page_energy_j(4000, mkr, "out") == pytest.approx((0.113e-3 + 4000 / 4440e3) * 0.1 * 3.3, rel=1e-12)


def test_page_time_is_latency_plus_bytes_over_bandwidth() -> None:
    assert page_time_s(512, TOY, "in") == 0.5 + 512 / 256 == 2.5
    assert page_time_s(512, TOY, "out") == 0.25 + 512 / 128 == 4.25
    assert page_time_s(0, TOY, "in") == page_time_s(0, TOY, "out") == 0.0


def test_page_energy_is_paging_power_times_page_time() -> None:
    assert page_energy_j(512, TOY, "in") == 4.0 * 2.5 == 10.0
    assert page_energy_j(512, TOY, "out") == 8.0 * 4.25 == 34.0
    assert page_energy_j(0, TOY, "out") == 0.0
    assert TOY.pagein_j_per_byte == 4.0 / 256 and TOY.pageout_j_per_byte == 8.0 / 128
    # Beyond the fixed latency cost, energy grows by exactly j_per_byte per byte.
    assert page_energy_j(1024, TOY, "in") - page_energy_j(512, TOY, "in") == 512 * TOY.pagein_j_per_byte


@pytest.mark.parametrize(("call", "message"), [
    (lambda: page_time_s(-1, TOY, "in"), "n_bytes must be >= 0"),
    (lambda: page_energy_j(8, TOY, "sideways"), "direction must be one of"),  # type: ignore[arg-type]
    (lambda: compute_energy_j(-1.0, TOY), "finite number >= 0"),
])
def test_bad_arguments_raise(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_compute_energy_of_a_toy_chain_by_hand() -> None:
    chain = scale_chain(_toy_chain(timed=True), TOY, host_flops_per_s=4096.0)  # device 4x slower

    assert [(s.fwd_time_s, s.bwd_time_s) for s in chain.stages] == [(4.0, 8.0), (2.0, 1.0)]
    assert chain.compute_time_s == 15.0
    assert compute_energy_j(chain, TOY) == 2.0 * 15.0 == 30.0
    assert [compute_energy_j(s, TOY) for s in chain.stages] == [24.0, 6.0]
    assert compute_energy_j(1.5, TOY) == 3.0
    assert chain.meta == {"timed": True, "scaled_to": "toy", "time_scale": 4.0, "host_flops_per_s": 4096.0}
    assert [s.out_bytes for s in chain.stages] == [64, 32] and chain.input_bytes == 16


@pytest.mark.parametrize("host_flops_per_s", [256.0, 1024.0, 3000.0, 1e9])
def test_scaling_is_proportional_to_the_rate_ratio(host_flops_per_s: float) -> None:
    chain = _toy_chain(timed=True)

    scaled = scale_chain(chain, TOY, host_flops_per_s=host_flops_per_s)

    ratio = host_flops_per_s / TOY.compute_flops_per_s
    for before, after in zip(chain.stages, scaled.stages, strict=False):
        assert after.fwd_time_s == pytest.approx(before.fwd_time_s * ratio, rel=1e-15)
        assert after.bwd_time_s == pytest.approx(before.bwd_time_s * ratio, rel=1e-15)
        assert dataclasses.replace(after, fwd_time_s=0.0, bwd_time_s=0.0) == \
            dataclasses.replace(before, fwd_time_s=0.0, bwd_time_s=0.0)
    assert scaled.compute_time_s == pytest.approx(chain.compute_time_s * ratio, rel=1e-15)


def test_slower_device_costs_more_time_for_the_same_chain() -> None:
    chain = _toy_chain(timed=True)
    mkr, rpi = EnergyProfile.from_device(get_device("mkr1000")), RPI4

    on_mkr = scale_chain(chain, mkr, host_flops_per_s=1e9).compute_time_s
    on_rpi = scale_chain(chain, rpi, host_flops_per_s=1e9).compute_time_s

    assert on_mkr / on_rpi == pytest.approx(rpi.compute_flops_per_s / mkr.compute_flops_per_s, rel=1e-12)


@pytest.mark.parametrize("timed", [True, None])
def test_a_timed_or_unknown_chain_needs_the_host_rate(timed: bool | None) -> None:
    with pytest.raises(EdgetrainError, match="pass host_flops_per_s"):
        scale_chain(_toy_chain(timed=timed), TOY)


def test_a_chain_is_scaled_only_once_and_rates_must_be_positive() -> None:
    once = scale_chain(_toy_chain(timed=True), TOY, host_flops_per_s=2048.0)

    with pytest.raises(EdgetrainError, match="already scaled"):
        scale_chain(once, TOY, host_flops_per_s=2048.0)
    with pytest.raises(EdgetrainError, match="host_flops_per_s must be"):
        scale_chain(_toy_chain(timed=True), TOY, host_flops_per_s=0.0)


def test_an_untimed_chain_becomes_flops_over_the_device_rate() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    chain = profile(model, (8, 16), measure_time=False)
    rpi = RPI4
    assert chain.meta["timed"] is False

    on_rpi = scale_chain(chain, rpi)

    x = torch.randn(8, 16)
    with FlopCounterMode(display=False) as counter:  # the first stage's forward: 2 * 8 * 16 * 32 FLOP
        model[0](x)
    assert counter.get_total_flops() == 2 * 8 * 16 * 32
    assert on_rpi.stages[0].fwd_time_s == pytest.approx(2 * 8 * 16 * 32 / rpi.compute_flops_per_s, rel=1e-12)
    assert compute_energy_j(on_rpi, rpi) == pytest.approx(
        rpi.compute_power_w * chain.compute_time_s * NOMINAL_FLOPS_PER_S / rpi.compute_flops_per_s, rel=1e-12)
