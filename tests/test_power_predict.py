"""The mode model, the advisor and the simulator it is scored against; real thread x quota modes where cgroups allow."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

import pytest
from test_cli import run
from test_power_modes import fake_board, snapshot

from edgetrain.bench.stats import spread
from edgetrain.errors import EdgetrainError
from edgetrain.power.advice import board_grid, measure_board, read_profiles
from edgetrain.power.cgroup_modes import (
    CGROUP_CPU,
    QuotaMode,
    cpu_quota_cgroup,
    quota_grid,
    quota_unavailable_reason,
    time_step_in_mode,
)
from edgetrain.power.control import Board, PowerControlUnavailable
from edgetrain.power.ground_truth import SimWorkload, device_grid, score_device, true_power_w, true_time_s
from edgetrain.power.predict import (
    ModePoint,
    Profile,
    advise,
    choose_profile_modes,
    fit_mode_model,
    mape_percent,
    profile_adaptively,
)

GRID = [ModePoint(f"{c}c{f}{e}", c, f, e) for c, f, e in itertools.product(
    (1, 2, 3, 4), (0.4e9, 0.8e9, 1.2e9, 1.6e9), (0.8e9, 1.6e9))]


def exact_parts(mode: ModePoint) -> tuple[float, float, float]:
    """A workload that is exactly of the model's form: 5 ms fixed, 0.02 serial, 0.4 parallel, 0.05 memory gigacycles
    (the fixed, CPU and memory parts of its step, in seconds)."""
    ghz = mode.cpu_hz / 1e9
    return 0.005, 0.02 / ghz + 0.4 / (mode.cores * ghz), 0.05 / (mode.emc_hz / 1e9)


def exact_time(mode: ModePoint) -> float:
    return sum(exact_parts(mode))


def exact_power(mode: ModePoint) -> float:
    """1.5 W static, 2 W dynamic per core at the top clock when busy, 0.3 W leakage per core, 0.5 W/GHz memory."""
    _, cpu_s, memory_s = exact_parts(mode)
    busy, moving = cpu_s / exact_time(mode), memory_s / exact_time(mode)
    f = mode.cpu_hz / 1.6e9
    volts = 0.6 + 0.4 * f
    return 1.5 + 2.0 * mode.cores * f * volts**2 * busy + 0.3 * mode.cores * volts + 0.5 * mode.emc_hz / 1e9 * moving


def test_six_profiles_recover_an_exact_model_everywhere() -> None:
    chosen = choose_profile_modes(GRID, 6)
    assert len(set(chosen)) == 6
    model = fit_mode_model([Profile(m, exact_time(m), exact_power(m)) for m in chosen], 1.6e9)
    for mode in GRID:
        assert model.time_s(mode) == pytest.approx(exact_time(mode), rel=1e-9)
        assert model.power_w(mode) == pytest.approx(exact_power(mode), rel=1e-9)
    assert model.time_coef == pytest.approx((0.005, 0.02, 0.4, 0.05), rel=1e-9)
    assert model.fit_error == pytest.approx(0.0, abs=1e-9)


def test_the_fit_never_returns_a_negative_coefficient() -> None:
    """Times that fall as the clock falls would need a negative parallel part: NNLS sets it to zero instead."""
    profiles = [Profile(ModePoint("m", 1, f), 1.0 + f / 1e9) for f in (0.5e9, 1e9, 1.5e9)]
    model = fit_mode_model(profiles, 1.5e9)
    assert min(model.time_coef) >= 0.0
    assert model.power_coef is None and model.power_w(profiles[0].mode) is None


def test_profile_choice_takes_the_corners() -> None:
    chosen = choose_profile_modes(GRID, 6)
    assert chosen[0] == ModePoint("4c1600000000.01600000000.0", 4, 1.6e9, 1.6e9)  # fastest
    assert (chosen[1].cores, chosen[1].cpu_hz, chosen[1].emc_hz) == (1, 1.6e9, 1.6e9)
    assert (chosen[-1].cores, chosen[-1].cpu_hz, chosen[-1].emc_hz) == (1, 0.4e9, 0.8e9)  # slowest


def test_advise_is_the_least_energy_mode_meeting_deadline_and_cap_by_exhaustion() -> None:
    model = fit_mode_model([Profile(m, exact_time(m), exact_power(m)) for m in choose_profile_modes(GRID)], 1.6e9)
    steps = 100
    deadline, cap = 100 * exact_time(GRID[-1]) * 2.0, 10.0
    advice = advise(model, GRID, steps, deadline_s=deadline, power_cap_w=cap)
    margin = advice.margin
    assert margin == pytest.approx(0.02)  # an exact fit keeps the least margin
    feasible = [m for m in GRID
                if steps * exact_time(m) * (1 + margin) <= deadline and exact_power(m) * (1 + margin) <= cap]
    best = min(feasible, key=lambda m: exact_time(m) * exact_power(m))
    assert advice.mode == best and not advice.at_risk and advice.candidates == len(feasible)
    assert advice.energy_j == pytest.approx(steps * exact_time(best) * exact_power(best))


def roofline_time(mode: ModePoint) -> float:
    """A step the form cannot fit exactly: compute and memory overlap (a max, not a sum)."""
    return 0.005 + max(0.4 / (mode.cores * mode.cpu_hz / 1e9), 0.3 / (mode.emc_hz / 1e9))


def test_a_profiled_mode_predicts_its_measurement_and_keeps_the_least_margin() -> None:
    chosen = choose_profile_modes(GRID, 6)
    model = fit_mode_model([Profile(m, roofline_time(m)) for m in chosen], 1.6e9)
    assert model.fit_error > 0.05  # the form misses the roofline on the profiled modes...
    for mode in chosen:  # ...but a profiled mode predicts what was measured there
        assert model.measured(mode) and model.time_s(mode) == pytest.approx(roofline_time(mode), rel=1e-12)
    others = [m for m in GRID if m not in chosen]
    assert not any(model.measured(m) for m in others)
    assert mape_percent([(roofline_time(m), model.time_s(m)) for m in others]) < \
        mape_percent([(roofline_time(m), model.form_time_s(m)) for m in others])  # neighbours inherit the residual
    slowest_profiled = max(chosen, key=model.time_s)
    deadline = 10 * model.time_s(slowest_profiled) * 1.03  # within the least margin, not within the form's
    assert 1 + 2 * model.fit_error > 1.03
    advice = advise(model, [slowest_profiled], 10, deadline_s=deadline)
    assert advice.mode == slowest_profiled and not advice.at_risk


def test_profiling_adds_the_advisors_pick_without_margins() -> None:
    measured: list[ModePoint] = []

    def measure(mode: ModePoint) -> Profile:
        measured.append(mode)
        return Profile(mode, roofline_time(mode), exact_power(mode))

    deadline = 100 * roofline_time(GRID[-1]) * 1.6
    profiles = profile_adaptively(GRID, measure, 100, deadline_s=deadline)
    assert [p.mode for p in profiles] == measured
    assert measured[:5] == choose_profile_modes(GRID, 5)
    expected = advise(fit_mode_model(profiles[:5], 1.6e9), GRID, 100, deadline_s=deadline, with_margins=False).mode
    assert len(measured) == 6 and measured[5] == expected and expected not in measured[:5]


def test_an_impossible_deadline_gives_the_fastest_mode_flagged() -> None:
    model = fit_mode_model([Profile(m, exact_time(m), exact_power(m)) for m in choose_profile_modes(GRID)], 1.6e9)
    advice = advise(model, GRID, 100, deadline_s=1e-6)
    assert advice.at_risk and advice.candidates == 0
    assert advice.mode == min(GRID, key=exact_time)


def test_bad_input_to_the_model_is_one_clear_error() -> None:
    with pytest.raises(EdgetrainError, match="at least 2"):
        fit_mode_model([Profile(GRID[0], 1.0)], 1e9)
    with pytest.raises(EdgetrainError, match="must be > 0"):
        fit_mode_model([Profile(GRID[0], 1.0), Profile(GRID[1], 0.0)], 1e9)
    with pytest.raises(EdgetrainError, match="non-empty"):
        advise(fit_mode_model([Profile(GRID[0], 1.0), Profile(GRID[1], 2.0)], 1e9), [], 10)


def test_the_simulated_grid_is_bounded_by_the_sourced_modes() -> None:
    grid, budget_w = device_grid("jetson-nano")
    assert len(grid) == 4 * 8 * 4 and budget_w == 10.0
    assert max(m.cores for m in grid) == 4 and max(m.cpu_hz for m in grid) == pytest.approx(1479e6)
    assert max(m.emc_hz for m in grid) == pytest.approx(1600e6)
    tx2, _ = device_grid("jetson-tx2")  # no sourced EMC cap: one EMC level
    assert len({m.emc_hz for m in tx2}) == 1


def test_the_simulator_is_monotone_in_cores_and_clock() -> None:
    grid, budget_w = device_grid("jetson-agx-orin")
    work = SimWorkload.draw(random.Random(1), budget_w, max(m.cpu_hz for m in grid), max(m.emc_hz for m in grid))
    for a in grid:
        for b in grid:
            if (a.cores, a.cpu_hz, a.emc_hz) <= (b.cores, b.cpu_hz, b.emc_hz) and a.cores <= b.cores \
                    and a.cpu_hz <= b.cpu_hz and a.emc_hz <= b.emc_hz:
                assert true_time_s(work, b) <= true_time_s(work, a) + 1e-12
    assert all(0 < true_power_w(work, m) <= 1.2 * budget_w for m in grid)


def test_the_advisor_scores_on_the_nano_grid() -> None:
    """The simulated validation at a small size: the advisor's goals hold on the Nano's grid."""
    report = score_device("jetson-nano", workloads=40, seed=3)
    assert report["cases"] > 30
    assert report["deadline_met_pct"] >= 95.0 and report["power_cap_met_pct"] >= 95.0
    assert report["within_5pct_of_best_energy_pct"] >= 90.0
    assert report["time_mape_pct"] <= 10.0 and report["power_mape_pct"] <= 5.0
    assert report["profiled_modes"] <= 6


def test_mape() -> None:
    assert mape_percent([(1.0, 1.1), (2.0, 1.8)]) == pytest.approx(10.0)


def test_quota_modes_map_onto_cores_and_clock() -> None:
    modes = {m.name: m.point() for m in quota_grid(cpus=2)}
    assert len(modes) == 8
    assert (modes["1t@25%"].cores, modes["1t@25%"].cpu_hz) == (1, 0.5e9)   # half a CPU for one thread
    assert (modes["2t@25%"].cores, modes["2t@25%"].cpu_hz) == (2, 0.25e9)  # half a CPU over two threads
    assert modes["1t@75%"].cpu_hz == modes["2t@100%"].cpu_hz == 1e9


def test_spread_is_the_samples_median_quartiles_and_cov() -> None:
    s = spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.n, s.median, s.q1, s.q3, s.iqr) == (5, 3.0, 2.0, 4.0, 2.0)
    assert s.cov_pct == pytest.approx(100 * (2.5 ** 0.5) / 3.0)
    assert spread([7.0]).cov_pct is None
    with pytest.raises(EdgetrainError):
        spread([])


needs_cgroups = pytest.mark.skipif(quota_unavailable_reason() is not None,
                                   reason=f"real CPU-quota modes: {quota_unavailable_reason()}")


def ours() -> list[str]:
    """The cgroups this process made (other processes may be making theirs meanwhile)."""
    return sorted(p.name for p in CGROUP_CPU.iterdir() if p.name.startswith(f"edgetrain-power-{os.getpid()}-"))


@needs_cgroups
def test_a_quota_cgroup_throttles_the_step_and_is_removed() -> None:
    """The kernel is the second instrument: at 25% of one CPU, a step of a model is throttled; the cgroup goes."""
    timing = time_step_in_mode(QuotaMode(1, 0.25, 1), "transformer_small", 2, 32, steps=2, warmup=1)
    assert len(timing.step_times_s) == 2 and all(t > 0 for t in timing.step_times_s)
    assert timing.nr_throttled > 0
    assert ours() == []


@needs_cgroups
def test_a_quota_cgroup_is_removed_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError), cpu_quota_cgroup(0.5, 1) as path:
        assert (path / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert ours() == [path.name]
        raise RuntimeError
    assert ours() == []


def test_no_cgroup_controller_is_unavailable(tmp_path: Path) -> None:
    assert quota_unavailable_reason(tmp_path) == f"no cgroup v1 cpu controller at {tmp_path}"
    with pytest.raises(EdgetrainError, match=r"^unavailable: no cgroup v1 cpu controller"), \
            cpu_quota_cgroup(0.5, 1, tmp_path):
        pass


def write_profiles(path: Path, model: str = "resnet18", batch: int = 8, count: int = 6) -> Path:
    chosen = choose_profile_modes(GRID, count)
    path.write_text(json.dumps({"model": model, "batch": batch, "profiles": [
        {"cores": m.cores, "cpu_hz": m.cpu_hz, "emc_hz": m.emc_hz, "time_s": exact_time(m), "power_w": exact_power(m)}
        for m in chosen]}))
    return path


def test_read_profiles_checks_model_batch_and_count(tmp_path: Path) -> None:
    assert len(read_profiles(write_profiles(tmp_path / "p.json"), "resnet18", 8)) == 6
    with pytest.raises(EdgetrainError, match="profiles resnet18 at batch 8, not mobilenet_v2 at batch 8"):
        read_profiles(tmp_path / "p.json", "mobilenet_v2", 8)
    with pytest.raises(EdgetrainError, match="give 2 to 6 profiled modes, got 1"):
        read_profiles(write_profiles(tmp_path / "one.json", count=1), "resnet18", 8)
    (tmp_path / "bad.json").write_text('{"profiles": [{"cores": 1}]}')
    with pytest.raises(EdgetrainError, match="not a profiles file"):
        read_profiles(tmp_path / "bad.json", "resnet18", 8)


def test_cli_advise_from_a_profiles_file_and_its_errors(tmp_path: Path) -> None:
    path = write_profiles(tmp_path / "p.json")
    code, out, _ = run("power", "advise", "-d", "jetson-nano", "--profiles", str(path), "--samples", "800",
                       "--deadline", "30", "--power-cap", "8", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["steps_per_epoch"] == 100 and report["grid_modes"] == 128
    advice = report["advice"]
    assert not advice["at_risk"] and advice["epoch_time_s"] * (1 + advice["margin"]) <= 30
    assert advice["power_w"] * (1 + advice["margin"]) <= 8
    code, _, err = run("power", "advise", "-d", "jetson-nano")
    assert code == 2 and err.count("\n") == 1 and "--profiles FILE" in err
    code, _, err = run("power", "advise", "-d", "rpi4", "--simulate-seed", "1")
    assert code == 2 and "no sourced power-mode table for 'rpi4'" in err


def test_measuring_a_board_applies_each_profiled_mode_and_restores_it(tmp_path: Path) -> None:
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    board = Board(root, restore_file=tmp_path / "restore.json")
    grid = board_grid(board)
    assert len(grid) == 4 * 3 and {m.cpu_hz for m in grid} == {102e6, 918e6, 1479e6}
    cpu = root / "sys/devices/system/cpu"
    seen: list[tuple[int, int, str]] = []

    def probe(threads: int) -> tuple[float, float | None]:
        online = 1 + sum((cpu / f"cpu{n}/online").read_text() == "1" for n in (1, 2, 3))
        khz = (cpu / "cpu0/cpufreq/scaling_max_freq").read_text()
        seen.append((threads, online, khz))
        ghz = int(khz) / 1e6
        return 0.1 + 1.0 / (threads * ghz), 1.0 + threads * ghz**2

    profiles = measure_board(grid, probe, board, steps_per_epoch=10, deadline_s=4.0)
    corners = choose_profile_modes(grid, 5)
    sixth = advise(fit_mode_model(profiles[:5], 1479e6), grid, 10, deadline_s=4.0, with_margins=False).mode
    assert [p.mode for p in profiles] == [*corners, sixth] and sixth not in corners
    assert [(t, o) for t, o, _ in seen] == [(p.mode.cores, p.mode.cores) for p in profiles]
    assert [khz for _, _, khz in seen] == [str(round(p.mode.cpu_hz / 1e3)) for p in profiles]
    assert {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}


def test_measuring_without_knobs_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    with pytest.raises(PowerControlUnavailable, match=r"^unavailable: no cpufreq"):
        board_grid(Board(tmp_path, restore_file=tmp_path / "r.json"))
