"""Crash-safe training state: exact round trips, the durable-write protocol under simulated
crashes and corruption, pruning, the resumable sampler and RNG capture, and a real process
killed with SIGKILL and resumed to bit-identical losses and weights.

Exactness: on one CPU thread, the same weights, optimizer state, batch order and RNG state
give the same floats, so everything here is compared with ``torch.equal`` / ``==``, never
with a tolerance.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from edgetrain.core.schedule import Backward, Discard, Forward, Keep, Schedule
from edgetrain.errors import EdgetrainError
from edgetrain.train import (
    CorruptStateError,
    ResumableSampler,
    StateError,
    StateStore,
    TrainingState,
    capture_rng,
    load_state,
    restore_rng,
    save_state,
)

SRC = Path(__file__).resolve().parents[1] / "src"
HEADER_BYTES = 64


# --------------------------------------------------------------------------- helpers


def make_run(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """Steps whose result depends on the weights, the momentum and the torch RNG (data, dropout)."""
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 5), torch.randn(4, 2)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def a_schedule() -> Schedule:
    """A schedule with every op kind and some planner params, to check it survives serialization."""
    ops = (Forward(0, Keep.INPUT), Forward(1), Discard(1), Forward(1, Keep.ALL), Backward(1),
           Forward(0, Keep.ALL), Backward(0))
    return Schedule(ops, 2, strategy="revolve", params={"slots": 1, "budget_bytes": 1 << 20})


def tiny_state(step: int, epoch: int = 0) -> TrainingState:
    """A state whose weights encode its step, so a test can tell which file was loaded."""
    return TrainingState(step=step, epoch=epoch, model={"w": torch.full((3,), float(step))})


def save_steps(store: StateStore, steps: range | list[int]) -> None:
    for step in steps:
        store.save(tiny_state(step))


def stored_steps(store: StateStore) -> list[int]:
    return [int(p.name[len("state-"):-len(".pt")]) for p in store.paths()]


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- round trip


def test_round_trip_restores_a_run_that_continues_identically(tmp_path: Path) -> None:
    # Prepare: a trained model with momentum buffers, a schedule, metadata and RNG mid-stream.
    model, optimizer = make_run()
    train_steps(model, optimizer, 3)
    random.gauss(0, 1), np.random.randn(1)  # leave cached Gaussians in Python's and NumPy's state
    sampler = ResumableSampler(10, seed=3)
    sampler.set_epoch(2)
    state = TrainingState.capture(step=3, epoch=2, model=model, optimizer=optimizer, schedule=a_schedule(),
                                  sampler=sampler, metadata={"config": {"lr": 0.1, "tags": ["a", "b"]}, "best": 0.5})
    path = StateStore(tmp_path).save(state)
    expected_losses = train_steps(model, optimizer, 2)
    expected_draws = (random.random(), random.gauss(0, 1), np.random.randn(3).tolist())

    # Execute: a fresh process-like start with different weights and RNG, then restore.
    fresh_model, fresh_optimizer = make_run(seed=99)
    random.seed(99), np.random.seed(99)
    loaded = load_state(path)
    fresh_sampler = ResumableSampler(10, seed=3)
    loaded.restore(fresh_model, fresh_optimizer, sampler=fresh_sampler)

    # Assert: every part survived, and training continues exactly as the original did.
    assert (loaded.step, loaded.epoch) == (3, 2)
    assert loaded.schedule == a_schedule() and loaded.schedule.params == a_schedule().params
    assert loaded.metadata == {"config": {"lr": 0.1, "tags": ["a", "b"]}, "best": 0.5}
    assert (fresh_sampler.epoch, fresh_sampler.position) == (2, 0)
    assert train_steps(fresh_model, fresh_optimizer, 2) == expected_losses
    assert (random.random(), random.gauss(0, 1), np.random.randn(3).tolist()) == expected_draws
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh_model.state_dict()[name], tensor), name
    for index, buffers in optimizer.state_dict()["state"].items():
        assert torch.equal(fresh_optimizer.state_dict()["state"][index]["momentum_buffer"], buffers["momentum_buffer"])


def test_file_is_header_plus_a_payload_that_loads_with_weights_only(tmp_path: Path) -> None:
    model, optimizer = make_run()
    train_steps(model, optimizer, 1)
    path = save_state(TrainingState.capture(step=1, epoch=0, model=model, optimizer=optimizer,
                                            schedule=a_schedule()), tmp_path / "s.pt")
    data = path.read_bytes()
    magic, version, length, digest = struct.unpack("<8sIQ32s12x", data[:HEADER_BYTES])
    assert (magic, version, length) == (b"EDGTSTAT", 1, len(data) - HEADER_BYTES)
    assert digest == hashlib.sha256(data[HEADER_BYTES:]).digest()
    payload = torch.load(io.BytesIO(data[HEADER_BYTES:]), weights_only=True)
    assert payload["schedule"] == a_schedule().to_dict()
    assert isinstance(payload["rng"]["torch"], torch.Tensor)


def test_unsafe_payload_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    state = tiny_state(1)
    state.metadata = {"scores": {"best": np.float64(0.5)}}  # a float subclass that pickles as a NumPy global
    with pytest.raises(StateError, match=r"metadata.*'best'.*numpy"):
        store.save(state)
    assert list(tmp_path.iterdir()) == []


def test_restore_asks_for_parts_the_state_does_not_have() -> None:
    model, optimizer = make_run()
    state = TrainingState(step=0, epoch=0, model=model.state_dict())
    with pytest.raises(StateError, match="no optimizer"):
        state.restore(model, optimizer)


def test_restore_warns_when_torch_version_differs(caplog: pytest.LogCaptureFixture) -> None:
    model, _ = make_run()
    state = TrainingState.capture(step=0, epoch=0, model=model)
    state.torch_version = "1.0.0"
    with caplog.at_level(logging.WARNING, logger="edgetrain.train.state"):
        state.restore(model)
    assert "torch 1.0.0" in caplog.text


# --------------------------------------------------------------------------- RNG


def test_restore_rng_reproduces_draws_of_every_generator() -> None:
    random.gauss(0, 1), np.random.randn(1)  # cached Gaussians are part of the state
    rng = capture_rng()

    def draws() -> tuple[object, ...]:
        dropout = nn.functional.dropout(torch.ones(16), 0.5)
        return (torch.rand(4).tolist(), dropout.tolist(), torch.randperm(9).tolist(), random.random(),
                random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(2).tolist())

    first = draws()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    restore_rng(rng)
    assert draws() == first


def test_rng_snapshot_is_independent_of_later_draws() -> None:
    rng = capture_rng()
    expected = torch.rand(3)
    torch.rand(100)
    restore_rng(rng)
    assert torch.equal(torch.rand(3), expected)


def test_cuda_states_for_missing_devices_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    rng = capture_rng()
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rng["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * (available + 1)
    with caplog.at_level(logging.WARNING, logger="edgetrain.train.state"):
        restore_rng(rng)
    assert "CUDA random streams will differ" in caplog.text


# --------------------------------------------------------------------------- sampler


def test_sampler_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    sampler = ResumableSampler(50, seed=1)
    first = sampler.order(0)
    assert sorted(first.tolist()) == list(range(50))
    assert torch.equal(ResumableSampler(50, seed=1).order(0), first)
    assert not torch.equal(sampler.order(1), first)
    assert not torch.equal(ResumableSampler(50, seed=2).order(0), first)
    assert ResumableSampler(6, seed=1, shuffle=False).order(3).tolist() == list(range(6))


@pytest.mark.parametrize("position", [0, 1, 17, 49, 50])
def test_sampler_resumes_mid_epoch_with_exactly_the_remaining_order(position: int) -> None:
    sampler = ResumableSampler(50, seed=4)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(position)]
    resumed = ResumableSampler(50, seed=4)
    resumed.load_state_dict(sampler.state_dict())
    assert len(resumed) == 50 - position
    assert head + list(resumed) == sampler.order(3).tolist()


def test_sampler_position_counts_batches_a_single_process_loader_delivered() -> None:
    sampler = ResumableSampler(20, seed=0)
    loader = DataLoader(TensorDataset(torch.arange(20)), batch_size=3, sampler=sampler)
    seen = []
    for batch_index, (batch,) in enumerate(loader):
        seen += batch.tolist()
        if batch_index == 2:
            break
    assert sampler.position == 9
    resumed = ResumableSampler(20, seed=0)
    resumed.load_state_dict(sampler.state_dict())
    rest = [i for (batch,) in DataLoader(TensorDataset(torch.arange(20)), batch_size=3, sampler=resumed)
            for i in batch.tolist()]
    assert seen + rest == sampler.order(0).tolist()


def test_sampler_state_takes_consumed_count_and_refuses_other_datasets() -> None:
    sampler = ResumableSampler(10, seed=0)
    list(sampler)
    assert sampler.state_dict(consumed=4)["position"] == 4
    with pytest.raises(StateError, match="cannot be resumed"):
        ResumableSampler(11, seed=0).load_state_dict(sampler.state_dict())
    with pytest.raises(StateError, match="cannot be resumed"):
        ResumableSampler(10, seed=1).load_state_dict(sampler.state_dict())


# --------------------------------------------------------------------------- store


@pytest.mark.parametrize("keep_last", [1, 2, 3])
@pytest.mark.parametrize("saves", [1, 3, 5])
def test_store_keeps_the_newest_keep_last_states(tmp_path: Path, keep_last: int, saves: int) -> None:
    store = StateStore(tmp_path, keep_last=keep_last)
    for step in range(1, saves + 1):
        store.save(tiny_state(step * 10))
        assert stored_steps(store) == [s * 10 for s in range(max(1, step - keep_last + 1), step + 1)]
    assert store.load_latest().step == saves * 10  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in store.paths()]


def test_file_names_sort_by_step(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep_last=5)
    save_steps(store, [9, 10, 1234])
    assert [p.name for p in store.paths()] == ["state-000000009.pt", "state-000000010.pt", "state-000001234.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in store.paths()]


def test_saving_a_step_again_replaces_its_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep_last=2)
    store.save(tiny_state(5, epoch=0))
    store.save(tiny_state(5, epoch=1))  # the epoch-end save after the last batch's save
    assert stored_steps(store) == [5]
    assert store.load_latest().epoch == 1  # type: ignore[union-attr]


def test_empty_directory_has_no_state(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "new" / "run").load_latest() is None


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "payload_bit_flip": lambda p: flip_bit(p, HEADER_BYTES + (p.stat().st_size - HEADER_BYTES) // 2),
    "checksum_bit_flip": lambda p: flip_bit(p, 30),
    "empty": lambda p: p.write_bytes(b""),
    "plain_torch_file": lambda p: torch.save({"w": torch.zeros(3)}, p),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_latest_falls_back_to_previous_with_a_warning(
        tmp_path: Path, corruption: str, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path, keep_last=3)
    save_steps(store, [1, 2, 3])
    CORRUPTIONS[corruption](store.path_for(3))
    with caplog.at_level(logging.WARNING, logger="edgetrain.train.state"):
        state = store.load_latest()
    assert state is not None and state.step == 2
    assert torch.equal(state.model["w"], torch.full((3,), 2.0))
    assert "state-000000003.pt" in caplog.text


def test_checksum_mismatch_is_detected(tmp_path: Path) -> None:
    path = save_state(tiny_state(1), tmp_path / "s.pt")
    flip_bit(path, path.stat().st_size - 100)
    with pytest.raises(CorruptStateError, match="SHA-256 checksum mismatch") as raised:
        load_state(path)
    assert raised.value.path == path


def test_no_intact_state_is_a_clear_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep_last=2)
    save_steps(store, [1, 2])
    for path in store.paths():
        CORRUPTIONS["truncated"](path)
    with pytest.raises(EdgetrainError, match=r"no intact training state.*state-000000002\.pt.*state-000000001\.pt"):
        store.load_latest()


def test_crash_mid_write_leaves_a_temp_file_that_is_ignored_and_removed(tmp_path: Path) -> None:
    # A process killed during save leaves `.state-<step>.pt.<random>.tmp` with part of the payload.
    store = StateStore(tmp_path, keep_last=2)
    save_steps(store, [1, 2])
    stray = tmp_path / ".state-000000003.pt.k3j2x9.tmp"
    stray.write_bytes(store.path_for(2).read_bytes()[:100])
    assert store.load_latest().step == 2  # type: ignore[union-attr]
    assert not stray.exists()
    assert stored_steps(store) == [1, 2]


def test_failed_write_removes_its_temp_file_and_keeps_older_states(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path, keep_last=1)
    save_steps(store, [1])

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("card removed")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StateError, match=r"cannot save the training state .*: card removed; the states saved before"):
        store.save(tiny_state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-000000001.pt"]


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 2 MiB tmpfs, unmounted afterwards whatever happens; skips where mounting needs root."""
    mount = tmp_path / "card"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_while_streaming_a_state_is_one_line_and_keeps_the_older_state(small_disk: Path) -> None:
    store = StateStore(small_disk, keep_last=2)
    store.save(tiny_state(1))
    older = store.path_for(1).read_bytes()
    big = TrainingState(step=2, epoch=0, model={"w": torch.ones(1 << 20)})  # 4 MiB: more than the card holds
    with pytest.raises(StateError) as error:
        store.save(big)
    assert "No space left on device" in str(error.value) and "\n" not in str(error.value)
    assert sorted(p.name for p in small_disk.iterdir()) == ["state-000000001.pt"]
    assert store.path_for(1).read_bytes() == older


def test_saving_after_a_fallback_replaces_the_corrupt_state_and_drops_abandoned_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path, keep_last=2)
    save_steps(store, [1, 2, 3])
    CORRUPTIONS["payload_bit_flip"](store.path_for(3))
    assert store.load_latest().step == 2  # type: ignore[union-attr]
    store.save(tiny_state(3))  # the resumed run redoes step 3
    assert stored_steps(store) == [2, 3]
    assert store.load_latest().step == 3  # type: ignore[union-attr]
    with caplog.at_level(logging.WARNING, logger="edgetrain.train.state"):
        store.save(tiny_state(1))  # a run restarted further back abandons the later states
    assert stored_steps(store) == [1]
    assert "abandoned" in caplog.text


# --------------------------------------------------------------------------- a real process, killed


TRAIN_SCRIPT = textwrap.dedent('''
    """Tiny resumable training run: saves every step and at epoch ends; can die by SIGKILL."""
    import argparse
    import logging
    import os
    import random
    import signal
    import sys
    import time
    from pathlib import Path

    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from edgetrain.core.schedule import keep_all
    from edgetrain.train import ResumableSampler, StateStore, TrainingState

    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--kill-after-step", type=int, default=-1)
    parser.add_argument("--kill-inside-save-of-step", type=int, default=-1)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(1)

    def append_loss(step, loss):
        with open(args.run_dir / "losses.log", "a") as log:
            log.write(f"{step} {loss.hex()}\\n")
            log.flush()
            os.fsync(log.fileno())

    def die_at_next_fsync():
        def fsync(fd):
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync = fsync

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    data = torch.Generator().manual_seed(123)
    x, y = torch.randn(40, 6, generator=data), torch.randn(40, 1, generator=data)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = ResumableSampler(len(x), seed=7)
    # Its own generator: creating a loader iterator must not draw from the global torch RNG.
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler, generator=torch.Generator())
    store = StateStore(args.run_dir / "states", keep_last=3)

    def save(step, epoch):
        store.save(TrainingState.capture(step=step, epoch=epoch, model=model, optimizer=optimizer,
                                         schedule=keep_all(4), sampler=sampler, metadata={"lr": 0.05}))

    step, epoch = 0, 0
    state = store.load_latest()
    if state is not None:
        state.restore(model, optimizer, sampler=sampler)
        step, epoch = state.step, state.epoch
        print(f"resumed {step} {epoch} {sampler.position}", flush=True)
    while epoch < args.epochs:
        for xb, yb in loader:
            time.sleep(args.step_delay_s)
            noise = 0.01 * (random.random() + float(np.random.rand()))  # every RNG feeds the loss
            loss = nn.functional.mse_loss(model(xb) + noise, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            append_loss(step, loss.item())
            if step == args.kill_inside_save_of_step:
                die_at_next_fsync()
            save(step, epoch)
            print(f"saved {step}", flush=True)
            if step == args.kill_after_step:
                os.kill(os.getpid(), signal.SIGKILL)
        epoch += 1
        sampler.set_epoch(epoch)
        save(step, epoch)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.run_dir / "final.pt")
    print("done", flush=True)
''')
TOTAL_STEPS = 4 * 40 // 8


def start_run(run_dir: Path, *flags: str) -> subprocess.Popen[str]:
    run_dir.mkdir(exist_ok=True)
    script = run_dir / "train.py"
    script.write_text(TRAIN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(script), str(run_dir), *flags], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, stderr


def read_losses(run_dir: Path) -> dict[int, str]:
    """Per-step losses; a step logged twice (done, lost before its save, redone) must agree."""
    losses: dict[int, str] = {}
    for line in (run_dir / "losses.log").read_text().splitlines():
        step, loss = line.split()
        assert losses.setdefault(int(step), loss) == loss, f"step {step} redone with a different loss"
    return losses


def read_final(run_dir: Path) -> dict[str, dict]:
    return torch.load(run_dir / "final.pt", weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    returncode, stdout, stderr = finish(start_run(run_dir))
    assert returncode == 0, stderr
    assert "resumed" not in stdout
    return run_dir


KILLS = {
    # name: (flags of the killed run, step the resumed run must start from)
    "mid_epoch": (["--kill-after-step", "7"], 7),
    "after_last_batch_before_epoch_end_save": (["--kill-after-step", "10"], 10),
    "inside_a_save": (["--kill-inside-save-of-step", "13"], 12),
}


@pytest.mark.slow
@pytest.mark.parametrize("kill", list(KILLS))
def test_killed_run_resumes_to_identical_losses_and_weights(tmp_path: Path, uninterrupted: Path, kill: str) -> None:
    flags, resume_step = KILLS[kill]
    returncode, stdout, stderr = finish(start_run(tmp_path, *flags))
    assert returncode == -signal.SIGKILL, stderr
    if kill == "inside_a_save":
        assert list((tmp_path / "states").glob(".state-000000013.pt.*.tmp")), "the crash left its temp file"

    returncode, stdout, stderr = finish(start_run(tmp_path))

    assert returncode == 0, stderr
    assert stdout.splitlines()[0].split()[:2] == ["resumed", str(resume_step)]
    assert not list((tmp_path / "states").glob(".*.tmp"))
    assert_same_run(tmp_path, uninterrupted)


@pytest.mark.slow
def test_run_killed_from_outside_resumes_to_identical_losses_and_weights(tmp_path: Path, uninterrupted: Path) -> None:
    # The parent kills the trainer after it reports step 3, wherever the trainer is by then.
    process = start_run(tmp_path, "--step-delay-s", "0.05")
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "saved 3":
            process.send_signal(signal.SIGKILL)
            break
    returncode, _, stderr = finish(process)
    assert returncode == -signal.SIGKILL, stderr

    returncode, stdout, stderr = finish(start_run(tmp_path))

    assert returncode == 0, stderr
    assert 3 <= int(stdout.split()[1]) < TOTAL_STEPS
    assert_same_run(tmp_path, uninterrupted)


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    expected = read_losses(uninterrupted)
    assert sorted(expected) == list(range(1, TOTAL_STEPS + 1))
    assert read_losses(resumed) == expected
    final, reference = read_final(resumed), read_final(uninterrupted)
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    for index, buffers in reference["optimizer"]["state"].items():
        assert torch.equal(final["optimizer"]["state"][index]["momentum_buffer"], buffers["momentum_buffer"])
