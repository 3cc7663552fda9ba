"""The device catalog: sourced figures, units in names, validation, run-time detection."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from edgetrain.devices import (
    Device,
    DeviceCatalogError,
    device_names,
    devices_table,
    get_device,
    load_catalog,
    load_devices_file,
    this_machine,
)
from edgetrain.devices.catalog import ENERGY_FIELDS, NUMERIC_FIELDS, _detect_this_machine, proc_kib_fields
from edgetrain.errors import UnknownNameError
from edgetrain.profiling.device_probe import device_entry, write_device_entry

CLI_NAMES = ["odroid-xu4", "rpi4", "rpi4-8gb", "jetson-nano", "jetson-tx2", "jetson-xavier-nx",
             "jetson-agx-xavier", "jetson-agx-orin", "mkr1000", "nrf52840", "this-machine"]
UNIT_SUFFIXES = ("_bytes", "_hz", "_w", "_bps", "_gflops", "_flops_per_s", "_s")
GIB = 1024**3

MINIMAL = """
[devices.my-board]
title = "My board"
memory_bytes = 1073741824
cpu = "4x Cortex-A53"
peak_power_w = 5
[devices.my-board.sources]
memory_bytes = "vendor page"
peak_power_w = "vendor page: 5 V / 1 A"
"""


def _all_devices() -> list[Device]:
    return [*load_catalog().values(), this_machine()]


def test_catalog_loads_the_ten_file_devices_in_file_order() -> None:
    catalog = load_catalog()

    assert list(catalog) == CLI_NAMES[:-1]
    assert all(isinstance(d, Device) and d.name == name for name, d in catalog.items())


def test_load_catalog_returns_a_fresh_dict_each_call() -> None:
    first = load_catalog()
    first.pop("rpi4")

    assert "rpi4" in load_catalog()


def test_every_cli_name_is_listed_and_resolves() -> None:
    assert device_names() == CLI_NAMES
    for name in CLI_NAMES:
        assert get_device(name).name == name


@pytest.mark.parametrize("device", _all_devices(), ids=lambda d: d.name)
def test_every_numeric_field_is_none_or_sourced(device: Device) -> None:
    for key in NUMERIC_FIELDS:
        if getattr(device, key) is not None:
            assert device.sources.get(key, "").strip(), f"{device.name}.{key} has no source"


@pytest.mark.parametrize("device", _all_devices(), ids=lambda d: d.name)
def test_every_unknown_figure_says_why(device: Device) -> None:
    for key in NUMERIC_FIELDS:
        if getattr(device, key) is None:
            reason = device.sources.get(key, "")
            assert reason.startswith(("unknown", "not applicable")), f"{device.name}.{key}: {reason!r}"


@pytest.mark.parametrize("device", _all_devices(), ids=lambda d: d.name)
def test_numbers_live_only_in_fields_with_units_in_their_names(device: Device) -> None:
    assert all(key.endswith(UNIT_SUFFIXES) or key == "cpu_cores" for key in NUMERIC_FIELDS)
    for f in dataclasses.fields(device):
        value = getattr(device, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert f.name in NUMERIC_FIELDS, f.name
            assert value > 0, f"{device.name}.{f.name} = {value} (placeholder?)"


def test_odroid_xu4_has_2_gib_and_8_cores() -> None:
    node = get_device("odroid-xu4")

    assert node.memory_bytes == 2 * GIB == 2_147_483_648
    assert node.cpu_cores == 8
    assert node.cpu_max_freq_hz == 2.0e9
    assert node.storage == "eMMC/microSD"


@pytest.mark.parametrize(("name", "memory_bytes"), [
    ("rpi4", 4 * GIB), ("rpi4-8gb", 8 * GIB), ("jetson-nano", 4 * GIB), ("jetson-tx2", 8 * GIB),
    ("jetson-xavier-nx", 8 * GIB), ("jetson-agx-xavier", 32 * GIB), ("jetson-agx-orin", 64 * GIB),
    ("mkr1000", 32 * 1024), ("nrf52840", 256 * 1024),
])
def test_dram_and_sram_sizes_are_binary(name: str, memory_bytes: int) -> None:
    assert get_device(name).memory_bytes == memory_bytes


@pytest.mark.parametrize(("name", "cuda_cores", "gpu_clock_hz"), [
    ("jetson-nano", 128, 921.6e6), ("jetson-tx2", 256, 1300e6), ("jetson-xavier-nx", 384, 1100e6),
    ("jetson-agx-xavier", 512, 1377e6), ("jetson-agx-orin", 2048, 1300e6),
])
def test_derived_gpu_peaks_are_cores_times_fma_times_clock(name: str, cuda_cores: int, gpu_clock_hz: float) -> None:
    device = get_device(name)

    assert device.peak_fp32_gflops == pytest.approx(cuda_cores * 2 * gpu_clock_hz / 1e9, rel=1e-12)
    assert device.sources["peak_fp32_gflops"].startswith("derived:")


def test_this_machine_detects_memory_and_cores() -> None:
    here = get_device("this-machine")

    assert here.name == "this-machine"
    assert here.memory_bytes > 0
    assert here.cpu_cores is not None and here.cpu_cores >= 1
    assert here.sources["memory_bytes"].startswith("detected at run time")
    assert here.sources["storage_read_bps"] == "unknown: not measured"


def test_this_machine_reads_proc_and_sys(tmp_path: Path) -> None:
    proc, sys_dir = tmp_path / "proc", tmp_path / "sys"
    (proc / "driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:        2009632 kB\nMemFree:          123456 kB\n")  # no MemAvailable
    (proc / "cpuinfo").write_text("processor\t: 0\nmodel\t\t: 1\nmodel name\t: Test CPU @ 2.00GHz\n")
    (proc / "driver/nvidia/gpus/0000:01:00.0/information").write_text("Model: \t\t NVIDIA Test GPU\nIRQ: 1\n")
    for cpu, khz in (("cpu0", "1400000"), ("cpu4", "2000000")):
        (sys_dir / "devices/system/cpu" / cpu / "cpufreq").mkdir(parents=True)
        (sys_dir / "devices/system/cpu" / cpu / "cpufreq/cpuinfo_max_freq").write_text(khz + "\n")

    here = _detect_this_machine(proc, sys_dir)

    assert here.memory_bytes == 2009632 * 1024
    assert here.cpu == "Test CPU @ 2.00GHz"
    assert here.cpu_max_freq_hz == 2.0e9
    assert here.accelerator == "NVIDIA Test GPU"
    assert here.sources["cpu_max_freq_hz"].startswith("detected at run time")
    assert here.usable_memory_bytes is None
    assert here.sources["usable_memory_bytes"].startswith("unknown: no MemAvailable")


def test_unknown_name_error_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_device("raspberry-pi-9")

    assert info.value.kind == "device"
    assert set(info.value.valid) == set(CLI_NAMES)
    assert all(name in str(info.value) for name in CLI_NAMES)
    assert isinstance(info.value, KeyError)


def test_a_valid_file_loads_with_hand_checked_values(tmp_path: Path) -> None:
    path = tmp_path / "devices.toml"
    path.write_text(MINIMAL)

    devices = load_devices_file(path)

    board = devices["my-board"]
    assert board.memory_bytes == GIB
    assert board.peak_power_w == 5.0 and isinstance(board.peak_power_w, float)
    assert board.cpu_cores is None and board.storage is None


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace('peak_power_w = "vendor page: 5 V / 1 A"\n', ""), "no entry in sources"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = -5\n"), "must be > 0"),
    (lambda t: t.replace("memory_bytes = 1073741824", "memory_bytes = -1"), "must be > 0"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = 0\n"), "never write 0"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = 5\npagein_bps = -1.0\n"), "must be > 0"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = 5\ncompute_flops_per_s = 1e6\n"),
     "no entry in sources"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = 5\npower_watts = 5\n"), "unknown field"),
    (lambda t: t.replace('memory_bytes = "vendor page"', 'memory_bytes = "vendor page"\nram = "x"'),
     "unknown fields"),
    (lambda t: t.replace("memory_bytes = 1073741824", "memory_bytes = 1.5e9"), "must be an integer"),
    (lambda t: t.replace("peak_power_w = 5\n", "peak_power_w = 5\nusable_memory_bytes = 1073741825\n")
                .replace('memory_bytes = "vendor page"', 'memory_bytes = "vendor page"\nusable_memory_bytes = "idle"'),
     "usable_memory_bytes = 1073741825 exceeds memory_bytes = 1073741824"),
    (lambda t: t.replace('cpu = "4x Cortex-A53"\n', ""), "lacks required field"),
    (lambda t: t.replace("[devices.my-board]", "[devices.this-machine]")
                .replace("[devices.my-board.sources]", "[devices.this-machine.sources]"), "detected at run time"),
    (lambda t: t + "\n[extra]\nx = 1\n", "unknown top-level"),
    (lambda t: t.replace('title = "My board"', "title = My board"), "not valid TOML"),
], ids=["missing-source", "negative-power", "negative-memory", "zero", "negative-pagein-rate",
        "unsourced-compute-rate", "unknown-field", "unknown-source-key",
        "float-bytes", "usable-above-ram", "missing-cpu", "this-machine-in-file", "top-level-key", "bad-toml"])
def test_bad_files_are_rejected_with_a_clear_message(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "devices.toml"
    path.write_text(edit(MINIMAL))

    with pytest.raises(DeviceCatalogError, match=message) as info:
        load_devices_file(path)

    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["mkr1000", "nrf52840", "rpi4", "rpi4-8gb", "jetson-tx2", "odroid-xu4"])
def test_energy_figures_cite_poet_or_say_why_not(name: str) -> None:
    """Every energy figure cites POET, or (a training rate) the published step it derives from, or says unknown."""
    device = get_device(name)

    for key in ENERGY_FIELDS:
        source = device.sources[key]
        if getattr(device, key) is None:
            assert source.startswith("unknown"), key
        elif key == "compute_flops_per_s" and name.startswith("rpi4"):
            assert source.startswith("derived from a measured training step"), key
            assert "Flower" in source and "218.366399 s for 20 steps" in source, key
        else:
            assert "POET" in source, key
    if device.compute_flops_per_s is not None:  # an achieved rate, far below any peak
        assert device.compute_flops_per_s < (device.peak_fp32_gflops or float("inf")) * 1e9


def test_device_is_frozen_and_its_sources_read_only() -> None:
    node = get_device("odroid-xu4")

    with pytest.raises(dataclasses.FrozenInstanceError):
        node.memory_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        node.sources["memory_bytes"] = "made up"  # type: ignore[index]


def test_to_dict_is_json_ready_and_complete() -> None:
    for device in _all_devices():
        data = json.loads(json.dumps(device.to_dict()))

        assert set(data) == {f.name for f in dataclasses.fields(Device)}
        assert data["memory_bytes"] == device.memory_bytes
        assert data["sources"] == dict(device.sources)


def test_devices_table_shows_unknowns_as_question_marks() -> None:
    devices = [get_device("odroid-xu4"), get_device("rpi4")]
    console = Console(record=True, width=250)

    table = devices_table(devices)
    console.print(table)
    text = console.export_text()

    assert len(table.columns) == 9 and table.row_count == 2
    odroid_row = next(line for line in text.splitlines() if "odroid-xu4" in line)
    assert "2.00 GiB" in odroid_row and "?/20" in odroid_row and "?/?" in odroid_row
    assert [cell.strip() for cell in odroid_row.split("│")[3:5]] == ["2.00 GiB", "?"]  # memory, usable
    rpi_row = next(line for line in text.splitlines() if "rpi4" in line)
    assert "45.5/17.1" in rpi_row and "3/15" in rpi_row


# --- usable memory --------------------------------------------------------------------------------

# /proc/meminfo and /proc/self/status as recorded on a Linux x86-64 machine (first lines kept).
RECORDED_MEMINFO = """MemTotal:       24684084 kB
MemFree:        22746504 kB
MemAvailable:   23649772 kB
Buffers:            5684 kB
Cached:           923360 kB
SwapCached:            0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""
RECORDED_STATUS = """Name:\tgrep
Umask:\t0022
State:\tR (running)
VmHWM:\t    2012 kB
VmRSS:\t    2012 kB
RssAnon:\t     168 kB
RssFile:\t    1844 kB
"""


def test_proc_kib_fields_reads_kernel_kb_as_kib_and_skips_text() -> None:
    meminfo = proc_kib_fields(RECORDED_MEMINFO)
    status = proc_kib_fields(RECORDED_STATUS)

    assert meminfo["MemTotal"] == 24684084 * 1024
    assert meminfo["MemAvailable"] == 23649772 * 1024
    assert status["RssAnon"] == 168 * 1024 and status["VmHWM"] == 2012 * 1024
    assert "HugePages_Total" not in meminfo  # a count, not a size
    assert not {"Name", "State", "Umask"} & set(status)  # text, and an octal mask that is not a size


def test_this_machine_usable_memory_is_mem_available_plus_its_own_anonymous_memory(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(RECORDED_MEMINFO)
    (proc / "self/status").write_text(RECORDED_STATUS)

    here = _detect_this_machine(proc, tmp_path / "sys")

    assert here.memory_bytes == 24684084 * 1024
    assert here.usable_memory_bytes == (23649772 + 168) * 1024
    assert "MemAvailable" in here.sources["usable_memory_bytes"] and "RssAnon" in here.sources["usable_memory_bytes"]


def test_the_live_machine_has_usable_memory_below_its_ram() -> None:
    here = this_machine()

    assert here.usable_memory_bytes is not None
    assert 0 < here.usable_memory_bytes <= here.memory_bytes


@pytest.mark.parametrize("device", list(load_catalog().values()), ids=lambda d: d.name)
def test_every_catalog_device_sources_its_usable_memory_or_says_how_to_measure_it(device: Device) -> None:
    source = device.sources["usable_memory_bytes"]

    if device.usable_memory_bytes is None:
        assert source.startswith("unknown: ")
        assert "edgetrain bench device" in source or "the build's" in source  # the way to find it out
    else:
        assert "http" in source or source.startswith("measured")
        assert device.usable_memory_bytes <= device.memory_bytes


def _board(usable_memory_bytes: int | None) -> Device:
    sources = {"memory_bytes": "vendor page", "usable_memory_bytes": "MemAvailable at idle, measured"}
    return Device("b", "Board", 2 * GIB, "4x Cortex-A15", usable_memory_bytes=usable_memory_bytes, sources=sources)


def test_training_memory_is_usable_memory_minus_the_runtime_baseline() -> None:
    board = _board(usable_memory_bytes=1_700 * 1024**2)

    assert board.training_memory_bytes(350 * 1024**2) == 1_350 * 1024**2
    assert board.training_memory_bytes(0) == 1_700 * 1024**2
    assert board.training_memory_bytes(1_800 * 1024**2) == -100 * 1024**2  # nothing left: the caller says so
    assert _board(usable_memory_bytes=None).training_memory_bytes(350 * 1024**2) is None
    with pytest.raises(ValueError, match="must be >= 0"):
        board.training_memory_bytes(-1)


def test_devices_table_shows_known_usable_memory() -> None:
    console = Console(record=True, width=250)

    console.print(devices_table([_board(usable_memory_bytes=1_700 * 1024**2)]))

    row = next(line for line in console.export_text().splitlines() if "Board" in line)
    assert [cell.strip() for cell in row.split("│")[3:5]] == ["2.00 GiB", "1.66 GiB"]


def test_usable_memory_above_ram_is_refused() -> None:
    with pytest.raises(DeviceCatalogError, match="exceeds memory_bytes"):
        _board(usable_memory_bytes=2 * GIB + 1)
    assert _board(usable_memory_bytes=2 * GIB).usable_memory_bytes == 2 * GIB


def test_bench_device_records_the_boards_usable_memory_in_its_file(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(RECORDED_MEMINFO)
    (proc / "self/status").write_text(RECORDED_STATUS)
    base = _detect_this_machine(proc, tmp_path / "sys")

    entry = device_entry("my-xu4", storage=None, compute=None, powers={}, power_source=None, base=base,
                         when="2026-11-21")
    device = write_device_entry(tmp_path / "d.toml", "my-xu4", entry)

    assert device.usable_memory_bytes == (23649772 + 168) * 1024
    assert device.sources["usable_memory_bytes"].startswith("measured by `edgetrain bench device` on 2026-11-21")
    assert "MemAvailable" in device.sources["usable_memory_bytes"]
