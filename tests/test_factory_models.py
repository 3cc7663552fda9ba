"""A model the user wrote, from the command line: ``--model package.module:factory`` with ``--model-arg``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from edgetrain.errors import EdgetrainError
from edgetrain.models import get_model_spec
from edgetrain.models.factory import factory_name, factory_parts, parse_model_args
from edgetrain.train.state import StateStore

NETS = '''
from torch import nn


def make_net(width: int = 8, num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.Conv2d(width, width, 3, padding=1, stride=2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))


def not_a_model():
    return 42


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x, mask):
        return self.fc(x.mean((2, 3))) * mask


def needs_a_mask(num_classes: int = 10) -> nn.Module:
    return _Masked()


def five_outputs() -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 5))
'''

RUN = ("--model", "nets:make_net", "--model-arg", "width=12", "--samples", "200", "--batch", "8", "--image", "32")


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """The user's own folder, holding the module of their models, as the working directory of each command."""
    (tmp_path / "nets.py").write_text(NETS)
    return tmp_path


def edgetrain(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The installed `edgetrain` script, run in ``folder``: not `python -m`, which would put the folder on the path."""
    script = Path(sys.executable).with_name("edgetrain")
    return subprocess.run([str(script), *args], cwd=folder, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def step_losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def test_the_arguments_are_part_of_the_models_one_name() -> None:
    # Execute
    name = factory_name("pkg.nets:make", parse_model_args(["width=12", "act='relu'", "sizes=(1, 2)", "tag=wide"]))

    # Assert: keys sorted, values as literals (a bare word stays a string), and the name reads back
    assert name == "pkg.nets:make(act='relu', sizes=(1, 2), tag='wide', width=12)"
    assert factory_parts(name) == ("pkg.nets", "make", {"act": "relu", "sizes": (1, 2), "tag": "wide", "width": 12})
    assert factory_name("pkg.nets:make", {}) == "pkg.nets:make"


@pytest.mark.parametrize(("items", "phrase"), [
    (["width"], "give KEY=VALUE"), (["1x=2"], "give KEY=VALUE"), (["w=1", "w=2"], "given twice")])
def test_a_malformed_model_arg_is_refused(items: list[str], phrase: str) -> None:
    with pytest.raises(EdgetrainError, match=phrase):
        parse_model_args(items)


def test_the_factory_gets_the_datas_class_count_where_it_takes_one(user_folder: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.syspath_prepend(str(user_folder))
    spec = get_model_spec("nets:make_net(width=6)")

    # Execute
    model = spec.build(3)

    # Assert: the factory's own default, its argument, and the count the data asked for
    assert spec.default_num_classes == 10 and spec.name == "nets:make_net(width=6)"
    assert model[-1].out_features == 3 and model[0].out_channels == 6


def test_train_plan_and_train_from_the_plan_with_a_factory(user_folder: Path) -> None:
    # Execute: a run planned here, then a plan made for it and a run from that plan
    trained = edgetrain(user_folder, "train", *RUN, "--epochs", "1", "--step-memory", "2MiB", "--run-dir", "run")
    planned = edgetrain(user_folder, "plan", *RUN[:4], "-b", "8", "--image", "32", "--memory", "1.5MiB",
                        "-o", "plan.json")
    shipped = edgetrain(user_folder, "train", *RUN, "--epochs", "1", "--plan", "plan.json", "--run-dir", "shipped")

    # Assert: the run records the model's one name, and the shipped plan is what ran
    assert trained.returncode == 0, trained.stderr[-2000:]
    identity = json.loads((user_folder / "run" / "run.json").read_text())["identity"]
    assert identity["model"] == "nets:make_net(width=12)"
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    summary = json.loads((user_folder / "shipped" / "summary.json").read_text())
    assert summary["measured_peak_bytes"] <= summary["predicted_tracked_peak_bytes"]
    assert json.loads((user_folder / "shipped" / "run.json").read_text())["identity"]["model"] == identity["model"]


def test_a_cluster_of_two_nodes_trains_a_factory_model(user_folder: Path) -> None:
    # Execute: each node process builds the model from the user's module
    done = edgetrain(user_folder, "cluster", "local", "--nodes", "2", *RUN[:4], "--samples", "64", "--batch", "16",
                     "--image", "16", "--run-dir", "cluster")

    # Assert: both nodes trained every step of the run recorded under the model's one name
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((user_folder / "cluster" / "run.json").read_text())["identity"]["model"] == \
        "nets:make_net(width=12)"
    assert len(step_losses(user_folder / "cluster")) == 3   # whole global batches of 16 in the training split


def test_another_factory_argument_is_another_run(user_folder: Path) -> None:
    # Prepare
    first = edgetrain(user_folder, "train", *RUN, "--epochs", "1", "--run-dir", "run")
    assert first.returncode == 0, first.stderr[-2000:]

    # Execute
    other = edgetrain(user_folder, "train", *RUN[:2], "--model-arg", "width=16", *RUN[4:], "--epochs", "1",
                      "--run-dir", "run", "--resume")

    # Assert
    assert other.returncode == 2 and "width=12" in other.stderr and "width=16" in other.stderr, other.stderr


@pytest.mark.slow
def test_a_factory_run_killed_and_resumed_ends_as_the_uninterrupted_run(user_folder: Path) -> None:
    # Prepare: the uninterrupted run
    whole = edgetrain(user_folder, "train", *RUN, "--epochs", "3", "--save-every", "5", "--run-dir", "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    script = Path(sys.executable).with_name("edgetrain")
    command = [str(script), "train", *RUN, "--epochs", "3", "--save-every", "5", "--run-dir", "broken"]

    # Execute: kill -9 once a few states are saved, then the same command with --resume
    process = subprocess.Popen(command, cwd=user_folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    broken = user_folder / "broken"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if (broken / "metrics.jsonl").exists() and len(step_losses(broken)) >= 22:
            break
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = len(step_losses(broken))
    resumed = edgetrain(user_folder, "train", *RUN, "--epochs", "3", "--save-every", "5", "--run-dir", "broken",
                        "--resume")

    # Assert: killed mid-run; the resumed run's losses and weights are the uninterrupted run's
    assert 22 <= killed_at < 60, killed_at
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert step_losses(broken) == step_losses(user_folder / "whole")
    expected = StateStore(user_folder / "whole" / "state").load_latest()
    got = StateStore(broken / "state").load_latest()
    assert expected is not None and got is not None
    for key, tensor in got.model.items():
        assert torch.equal(tensor, expected.model[key]), key


@pytest.mark.parametrize(("model", "extra", "phrase"), [
    ("nope:make_net", (), "cannot import 'nope': ModuleNotFoundError"),
    ("nets:nothing", (), "'nets' has no callable 'nothing'"),
    ("nets:not_a_model", (), "returned an object of type int, not a torch nn.Module"),
    ("nets:make_net", ("--model-arg", "depth=3"), "takes no argument 'depth' (it takes: width, num_classes)"),
    ("nets:needs_a_mask", (), "missing 1 required positional argument: 'mask'"),
    ("nets:five_outputs", (), "scores of shape (8, 5), where the data needs (8, 10)"),
    ("resnet18", ("--model-arg", "width=3"), "--model-arg is for a factory"),
    ("nets:make_net(width=os)", (), "its arguments must be key=literal pairs"),
])
def test_a_factory_that_cannot_train_is_one_line_before_anything_is_written(user_folder: Path, model: str,
                                                                             extra: tuple[str, ...],
                                                                             phrase: str) -> None:
    # Execute
    result = edgetrain(user_folder, "train", "--model", model, *extra, "--samples", "200", "--batch", "8",
                       "--image", "16", "--epochs", "1", "--run-dir", "run")

    # Assert
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert phrase in lines[0], lines[0]
    assert not (user_folder / "run").exists()
