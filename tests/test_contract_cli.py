"""The unattended-node contract at the command line: bad input is one line and exit 2 before any file is written,
every float option refuses NaN and infinity, errors name what the user gave, a power mode is restored by the next
power command."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer.main
from PIL import Image

from edgetrain.cli import app
from edgetrain.cli.common import click_exceptions, click_types, refuse_non_finite
from edgetrain.devices.catalog import DEVICES_ENV
from tests.test_cli import run


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the digest of its bytes (directories as ``dir``); {} if there is no ``root``."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def _float_options() -> list[tuple[str, object]]:
    """(command path, option) for every float option of every command, wrapped as ``main`` wraps the tree."""
    found: list[tuple[str, object]] = []

    def walk(command: object, path: str) -> None:
        for param in command.params:  # type: ignore[attr-defined]
            if isinstance(param.type, click_types.FloatParamType):
                found.append((path, param))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    tree = typer.main.get_command(app)
    walk(tree, "edgetrain")
    refuse_non_finite(tree)
    return found


def test_every_float_option_refuses_nan_and_infinity() -> None:
    options = _float_options()
    names = {(path, param.opts[0]) for path, param in options}  # type: ignore[attr-defined]
    # the options the probes found accepting NaN are among them, so the walk reaches every group
    assert {("edgetrain power advise", "--deadline"), ("edgetrain power advise", "--power-cap"),
            ("edgetrain insitu run", "--margin"), ("edgetrain plan", "--recompute")} <= names
    assert len(options) >= 30
    for _, param in options:
        for text in ("nan", "inf", "-inf", "NaN", "1e400"):
            with pytest.raises(click_exceptions.BadParameter, match=r"not a finite number|is not in the range"):
                param.type.convert(text, param, None)  # type: ignore[attr-defined]
        inner = param.type.inner  # type: ignore[attr-defined]
        allowed = [x for x in (0.5, 1.0, 2.5, 100.0) if _converts(inner, x, param)]
        assert allowed and param.type.convert(str(allowed[0]), param, None) == allowed[0]  # type: ignore[attr-defined]


def _converts(kind: object, value: float, param: object) -> bool:
    try:
        kind.convert(str(value), param, None)  # type: ignore[attr-defined]
    except click_exceptions.BadParameter:
        return False
    return True


@pytest.mark.parametrize("args, option", [
    (("power", "advise", "--deadline", "nan"), "--deadline"),
    (("power", "advise", "--power-cap", "inf"), "--power-cap"),
    (("insitu", "run", "--margin", "nan"), "--margin"),
    (("train", "--lr", "inf"), "--lr"),
])
def test_a_non_finite_number_is_one_line_naming_the_option(args: tuple[str, ...], option: str) -> None:
    code, out, err = run(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and option in err and "not a finite number" in err


def test_too_few_samples_are_refused_before_the_run_directory_exists(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "a"
    code, _, err = run("train", "--samples", "16", "--run-dir", str(run_dir))
    assert code == 2
    # 10 classes of 1-2 images: 20% of each rounds to 0 held out; 21 images give class 0 three, one held out
    assert err.count("\n") == 1 and "--samples 16 gives 16 images to train on and 0 held out" in err
    assert "give --samples 21 or more" in err
    assert not (tmp_path / "runs").exists()
    assert run("train", "--samples", "18", "--batch", "16", "--run-dir", str(run_dir))[0] == 2  # 2 held out, 16 left
    assert not (tmp_path / "runs").exists()


def _image_folder(root: Path, classes: int) -> Path:
    for label in range(classes):
        (root / f"c{label}").mkdir(parents=True)
        for index in range(4):
            Image.new("RGB", (8, 8), (40 * index, 60 * label, 0)).save(root / f"c{label}" / f"{index}.png")
    return root


@pytest.mark.parametrize("classes", [0, 1])
def test_an_unusable_image_folder_leaves_the_run_directory_as_it_was(tmp_path: Path, classes: int) -> None:
    data = _image_folder(tmp_path / "data", classes)
    (data / "empty").mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's")
    before = _tree(run_dir)
    code, _, err = run("train", "--data", str(data), "--image", "32", "--run-dir", str(run_dir))
    assert code == 2 and str(data) in err
    assert _tree(run_dir) == before


def test_a_budget_below_the_least_step_keeps_the_replaced_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    common = ("train", "--model", "resnet18", "--samples", "40", "--batch", "4", "--image", "32", "--epochs", "1",
              "--run-dir", str(run_dir))
    assert run(*common)[0] == 0
    before = _tree(run_dir)
    code, _, err = run(*common, "--overwrite", "--memory", "100MiB")
    assert code == 2 and err.count("\n") == 1
    assert "budget 100.00 MiB (104857600 bytes) is below what training needs in this process" in err
    assert _tree(run_dir) == before  # --overwrite replaces the run only once the new one can start


def test_a_budget_below_the_least_step_leaves_no_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "new" / "run"
    code, _, err = run("train", "--model", "resnet18", "--samples", "40", "--batch", "4", "--image", "32",
                       "--memory", "100MiB", "--run-dir", str(run_dir))
    assert code == 2 and "is below what training needs" in err
    assert not (tmp_path / "new").exists()  # neither the run directory nor the data generated to profile a batch


@pytest.mark.parametrize("target", ["a-folder", "missing/p.json"])
def test_a_plan_that_cannot_be_saved_names_the_users_path(tmp_path: Path, target: str) -> None:
    (tmp_path / "a-folder").mkdir()
    output = tmp_path / target
    code, _, err = run("plan", "-m", "resnet18", "-b", "2", "--image", "32", "--memory", "500MiB", "-o", str(output))
    assert code == 2 and err.count("\n") == 1
    assert str(output) in err and ".tmp" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a-folder"]


def test_a_device_with_more_memory_than_an_address_space_is_refused(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICES_ENV, "")  # --devices-file sets it for the process: restored after the test
    devices = tmp_path / "huge.toml"
    devices.write_text('[devices.huge]\ntitle = "huge"\ncpu = "x"\nmemory_bytes = 1000000000000000000000000000000\n'
                       '[devices.huge.sources]\nmemory_bytes = "typed by hand"\n')
    for command in (("memory", "-m", "resnet18", "-b", "2", "--device", "huge"),
                    ("plan", "-m", "resnet18", "-b", "2", "--device", "huge")):
        code, _, err = run("--devices-file", str(devices), *command)
        assert code == 2 and "huge.toml: device 'huge': memory_bytes = 1000000000000000000000000000000" in err


@pytest.mark.parametrize("command", [("modes",), ("modes", "--device", "jetson-nano"),
                                     ("advise", "--device", "jetson-nano", "--simulate-seed", "0")])
def test_every_power_command_first_restores_a_mode_a_killed_run_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     command: tuple[str, ...]) -> None:
    # a board's sysfs in a folder, as a `power run --cores 1` killed with SIGKILL leaves it: CPU 1 off, the record kept
    online = tmp_path / "root" / "sys" / "devices" / "system" / "cpu" / "cpu1" / "online"
    online.parent.mkdir(parents=True)
    online.write_text("0\n")
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    record = tmp_path / "cache" / "power_restore.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"root": str(tmp_path / "root"), "writes": [[str(online), "1"]]}))
    code, _, err = run("power", *command)
    assert code == 0, err
    assert online.read_text().strip() == "1" and not record.exists()
    assert run("power", "restore")[1].startswith("nothing to restore")


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()}
    except (FileNotFoundError, ProcessLookupError):
        return set()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_data_workers_die_with_the_training_process(tmp_path: Path) -> None:
    # within 2 s: before PyTorch's own watchdog, which looks every 5 s
    script = Path(sys.executable).with_name("edgetrain")
    trainer = subprocess.Popen([str(script), "train", "--model", "resnet18", "--samples", "200", "--image", "32",
                                "--batch", "4", "--epochs", "20", "--workers", "2", "--run-dir", str(tmp_path / "r")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and trainer.poll() is None:
            workers = _children(trainer.pid)
            time.sleep(0.1)
        assert len(workers) == 2
        trainer.kill()
        trainer.wait()
        stop = time.monotonic() + 2
        while any(_alive(w) for w in workers) and time.monotonic() < stop:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers)
    finally:
        trainer.kill()
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
