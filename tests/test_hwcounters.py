"""Counters per training phase: perf stat parsing and metrics on recorded outputs, perf_event_open on this machine."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from test_cli import run

from edgetrain.errors import EdgetrainError
from edgetrain.hwcounters.metrics import metrics_by_pmu, parse_perf_stat, perf_stat_metrics, split_label
from edgetrain.hwcounters.perf_event import HARDWARE_EVENTS, SOFTWARE_EVENTS, CounterSet, cpu_pmus, syscall_number
from edgetrain.hwcounters.phases import PHASES, count_phases

# `perf stat -x, -e task-clock,context-switches,page-faults,cycles,instructions,branches,branch-misses,
# L1-dcache-loads,L1-dcache-load-misses` as perf-stat.txt's CSV FORMAT lays it out, written for a
# Raspberry Pi 4 whose PMU does not support the branch events here.
RPI4 = textwrap.dedent("""\
    1234.56,msec,task-clock,1234560000,100.00,0.998,CPUs utilized
    12,,context-switches,1234560000,100.00,9.720,/sec
    345,,page-faults,1234560000,100.00,279.457,/sec
    2345678901,,cycles,1234560000,100.00,1.900,GHz
    3456789012,,instructions,1234560000,100.00,1.47,insn per cycle
    <not supported>,,branches,0,100.00,,
    <not supported>,,branch-misses,0,100.00,,
    567890123,,L1-dcache-loads,1234560000,100.00,,
    12345678,,L1-dcache-load-misses,1234560000,100.00,2.17,of all L1-dcache accesses
    """)
# An ODROID-XU4 (Exynos 5422): two CPU PMUs, events named per PMU, each counting part of the time.
XU4 = textwrap.dedent("""\
    # started on Mon Nov 23 17:00:00 2026
    987.65,msec,task-clock,987650000,100.00,1.000,CPUs utilized
    1500000000,,armv7_cortex_a15/cycles/,600000000,60.75,,
    2100000000,,armv7_cortex_a15/instructions/,600000000,60.75,,
    300000000,,armv7_cortex_a15/branches/,600000000,60.75,,
    6000000,,armv7_cortex_a15/branch-misses/,600000000,60.75,,
    400000000,,armv7_cortex_a7/cycles/,387650000,39.25,,
    260000000,,armv7_cortex_a7/instructions/,387650000,39.25,,
    40000000,,armv7_cortex_a7/branches/,387650000,39.25,,
    2000000,,armv7_cortex_a7/branch-misses/,387650000,39.25,,
    <not counted>,,armv7_cortex_a7/L1-dcache-loads/,0,0.00,,
    <not counted>,,armv7_cortex_a7/L1-dcache-load-misses/,0,0.00,,
    """)


def test_rpi4_output_parses_and_names_what_is_not_supported() -> None:
    rows = parse_perf_stat(RPI4)
    assert len(rows) == 9
    branches = next(r for r in rows if r.event == "branches")
    assert (branches.value, branches.status, branches.run_time_ns) == (None, "<not supported>", 0)
    cycles = next(r for r in rows if r.event == "cycles")
    assert (cycles.value, cycles.pmu, cycles.run_time_ns, cycles.running_pct) == (2345678901.0, "", 1234560000, 100.0)
    metrics = perf_stat_metrics(RPI4)[""]
    assert metrics["ipc"] == pytest.approx(3456789012 / 2345678901)
    assert metrics["l1d_miss_ratio"] == pytest.approx(12345678 / 567890123)
    assert metrics["branch_miss_ratio"] == "unavailable: <not supported>"


def test_xu4_output_gives_metrics_per_pmu() -> None:
    metrics = perf_stat_metrics(XU4)
    assert set(metrics) == {"armv7_cortex_a15", "armv7_cortex_a7"}
    assert metrics["armv7_cortex_a15"]["ipc"] == pytest.approx(1.4)
    assert metrics["armv7_cortex_a7"]["ipc"] == pytest.approx(0.65)
    assert metrics["armv7_cortex_a15"]["branch_miss_ratio"] == pytest.approx(0.02)
    assert metrics["armv7_cortex_a7"]["branch_miss_ratio"] == pytest.approx(0.05)
    assert metrics["armv7_cortex_a7"]["l1d_miss_ratio"] == "unavailable: <not counted>"
    assert metrics["armv7_cortex_a15"]["l1d_miss_ratio"] == "unavailable: L1-dcache-load-misses not measured"


def test_labels_and_bad_lines() -> None:
    assert split_label("cpu_core/instructions/") == ("cpu_core", "instructions")
    assert split_label("cycles:u") == ("", "cycles")
    with pytest.raises(EdgetrainError, match="line 1"):
        parse_perf_stat("12,cycles\n")
    with pytest.raises(EdgetrainError, match="not a number"):
        parse_perf_stat("lots,,cycles,1,100\n")
    assert metrics_by_pmu({"instructions": 5.0, "cycles": 0.0})[""]["ipc"] == "unavailable: cycles counted 0"


def test_syscall_numbers() -> None:
    assert (syscall_number("x86_64"), syscall_number("aarch64"), syscall_number("armv7l")) == (298, 241, 364)
    assert syscall_number("riscv64") is None


def test_cpu_pmus_are_the_cpu_ones(tmp_path: Path) -> None:
    for name, type_, cpus in (("software", 1, False), ("breakpoint", 5, False), ("armv7_cortex_a15", 6, True),
                              ("armv7_cortex_a7", 7, True), ("cci_400", 8, False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text(f"{type_}\n")
        if cpus:
            (tmp_path / name / "cpus").write_text("0-3\n")
    assert cpu_pmus(tmp_path) == {"armv7_cortex_a15": 6, "armv7_cortex_a7": 7}


def test_software_events_count_here_and_each_hardware_one_counts_or_says_why() -> None:
    with CounterSet() as counters:
        before = counters.read()
        sum(i * i for i in range(200_000))
        after = counters.read()
        why = counters.unavailable()
    for event in SOFTWARE_EVENTS:
        assert after[event.name] is not None and before[event.name] is not None
    task = after["task-clock"] - before["task-clock"]  # type: ignore[operator]
    assert task.value > 0 and task.running_ns <= task.enabled_ns
    for event in HARDWARE_EVENTS:
        assert (after[event.name] is None) == (event.name in why)
        if event.name in why:
            assert why[event.name].startswith("unavailable: ")


def test_two_pmus_open_each_hardware_event_per_pmu() -> None:
    with CounterSet(HARDWARE_EVENTS[:2], pmus={"big": 4, "little": 4}) as counters:
        labels = [c.label for c in counters.counters]
    assert labels == ["big/instructions/", "little/instructions/", "big/cycles/", "little/cycles/"]


def test_phase_counts_add_up_to_the_step(one_thread: None) -> None:
    report = count_phases("transformer_small", 2, 16, steps=1, warmup=1)
    assert list(report["phases"]) == list(PHASES)
    for label in ("task-clock", "page-faults", "context-switches"):
        assert report["step"]["counters"][label]["value"] == sum(
            report["phases"][phase]["counters"][label]["value"] for phase in PHASES)
    assert report["phases"]["forward"]["counters"]["task-clock"]["value"] > 0
    for label, why in report["unavailable"].items():
        assert report["step"]["counters"][label] == why
    overhead = report["overhead"]
    assert overhead["ratio"] > 0
    for key in ("plain_step", "counted_step"):  # each median comes with its spread over the same steps
        assert overhead[f"{key}_spread_s"]["n"] == 1 and overhead[f"{key}_spread_s"]["median"] == overhead[f"{key}_s"]


def test_cli_bench_counters(one_thread: None) -> None:
    code, out, _ = run("bench", "counters", "-m", "transformer_small", "-b", "2", "--image", "16", "--steps", "1",
                       "--json")
    assert code == 0 and set(json.loads(out)["phases"]) == set(PHASES)
    code, _, err = run("bench", "counters", "-m", "nope")
    assert code == 2 and err.count("\n") == 1
