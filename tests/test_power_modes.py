"""Power modes: the sourced catalog, nvpmodel.conf and sysfs readers, and applying a mode with a
guaranteed restore, on a fake sysfs root (nothing here touches the real board)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from test_cli import run

from edgetrain.power.control import (
    Board,
    ModeRequest,
    PowerControlError,
    PowerControlUnavailable,
    applied_mode,
    recover_pending,
)
from edgetrain.power.modes import (
    MODE_FIGURES,
    PowerModeError,
    catalog_modes,
    modes_for_device,
    parse_cpu_list,
    parse_modes_toml,
    parse_nvpmodel_conf,
    read_cpu_state,
)

# Written from the format nvpmodel.conf's own header documents (PARAM / POWER_MODEL / PM_CONFIG);
# the figures are the Jetson Nano's two modes from NVIDIA's L4T power-management table.
NANO_CONF = textwrap.dedent("""\
    # a recorded fragment
    < PARAM TYPE=FILE NAME=CPU_ONLINE >
    CORE_0 /sys/devices/system/cpu/cpu0/online
    CORE_1 /sys/devices/system/cpu/cpu1/online
    CORE_2 /sys/devices/system/cpu/cpu2/online
    CORE_3 /sys/devices/system/cpu/cpu3/online
    < PARAM TYPE=CLOCK NAME=CPU_A57 >
    MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq
    < PARAM TYPE=CLOCK NAME=GPU >
    MAX_FREQ /sys/devices/gpu.0/devfreq/57000000.gpu/max_freq
    < PARAM TYPE=CLOCK NAME=EMC >
    MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap
    < POWER_MODEL ID=0 NAME=MAXN >
    CPU_ONLINE CORE_0 1
    CPU_ONLINE CORE_1 1
    CPU_ONLINE CORE_2 1
    CPU_ONLINE CORE_3 1
    CPU_A57 MAX_FREQ -1
    GPU MAX_FREQ -1
    EMC MAX_FREQ 0
    < POWER_MODEL ID=1 NAME=5W >
    CPU_ONLINE CORE_0 1
    CPU_ONLINE CORE_1 1
    CPU_ONLINE CORE_2 0
    CPU_ONLINE CORE_3 0
    CPU_A57 MAX_FREQ 918000
    GPU MAX_FREQ 640000000
    EMC MAX_FREQ 1600000000
    < PM_CONFIG DEFAULT=0 >
    """)


def test_every_catalog_mode_names_its_source_and_why_a_figure_is_missing() -> None:
    for device, modes in catalog_modes().items():
        assert modes, device
        for mode in modes:
            assert "http" in mode.source, (device, mode.name)
            for key in MODE_FIGURES:
                assert (getattr(mode, key) is None) == (key in mode.unknown), (device, mode.name, key)


def test_the_nano_table_is_nvidias() -> None:
    maxn, five = modes_for_device("jetson-nano")
    assert (maxn.mode_id, maxn.name, maxn.online_cores, maxn.cpu_max_freq_hz, maxn.gpu_max_freq_hz,
            maxn.emc_max_freq_hz, maxn.budget_w) == (0, "MAXN", 4, 1479e6, 921.6e6, 1600e6, 10.0)
    assert (five.online_cores, five.cpu_max_freq_hz, five.gpu_max_freq_hz, five.budget_w) == (2, 918e6, 640e6, 5.0)


def test_a_figure_neither_set_nor_explained_is_refused() -> None:
    with pytest.raises(PowerModeError, match="budget_w neither set nor said unknown"):
        parse_modes_toml('[b.modes.0]\nname = "M"\nsource = "s"\nonline_cores = 2\ncpu_max_freq_hz = 1e9\n'
                         'gpu_max_freq_hz = 1e9\nemc_max_freq_hz = 1e9\n')
    with pytest.raises(PowerModeError, match="must be a number > 0"):
        parse_modes_toml('[b.modes.0]\nname = "M"\nsource = "s"\nonline_cores = 0\n'
                         'unknown = {cpu_max_freq_hz="x", gpu_max_freq_hz="x", emc_max_freq_hz="x", budget_w="x"}\n')


def test_a_device_without_a_sourced_table_says_which_have_one() -> None:
    with pytest.raises(PowerModeError, match="jetson-nano"):
        modes_for_device("rpi4")


def test_nvpmodel_conf_gives_cores_clocks_in_hz_and_the_default() -> None:
    modes, default = parse_nvpmodel_conf(NANO_CONF)
    maxn, five = modes
    assert default == 0
    assert (maxn.online_cores, maxn.cpu_max_freq_hz, maxn.gpu_max_freq_hz) == (4, None, None)  # -1: no cap
    assert (five.online_cores, five.cpu_max_freq_hz, five.gpu_max_freq_hz, five.emc_max_freq_hz, five.budget_w) == \
        (2, 918e6, 640e6, 1600e6, 5.0)
    assert maxn.budget_w is None and "budget_w" in maxn.unknown


@pytest.mark.parametrize(("text", "match"), [
    ("< POWER_MODEL ID=0 NAME=A >\nCPU_ONLINE CORE_0 1\n", "not a declared PARAM"),
    ("< PARAM TYPE=FILE NAME=X >\nA /p\n", "no POWER_MODEL"),
    ("< PARAM TYPE=FILE NAME=X >\nA /p\n< POWER_MODEL ID=0 NAME=A >\nX A 1\n< PM_CONFIG DEFAULT=3 >\n",
     "DEFAULT=3 names no POWER_MODEL"),
    ("< POWER_MODEL NAME=A >\n", "malformed section header"),
])
def test_a_malformed_nvpmodel_conf_is_one_clear_error(text: str, match: str) -> None:
    with pytest.raises(PowerModeError, match=match):
        parse_nvpmodel_conf(text)


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,6,8-9\n") == (0, 1, 2, 3, 6, 8, 9)
    assert parse_cpu_list("") == ()
    with pytest.raises(PowerModeError):
        parse_cpu_list("a-b")


def fake_board(root: Path, cpus: int = 4, nvpmodel_mode: int | None = None) -> Path:
    """A sysfs-like tree: cpu0..N-1, hot-plug files (not cpu0's, as on ARM boards), cpufreq per CPU."""
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "present").write_text(f"0-{cpus - 1}\n")
    (cpu_dir / "online").write_text(f"0-{cpus - 1}\n")
    for cpu in range(cpus):
        freq = cpu_dir / f"cpu{cpu}/cpufreq"
        freq.mkdir(parents=True)
        if cpu:
            (cpu_dir / f"cpu{cpu}/online").write_text("1\n")
        for name, value in (("scaling_governor", "schedutil"), ("scaling_max_freq", "1479000"),
                            ("cpuinfo_max_freq", "1479000"), ("cpuinfo_min_freq", "102000"),
                            ("scaling_available_governors", "schedutil performance powersave"),
                            ("scaling_available_frequencies", "102000 918000 1479000")):
            (freq / name).write_text(value + "\n")
    if nvpmodel_mode is not None:
        (root / "etc").mkdir()
        (root / "etc/nvpmodel.conf").write_text(NANO_CONF)
        (root / "var/lib/nvpmodel").mkdir(parents=True)
        (root / "var/lib/nvpmodel/status").write_text(f"pmode:{nvpmodel_mode:04d}\n")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): path.read_text() for path in sorted(root.rglob("*")) if path.is_file()}


def test_sysfs_reader_on_a_fake_board(tmp_path: Path) -> None:
    state = read_cpu_state(fake_board(tmp_path / "root"))
    assert state.present == state.online == (0, 1, 2, 3)
    assert dict(state.governors) == {cpu: "schedutil" for cpu in range(4)}
    assert dict(state.max_freq_khz) == dict(state.hardware_max_freq_khz) == {cpu: 1479000 for cpu in range(4)}


def test_a_mode_is_applied_in_the_block_and_restored_after(tmp_path: Path) -> None:
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    board = Board(root, restore_file=tmp_path / "restore.json")
    with applied_mode(ModeRequest(online_cores=2, governor="performance", cpu_max_freq_hz=918e6), board):
        cpu = root / "sys/devices/system/cpu"
        assert [(cpu / f"cpu{n}/online").read_text() for n in (1, 2, 3)] == ["1", "0", "0"]
        assert (cpu / "cpu1/cpufreq/scaling_governor").read_text() == "performance"
        assert (cpu / "cpu0/cpufreq/scaling_max_freq").read_text() == "918000"
        assert (cpu / "cpu2/cpufreq/scaling_governor").read_text() == "schedutil\n"  # offline: untouched
        assert json.loads(board.restore_file.read_text())["writes"]
    assert {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}
    assert not board.restore_file.exists()


def test_an_exception_in_the_block_still_restores(tmp_path: Path) -> None:
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    board = Board(root, restore_file=tmp_path / "restore.json")
    with pytest.raises(KeyboardInterrupt), applied_mode(ModeRequest(governor="powersave"), board):
        raise KeyboardInterrupt
    assert {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}


@pytest.mark.parametrize(("request_", "match"), [
    (ModeRequest(nvpmodel_id=7), r"unknown power mode 7; .* defines \[0, 1\]; mode unchanged"),
    (ModeRequest(governor="turbo"), "governor 'turbo' is not offered here; the board offers schedutil, performance"),
    (ModeRequest(cpu_max_freq_hz=1000e6), r"CPU clock 1000 MHz is not offered here \(102, 918, 1479 MHz\)"),
    (ModeRequest(online_cores=5), "--cores must be 1..4"),
])
def test_bad_modes_are_refused_before_anything_is_written(tmp_path: Path, request_: ModeRequest, match: str) -> None:
    root = fake_board(tmp_path / "root", nvpmodel_mode=0)
    before = snapshot(root)
    ran: list[list[str]] = []
    board = Board(root, runner=ran.append, restore_file=tmp_path / "restore.json")
    with pytest.raises(PowerControlError, match=match), applied_mode(request_, board):
        pytest.fail("the block must not run")
    assert snapshot(root) == before and ran == [] and not board.restore_file.exists()


@pytest.mark.parametrize(("error", "why"), [(PermissionError(errno.EACCES, "Permission denied"), "no permission"),
                                            (OSError(errno.EINVAL, "Invalid argument"), "the board refused it")])
def test_a_refused_write_undoes_the_writes_before_it(tmp_path: Path, error: OSError, why: str) -> None:
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    written: list[Path] = []

    def writer(path: Path, value: str) -> None:
        if path.name == "scaling_max_freq" and value != "1479000":  # the board takes the governor, refuses the clock
            raise error
        written.append(path)
        path.write_text(value)

    board = Board(root, writer=writer, restore_file=tmp_path / "restore.json")
    with pytest.raises(PowerControlError, match=f"{why}: writing 918000 to .*; mode unchanged"), \
            applied_mode(ModeRequest(governor="performance", cpu_max_freq_hz=918e6), board):
        pytest.fail("the block must not run")
    assert written and {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}


def test_nvpmodel_is_switched_and_switched_back(tmp_path: Path) -> None:
    ran: list[list[str]] = []
    board = Board(fake_board(tmp_path / "root", nvpmodel_mode=0), runner=ran.append,
                  restore_file=tmp_path / "restore.json")
    with applied_mode(ModeRequest(nvpmodel_id=1), board):
        assert ran == [["nvpmodel", "-m", "1"]]
    assert ran == [["nvpmodel", "-m", "1"], ["nvpmodel", "-m", "0"]]


def test_no_knobs_here_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    with pytest.raises(PowerControlUnavailable, match=r"^unavailable: no cpufreq in .*cpu0"):
        Board(root, restore_file=tmp_path / "r.json").plan(ModeRequest(governor="performance"))
    with pytest.raises(PowerControlUnavailable, match=r"^unavailable: no nvpmodel here"):
        Board(root, restore_file=tmp_path / "r.json").plan(ModeRequest(nvpmodel_id=0))


CRASHER = """
import os, signal, sys, time
from pathlib import Path
from edgetrain.power.control import Board, ModeRequest, applied_mode
board = Board(Path(sys.argv[1]), restore_file=Path(sys.argv[2]))
with applied_mode(ModeRequest(online_cores=1, governor="performance"), board):
    print("applied", flush=True)
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    # short sleeps: a SIGTERM that lands between the interpreter's last signal check and the sleep's
    # system call only runs its handler once that sleep ends, and one 30 s sleep outlasted the wait
    for _ in range(300):
        time.sleep(0.1)
"""


@pytest.mark.parametrize("how", ["kill", "term"])
def test_a_killed_run_leaves_nothing_changed(tmp_path: Path, how: str) -> None:
    """SIGTERM: the handler restores. SIGKILL: nothing runs, so the restore file does it at the next start."""
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    restore = tmp_path / "restore.json"
    child = subprocess.Popen([sys.executable, "-c", CRASHER, str(root), str(restore), how], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout is not None and child.stdout.readline() == "applied\n"
        assert (root / "sys/devices/system/cpu/cpu1/online").read_text() == "0"
        if how == "term":
            child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == (128 + signal.SIGTERM if how == "term" else -signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    if how == "kill":
        assert restore.exists()
        assert recover_pending(Board(root, restore_file=restore)) is True
    assert not restore.exists()
    assert {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}


def test_cli_modes_of_a_catalog_board_and_bad_input() -> None:
    code, out, _ = run("power", "modes", "--device", "jetson-nano", "--json")
    assert code == 0 and [mode["name"] for mode in json.loads(out)["modes"]] == ["MAXN", "5W"]
    code, _, err = run("power", "modes", "--device", "nope")
    assert code == 2 and err.count("\n") == 1 and "unknown device 'nope'" in err


def test_cli_run_with_an_unknown_mode_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Here: 'unavailable: no nvpmodel'; on a Jetson: 'unknown power mode 99'. Either way one line, nothing run."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path))
    code, out, err = run("power", "run", "--mode", "99", "--", sys.executable, "-c", "print('ran')")
    assert code == 2 and err.count("\n") == 1 and "ran" not in out
    assert ("unavailable:" in err) or ("unknown power mode 99" in err)


def test_a_mode_applied_from_a_worker_thread_is_restored(tmp_path: Path) -> None:
    """Signal handlers are the main thread's; from another thread the block still applies and restores."""
    root = fake_board(tmp_path / "root")
    before = snapshot(root)
    seen: list[str] = []

    def work() -> None:
        with applied_mode(ModeRequest(governor="performance"), Board(root, restore_file=tmp_path / "r.json")):
            seen.append((root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == ["performance"]
    assert {k: v.strip() for k, v in snapshot(root).items()} == {k: v.strip() for k, v in before.items()}
