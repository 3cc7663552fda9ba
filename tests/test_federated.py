"""Federated mode: FedAvg on Flower between nodes that train under their budgets, weights only.

Two nodes of the small transformer on slices of the synthetic token set, in this process (one
thread each) talking gRPC to a server in this process or in a child; each test is a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if importlib.util.find_spec("flwr") is None:  # find_spec: importing flwr before the module sets its telemetry off
    pytest.skip("Flower is not installed (pip install 'edgetrain[federated]')", allow_module_level=True)

from edgetrain.distributed.federated import (  # after the skip
    METRICS,
    STATES,
    SUMMARY,
    FederatedConfig,
    FederatedError,
    FederatedNode,
    initial_weights,
    run_client,
)
from edgetrain.distributed.federated_server import FederatedStrategy, run_server
from edgetrain.distributed.supervisor import free_port
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.train.state import StateStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> FederatedConfig:
    """97 token sequences of 16 (77 train, 20 held out: node 0 gets 39 + 10, node 1 38 + 10), 2 steps of 8."""
    data = tmp_path_factory.mktemp("federated")
    return FederatedConfig(run_dir=str(data / "run"), nodes=2, rounds=1, local_steps=2, batch=8,
                           model="transformer_small", samples=97, image=16, connect_timeout_s=60.0,
                           round_timeout_s=60.0)


@pytest.fixture(scope="module")
def nodes(base: FederatedConfig) -> Iterator[list[FederatedNode]]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield [FederatedNode(base, node) for node in range(base.nodes)]
    torch.set_num_threads(threads)


@pytest.fixture
def signals() -> Iterator[None]:
    """Flower's server installs SIGINT/SIGTERM handlers: give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _clients(config: FederatedConfig, nodes: list[FederatedNode]) -> list[threading.Thread]:
    threads = [threading.Thread(target=run_client, args=(config, node), daemon=True) for node in nodes]
    for thread in threads:
        thread.start()
    return threads


def _records(run_dir: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (Path(run_dir) / METRICS).read_text().splitlines()]


def test_one_round_is_the_sample_weighted_average_of_the_nodes_local_training(
        base: FederatedConfig, nodes: list[FederatedNode], tmp_path: Path, signals: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: each node's round-1 training, run here on its own from the initial weights
    config = replace(base, run_dir=str(tmp_path / "run"), address=f"127.0.0.1:{free_port()}")
    start = initial_weights(config)
    (w0, n0, m0), (w1, n1, m1) = (node.fit(start, 1) for node in nodes)
    expected = [(a * n0 + b * n1) / (n0 + n1) for a, b in zip(w0, w1, strict=True)]
    # two node processes each own torch's generator (dropout draws from it); two threads share it: one at a time
    one_at_a_time = threading.Lock()
    for node in nodes:
        def serialised(weights: Any, round_: int, fit: Any = node.fit) -> Any:
            with one_at_a_time:
                return fit(weights, round_)
        monkeypatch.setattr(node, "fit", serialised)

    # Execute: the same round over Flower (server here, the two nodes in threads)
    clients = _clients(config, nodes)
    summary = run_server(config)
    for thread in clients:
        thread.join(timeout=30)

    # Assert: the saved global weights are exactly the weighted average; the nodes differed
    state = StateStore(tmp_path / "run" / STATES).load_latest()
    assert state is not None and state.step == 1
    saved = [state.model[key].numpy() for key in sorted(state.model)]
    assert (n0, n1) == (39, 38)
    assert all(np.array_equal(got, want) for got, want in zip(saved, expected, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(w0, w1, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(saved, w0, strict=True))
    # only weights crossed: every array the nodes sent has the model's own shape (none is a batch of samples)
    model_shapes = [a.shape for a in start]
    assert [a.shape for a in w0] == [a.shape for a in w1] == model_shapes
    assert all(shape[:1] != (config.batch,) for shape in model_shapes)
    (record,) = _records(config.run_dir)
    weights_bytes = sum(a.nbytes for a in start)
    assert weights_bytes < record["bytes_up"] < weights_bytes * 2 * 1.01  # two nodes' arrays, .npy headers
    assert record["round"] == 1 and record["held_out"] == 20 and 0.0 <= record["accuracy"] <= 1.0
    assert record["train_loss"] == pytest.approx((m0["train_loss"] * n0 + m1["train_loss"] * n1) / (n0 + n1))
    assert summary["resumed_from_round"] is None and not any(t.is_alive() for t in clients)


def test_a_reply_that_is_not_the_models_weights_is_refused(base: FederatedConfig) -> None:
    # Prepare
    weights = [np.zeros((4, 3), np.float32), np.zeros(3, np.float32)]
    strategy = FederatedStrategy(base, weights, 0, store=None, metrics=None)

    # Execute / Assert: a batch of samples in place of a weight, or text among the metrics
    with pytest.raises(FederatedError, match="not the model's weights"):
        strategy._check(1, [np.zeros((8, 16), np.int64), weights[1]], {})
    with pytest.raises(FederatedError, match="non-numeric metrics"):
        strategy._check(1, weights, {"note": "a frame"})
    strategy._check(1, [w + 1 for w in weights], {"train_loss": 0.5})


def _server(config: FederatedConfig, path: Path) -> subprocess.Popen[bytes]:
    path.write_text(config.to_json())
    return subprocess.Popen([sys.executable, "-m", "edgetrain.distributed.federated_process", "server", str(path)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


# gRPC's thread watching a channel that the lost server's node closed reports it as an exception; harmless
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_killed_between_rounds_resumes_and_the_nodes_reconnect(
        base: FederatedConfig, nodes: list[FederatedNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the nodes hold round 2's training until the server (which saved round 1) is killed
    config = replace(base, run_dir=str(tmp_path / "run"), rounds=3, address=f"127.0.0.1:{free_port()}")
    arrived, killed = threading.Semaphore(0), threading.Event()
    for node in nodes:
        def gated(weights: Any, round_: int, fit: Any = node.fit) -> Any:
            if round_ == 2 and not killed.is_set():
                arrived.release()
                killed.wait(timeout=60)
            return fit(weights, round_)
        monkeypatch.setattr(node, "fit", gated)
    server = _server(config, tmp_path / "config.json")
    clients = _clients(config, nodes)

    # Execute: kill -9 between rounds 1 and 2, start the server again
    try:
        assert arrived.acquire(timeout=90) and arrived.acquire(timeout=30)
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed.set()
        server = _server(replace(config, resume=True), tmp_path / "config.json")
        assert server.wait(timeout=90) == 0
    finally:
        killed.set()
        if server.poll() is None:
            server.kill()
            server.wait()
    for thread in clients:
        thread.join(timeout=30)

    # Assert: rounds 1-3 once each, in order; the second server went on from round 1
    assert [r["round"] for r in _records(config.run_dir)] == [1, 2, 3]
    summary = json.loads((Path(config.run_dir) / SUMMARY).read_text())
    assert summary["resumed_from_round"] == 1
    state = StateStore(Path(config.run_dir) / STATES).load_latest()
    assert state is not None and state.step == 3
    assert not any(t.is_alive() for t in clients)


def test_a_budget_that_cannot_hold_the_node_is_refused_in_one_line(base: FederatedConfig) -> None:
    # Execute: 64 MiB is below a torch process's runtime baseline alone
    with pytest.raises(InfeasibleBudgetError) as refused:
        FederatedNode(replace(base, memory=("64MiB",)), 1)

    # Assert
    message = str(refused.value)
    assert message.startswith("node 1: budget 64.00 MiB (67108864 bytes) is below what training needs")
    assert "runtime baseline" in message and "6 copies of the weights" in message and "\n" not in message
    assert refused.value.budget_bytes == 64 * 2**20 and refused.value.minimum_bytes > 64 * 2**20


def test_a_node_without_a_server_gives_up_after_its_timeout(base: FederatedConfig,
                                                             nodes: list[FederatedNode]) -> None:
    config = replace(base, address=f"127.0.0.1:{free_port()}", connect_timeout_s=1.0)

    with pytest.raises(FederatedError, match=r"node 0: the server at 127\.0\.0\.1:\d+ did not answer for"):
        run_client(config, nodes[0])


def _insitu_node(root: Path, tracks: range, seed: int) -> None:
    """A node folder as `edgetrain insitu run` leaves it: a teacher (4 replay crops) and a store of one frame per
    track, random pixels, label ``track % 4``."""
    from edgetrain.insitu.gate import Calibration
    from edgetrain.insitu.model import classifier
    from edgetrain.insitu.store import FrameStore, encode_png
    from edgetrain.insitu.student import FRAMES, TEACHER
    from edgetrain.insitu.teacher import Teacher, save_teacher

    rng = np.random.default_rng(seed)
    root.mkdir()
    crops = rng.integers(0, 256, (len(tracks) + 4, 32, 32, 3), dtype=np.uint8)
    calibration = Calibration(np.zeros((4, 64)), np.ones(64), 1.0, np.zeros((4, 2)))
    save_teacher(Teacher(classifier(4, 0), calibration, crops[-4:], np.arange(4)), root / TEACHER)
    FrameStore(root / FRAMES, 2**20).add([(encode_png(crops[i]), t % 4, t) for i, t in enumerate(tracks)])


def test_an_insitu_node_trains_on_its_stored_frames_and_the_replay_and_scores_on_held_out_tracks(
        tmp_path: Path) -> None:
    from edgetrain.distributed.federated import node_data
    from edgetrain.insitu.student import held_out

    # Prepare: two camera nodes, 30 tracks each (a fifth of the tracks held out by hash)
    _insitu_node(tmp_path / "a", range(0, 30), 1)
    _insitu_node(tmp_path / "b", range(100, 130), 2)
    config = FederatedConfig(run_dir=str(tmp_path / "run"), nodes=2, batch=4, local_steps=1,
                             stores=(str(tmp_path / "a"), str(tmp_path / "b")))

    # Execute
    data = node_data(config, 1)
    weights, samples, _ = FederatedNode(config, 1, data).fit(initial_weights(config), 1)

    # Assert
    held = sum(held_out(t) for t in range(100, 130))
    assert 0 < held < 30 and data.own_samples == samples == 30 - held
    assert len(data.train_y) == 30 - held + 4 and len(data.val_y) == held and data.augment
    assert [w.shape for w in weights] == [w.shape for w in initial_weights(config)]


def test_without_flower_the_command_says_which_extra_to_install(tmp_path: Path) -> None:
    # Prepare: a child interpreter where flwr cannot be imported
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nfrom importlib.abc import MetaPathFinder\n\n\nclass _Block(MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'flwr':\n"
        "            raise ModuleNotFoundError(name)\n\n\nsys.meta_path.insert(0, _Block())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    # Execute
    result = subprocess.run([sys.executable, "-m", "edgetrain", "cluster", "federated", "--run-dir",
                             str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)

    # Assert
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: federated mode needs Flower: pip install 'edgetrain[federated]' (Python 3.11 or newer)"]


def test_flower_is_an_extra_not_a_dependency_of_the_device_install() -> None:
    from edgetrain.devices.catalog import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    assert not any(r.startswith(("flwr", "grpcio")) for r in project["dependencies"])
    assert project["optional-dependencies"]["federated"] == ["flwr==1.41.0; python_version >= '3.11'"]
    assert "federated" in project["optional-dependencies"]["all"][0]
