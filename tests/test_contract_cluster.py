"""The unattended-node contract of ``cluster local`` and ``cluster federated``.

A service manager starts the command, kills it (kill -9, the OOM killer) and starts it again with
``--resume``. Every case runs the real command line in a subprocess and checks what a person would:
no process of the run outlives its parent, the restarted run ends as the uninterrupted one, a second
command on a live run directory is refused naming the holder, and bad input is one line, exit 2,
before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from edgetrain.distributed.netns import NetworkEmulation, can_emulate
from edgetrain.distributed.supervisor import SCRATCH_PREFIX
from edgetrain.train import StateStore, TrainConfig
from edgetrain.train.rundir import RunDirectory

# 40 token sequences of 8: 30 train, 7 global batches of 4 on 2 nodes (a node imports torch in seconds)
CLUSTER = ["--nodes", "2", "-m", "transformer_small", "--samples", "40", "--batch", "4", "--image", "8",
           "--heartbeat-timeout", "60"]
# 97 token sequences of 16 (39 + 38 train, 10 + 10 held out), rounds of 2 steps of 8
FEDERATED = ["--nodes", "2", "-m", "transformer_small", "--samples", "97", "--image", "16", "--batch", "8",
             "--local-steps", "2"]
ORPHAN_DEADLINE_S = 10.0
WORKER = "-m edgetrain.distributed.worker "  # a node's or a spare's command line
SERVER_OR_NODE = "-m edgetrain.distributed.federated_process "
needs_flower = pytest.mark.skipif(importlib.util.find_spec("flwr") is None,
                                  reason="Flower is not installed (pip install 'edgetrain[federated]')")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgetrain", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])


def listing(directory: Path) -> dict[str, tuple[str, int] | str] | None:
    """Every entry under ``directory``: a file's SHA-256 and modification time (ns), "dir" for a folder; None when
    ``directory`` does not exist."""
    if not directory.exists():
        return None
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            if p.is_file() else "dir" for p in sorted(directory.rglob("*"))}


# ------------------------------------------------------------------------------------------------ processes


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), which tells it from a later process given the same pid."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(child) for child in (task / "children").read_text().split())
    return found


def _ancestors() -> set[int]:
    """This process and those above it, whose command lines may name the test's folders too."""
    found, pid = set(), os.getpid()
    while pid > 1 and (fields := _stat(pid)) is not None:
        found.add(pid)
        pid = int(fields[1])
    return found


def _cmdline_holds(pid: int, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


class RunProcesses:
    """The processes of one run: its parent, every descendant seen while it runs, and any process whose command line
    names ``marker`` (the run's folders), each by pid and start time."""

    def __init__(self, parent: subprocess.Popen[bytes], marker: str) -> None:
        self.parent, self.marker = parent, marker
        self.seen: dict[int, str] = {}
        self.ours = _ancestors()
        self.look()

    def look(self) -> None:
        """Add the processes running now."""
        todo = [self.parent.pid]
        while todo:
            pid = todo.pop()
            started = _started(pid)
            if started is not None:
                self.seen.setdefault(pid, started)
                todo += _children(pid)
        for entry in Path("/proc").glob("[0-9]*"):
            pid = int(entry.name)
            if pid not in self.ours and pid not in self.seen and _cmdline_holds(pid, self.marker):
                started = _started(pid)
                if started is not None:
                    self.seen[pid] = started

    def named(self, word: str) -> int:
        """How many of those running have ``word`` in their command line."""
        return sum(word in command for command in self.running().values())

    def running(self) -> dict[int, str]:
        """Those seen that still run (a zombie does not), with their command lines."""
        alive = {}
        for pid, started in self.seen.items():
            fields = _stat(pid)
            if fields is not None and fields[0] != "Z" and fields[19] == started:
                with contextlib.suppress(OSError):
                    alive[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return alive

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Look at the processes until ``condition`` holds; fails if the parent ends first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.parent.poll() is None, f"the run ended (exit {self.parent.returncode}) before {what}"
            assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
            self.look()
            time.sleep(0.1)
        self.look()

    def stop(self) -> None:
        """SIGSTOP to the parent (so it starts no more), then to every process of the run."""
        os.kill(self.parent.pid, signal.SIGSTOP)
        self.look()
        for pid in self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def kill_parent(self) -> float:
        """kill -9 of the parent; the seconds until no process of the run runs (at most ORPHAN_DEADLINE_S).

        Processes :meth:`stop` stopped are continued after the kill: one forked just before the stop has not yet
        run the start of its own code, where a child asks to die with its parent or exits if the parent is gone
        (NOTE [ Children die with their parent ]). A stopped child that had asked dies stopped."""
        self.look()
        os.kill(self.parent.pid, signal.SIGKILL)
        self.parent.wait()
        killed = time.monotonic()
        for pid in self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        while self.running() and time.monotonic() - killed < ORPHAN_DEADLINE_S:
            time.sleep(0.05)
        return time.monotonic() - killed

    def end(self) -> None:
        """Kill whatever of the run still runs (a failed test leaves nothing behind)."""
        if self.parent.poll() is None:
            self.parent.kill()
            self.parent.wait()
        self.look()
        for pid in self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=env)


def claimed_by(run_dir: Path, pid: int) -> Callable[[], bool]:
    """Whether ``pid`` holds the run directory's lock (its pid is written in it)."""
    def check() -> bool:
        with contextlib.suppress(OSError):
            return (run_dir / ".lock").read_text().strip() == str(pid)
        return False
    return check


def records(run_dir: Path) -> list[dict[str, object]]:
    with contextlib.suppress(FileNotFoundError):
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return []


def scratch_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose temporary folder (where the supervisor keeps its scratch) is the test's own."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return {**os.environ, "TMPDIR": str(scratch)}, scratch


def scratch_folders(tmp: Path) -> list[str]:
    """The supervisors' scratch folders in ``tmp`` (torch keeps caches of its own there too)."""
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(SCRATCH_PREFIX))


def final_state(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    state = StateStore(run_dir / "state").load_latest()
    assert state is not None
    return state.step, state.model


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, want[name]), name


# ------------------------------------------------------------------------------------------------ bad input


def _cluster_run(run_dir: Path) -> None:
    """What a run of CLUSTER that was started leaves before its first step: its record and its lock file."""
    with RunDirectory(run_dir) as run:
        run.claim()
        run.record(TrainConfig(model="transformer_small", samples=40, batch=4, image=8).identity())


def _federated_run(run_dir: Path) -> None:
    """What a run of FEDERATED that was started leaves before its first round: its settings and its lock file."""
    from edgetrain.distributed.federated import FederatedConfig
    from edgetrain.distributed.federated_server import open_run

    with RunDirectory(run_dir) as run:
        run.claim()
        open_run(FederatedConfig(run_dir=str(run_dir), nodes=2, local_steps=2, batch=8, model="transformer_small",
                                 samples=97, image=16))


# The budget's minimum reads "... + cushion = 332.07 MiB (348202401 bytes)".
MINIMUM = "+ cushion = "
BAD_CLUSTER_INPUT = {
    "rate below 0": (["--rate", "-5e9"], ["--rate", "'-5e9'"]),
    "rate nan": (["--rate", "nan"], ["--rate", "'nan'"]),
    "rate not a number": (["--rate", "fast"], ["--rate", "'fast'"]),
    "kill of a node that does not exist": (["--kill", "9@2"], ["--kill 9@2", "no node 9", "are 0 to 1"]),
    "cut without the emulated network": (["--cut", "1@2"], ["'cut' fault needs the network emulation"]),
    "unknown link preset": (["--netns", "--preset", "lte"], ["--preset", "'lte'"]),
    "batch smaller than the nodes": (["--batch", "1"], ["cannot give each of 2 nodes"]),
    "budget below the least step": (["--memory", "50MiB"], [
        "node 0 cannot hold its share of 2 of 4 samples per step: budget 50.00 MiB", "least step", MINIMUM,
        "node 1 cannot hold"]),
}


# Every case without a run directory (the strictest: not even the directory may be made); the budget also in the
# directory a killed run left, restarted with --resume (the other cases are refused before the directory is looked
# at, which their no-directory case shows).
CLUSTER_CASES = [(name, False) for name in BAD_CLUSTER_INPUT] + [
    pytest.param("budget below the least step", True, marks=pytest.mark.slow)]  # a killed run made first: 28 s


@pytest.mark.parametrize(("name", "held"), CLUSTER_CASES,
                         ids=[f"{name}-no-directory" for name in BAD_CLUSTER_INPUT] +
                         ["budget below the least step-resumed-run"])
def test_bad_cluster_local_input_is_one_line_before_anything_is_written(tmp_path: Path, name: str,
                                                                       held: bool) -> None:
    # Prepare: no run directory, or one a killed run left (restarted with --resume)
    run_dir = tmp_path / "run"
    if held:
        _cluster_run(run_dir)
    before = listing(run_dir)
    flags, phrases = BAD_CLUSTER_INPUT[name]
    env, scratch = scratch_env(tmp_path)

    # Execute
    result = run_cli("cluster", "local", *CLUSTER, *flags, "--run-dir", str(run_dir), *(["--resume"] * held), env=env)

    # Assert: one line naming what was wrong; the directory as it was (still absent), no scratch folder made
    assert_one_line_error(result, *phrases)
    assert listing(run_dir) == before
    assert scratch_folders(scratch) == []


RUN_DIRECTORY_MISMATCHES = {
    "fresh run into a run": ([], ["already holds a run", "--overwrite"]),
    "resume with other settings": (["--resume", "--batch", "8"], ["--resume", "batch: 4 -> 8"]),
}


@pytest.mark.parametrize("name", list(RUN_DIRECTORY_MISMATCHES))
def test_cluster_local_refuses_a_run_directory_of_another_run_before_writing(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    _cluster_run(run_dir)
    before = listing(run_dir)
    flags, phrases = RUN_DIRECTORY_MISMATCHES[name]

    result = run_cli("cluster", "local", *CLUSTER, *flags, "--run-dir", str(run_dir))

    assert_one_line_error(result, *phrases)
    assert listing(run_dir) == before


def test_a_data_folder_cluster_local_cannot_train_on_leaves_no_run_directory(tmp_path: Path) -> None:
    # Prepare: a folder of images of one class (found only once the data is opened, with the directory locked)
    from PIL import Image

    (tmp_path / "data" / "only").mkdir(parents=True)
    for k in range(3):
        Image.new("RGB", (8, 8), (k, 0, 0)).save(tmp_path / "data" / "only" / f"{k}.png")
    run_dir = tmp_path / "run"

    # Execute
    result = run_cli("cluster", "local", "-m", "resnet18_cifar", "--batch", "2", "--data", str(tmp_path / "data"),
                     "--run-dir", str(run_dir))

    # Assert: the refusal, and the directory made for the lock removed again
    assert_one_line_error(result, "1 class with samples ('only')")
    assert not run_dir.exists()


@needs_flower
@pytest.mark.slow
def test_a_federated_budget_below_the_least_step_is_one_line_before_anything_is_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"

    result = run_cli("cluster", "federated", *FEDERATED, "--memory", "50MiB", "--run-dir", str(run_dir))

    assert_one_line_error(result, "node 0: budget 50.00 MiB", "least step", MINIMUM, "set aside for gRPC")
    assert not run_dir.exists()


@needs_flower
def test_cluster_federated_refuses_a_fresh_run_into_a_run_before_writing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _federated_run(run_dir)
    before = listing(run_dir)

    result = run_cli("cluster", "federated", *FEDERATED, "--run-dir", str(run_dir))

    assert_one_line_error(result, "holds a federated run", "--resume", "--overwrite")
    assert listing(run_dir) == before


# ------------------------------------------------------------------------------------------------ one writer


def _second_writer_is_refused(command: list[str], run_dir: Path, env: dict[str, str] | None = None) -> None:
    """While ``command`` runs into ``run_dir``, the same command with ``--resume`` is refused naming its pid; then
    kill -9 of the first leaves none of its processes, stopped ones included.

    The first run is stopped (SIGSTOP) once it holds the lock: beside its processes importing torch on two cores,
    the second command took twice as long to start."""
    first = start(*command, "--run-dir", str(run_dir), env=env)
    processes = RunProcesses(first, str(run_dir.parent))
    try:
        processes.wait_until(claimed_by(run_dir, first.pid), 120, "lock claimed")
        processes.stop()
        second = run_cli(*command, "--run-dir", str(run_dir), "--resume", env=env)
        assert_one_line_error(second, f"run directory {run_dir} is in use", f"(pid {first.pid})")
        processes.kill_parent()
        assert processes.running() == {}
    finally:
        processes.end()


def test_a_second_cluster_local_on_a_live_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    env, _ = scratch_env(tmp_path)
    _second_writer_is_refused(["cluster", "local", *CLUSTER, "--epochs", "50"], tmp_path / "run", env)


@needs_flower
def test_a_second_cluster_federated_on_a_live_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    _second_writer_is_refused(["cluster", "federated", *FEDERATED, "--rounds", "1000"], tmp_path / "run")


# ------------------------------------------------------------------------------------------------ kill -9


@pytest.mark.slow
def test_cluster_local_overwrite_replaces_the_run_that_was_there(tmp_path: Path) -> None:
    # Prepare: a finished `train` run of 3 epochs there
    run_dir = tmp_path / "run"
    old = run_cli("train", "-m", "transformer_small", "--samples", "40", "--batch", "4", "--image", "8", "--epochs",
                  "3", "--run-dir", str(run_dir))
    assert old.returncode == 0, old.stderr[-3000:]
    env, _ = scratch_env(tmp_path)

    # Execute: the cluster's run over it, seen at its first step
    parent = start("cluster", "local", *CLUSTER, "--seed", "1", "--overwrite", "--run-dir", str(run_dir), env=env)
    processes = RunProcesses(parent, str(tmp_path))
    try:
        processes.wait_until(lambda: any(r.get("world_size") == 2 for r in records(run_dir)), 180, "a step")
        old_summary_left = (run_dir / "summary.json").exists()
        assert parent.wait(timeout=300) == 0
    finally:
        processes.end()

    # Assert: the old run was gone once the new one trained (killed before its first save, the new run resumed
    # would have read the old summary and been taken for finished); in the end only the cluster's run is there
    assert not old_summary_left
    assert [r["step"] for r in records(run_dir) if "loss" in r] == list(range(1, 8))
    assert json.loads((run_dir / "run.json").read_text())["identity"]["seed"] == 1
    assert final_state(run_dir)[0] == 7


@pytest.mark.slow
def test_a_killed_cluster_local_leaves_no_process_and_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    # Prepare: the uninterrupted run of 15 steps (80 samples: 60 train), state saved every step
    command = ["cluster", "local", *CLUSTER, "--samples", "80"]
    env, scratch = scratch_env(tmp_path)
    whole = run_cli(*command, "--run-dir", str(tmp_path / "whole"), env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    broken = tmp_path / "broken"
    parent = start(*command, "--run-dir", str(broken), env=env)
    processes = RunProcesses(parent, str(tmp_path))
    try:
        # Execute: kill -9 of the supervisor mid-run, once its nodes trained 3 steps and their spares started
        processes.wait_until(lambda: len(records(broken)) >= 3 and processes.named(WORKER) == 4, 180,
                             "3 steps and the spares")
        gone_s = processes.kill_parent()
        left = processes.running()
        stale = scratch_folders(scratch)
        resumed = run_cli(*command, "--run-dir", str(broken), "--resume", env=env)
        finished = listing(broken)
        again = run_cli(*command, "--run-dir", str(broken), "--resume", env=env)  # as an unattended node reruns it
    finally:
        processes.end()

    # Assert: the nodes and spares died with it; its scratch folder was removed by the next start; the resumed
    # run logged every step once, the uninterrupted run's losses to the bit, and ended with its weights
    assert left == {}, f"{len(left)} processes of the run still ran {gone_s:.1f} s after the kill: {left}"
    assert [name.startswith(f"{SCRATCH_PREFIX}{parent.pid}-") for name in stale] == [True]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert scratch_folders(scratch) == []
    losses = [(r["step"], r["loss"]) for r in records(broken) if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in records(tmp_path / "whole") if "loss" in r]
    assert [step for step, _ in losses] == list(range(1, 16))
    (step, weights), (whole_step, whole_weights) = final_state(broken), final_state(tmp_path / "whole")
    assert step == whole_step == 15
    assert_same_weights(weights, whole_weights)
    # and once it is finished, the same command finishes at once: no node started, no file changed
    assert again.returncode == 0, again.stderr[-3000:]
    assert listing(broken) == finished
    assert json.loads(again.stdout[:again.stdout.rindex("}") + 1]) == json.loads((broken / "cluster.json").read_text())


@needs_flower
@pytest.mark.slow
def test_a_killed_cluster_federated_leaves_no_process_and_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    # Prepare: the uninterrupted run of 8 rounds
    command = ["cluster", "federated", *FEDERATED, "--rounds", "8"]
    whole = run_cli(*command, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    broken = tmp_path / "broken"
    parent = start(*command, "--run-dir", str(broken))
    processes = RunProcesses(parent, str(broken))
    try:
        # Execute: kill -9 of the launcher once 2 rounds are recorded
        processes.wait_until(lambda: len(records(broken)) >= 2 and processes.named(SERVER_OR_NODE) == 3, 300,
                             "2 rounds")
        gone_s = processes.kill_parent()
        left = processes.running()
        done_before = len(records(broken))
        resumed = run_cli(*command, "--run-dir", str(broken), "--resume")
        finished = listing(broken)
        again = run_cli(*command, "--run-dir", str(broken), "--resume")  # as an unattended node reruns it
    finally:
        processes.end()

    # Assert: the server and both nodes died with it; the resumed run went on from the last saved round, every
    # round once, to the uninterrupted run's held-out and training losses and its final weights
    assert left == {}, f"{len(left)} processes of the run still ran {gone_s:.1f} s after the kill: {left}"
    assert done_before < 8, "the run ended before it was killed"
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    keys = ("round", "loss", "accuracy", "train_loss")
    rounds = [[r[k] for k in keys] for r in records(broken)]
    assert rounds == [[r[k] for k in keys] for r in records(tmp_path / "whole")]
    assert json.loads((broken / "summary.json").read_text())["resumed_from_round"] >= 2
    (step, weights), (whole_step, whole_weights) = final_state(broken), final_state(tmp_path / "whole")
    assert step == whole_step == 8
    assert_same_weights(weights, whole_weights)
    # and once it is finished, the same command finishes at once: no process started, no file changed
    assert again.returncode == 0, again.stderr[-3000:]
    assert listing(broken) == finished


def _network_of(supervisor_pid: int) -> list[str]:
    """What ``--netns`` made for the supervisor ``supervisor_pid`` that still exists (names as ``NetworkEmulation``
    gives them)."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ([name for name in namespaces if name.startswith(f"et{supervisor_pid}n")] +
            ([f"etb{supervisor_pid}"] if f" etb{supervisor_pid}:" in links else []) +
            [str(path) for path in sorted(Path("/sys/fs/cgroup").glob(f"*/edgetrain-cluster-et{supervisor_pid}n*"))])


def _netns_dir_mounted() -> bool:
    return any(line.split()[4] == "/run/netns" for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.mark.slow
@pytest.mark.skipif(can_emulate() is not None, reason=f"network emulation unavailable: {can_emulate()}")
def test_the_nodes_of_a_killed_emulated_cluster_die_with_it(tmp_path: Path) -> None:
    # Prepare: 2 nodes, each in its network namespace and cgroups (through `sh` and `ip netns exec`)
    mounted_before = _netns_dir_mounted()
    env, _ = scratch_env(tmp_path)
    parent = start("cluster", "local", *CLUSTER, "--samples", "400", "--netns", "--run-dir", str(tmp_path / "run"),
                   env=env)
    processes = RunProcesses(parent, str(tmp_path))
    try:
        processes.wait_until(lambda: len(records(tmp_path / "run")) >= 3 and processes.named(WORKER) == 4, 180,
                             "3 steps and the spares")
        in_namespaces = [pid for pid in processes.running() if pid != parent.pid and
                         Path(f"/proc/{pid}/ns/net").readlink() != Path("/proc/self/ns/net").readlink()]
        # Execute
        gone_s = processes.kill_parent()
        left = processes.running()
        network = _network_of(parent.pid)
    finally:
        processes.end()
        # the next emulation to start removes what a supervisor that is gone left
        with NetworkEmulation(1, "gigabit"):
            after_next_start = _network_of(parent.pid)
        if not mounted_before and _netns_dir_mounted() and not subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
            subprocess.run(["umount", "/run/netns"], capture_output=True)

    # Assert: the nodes and spares ran in the namespaces and died with the supervisor; the network it made stayed
    # (a killed supervisor cannot remove it: two namespaces, the bridge and four cgroups) until the next start
    assert len(in_namespaces) == 4
    assert left == {}, f"{len(left)} processes of the run still ran {gone_s:.1f} s after the kill: {left}"
    assert len(network) == 2 + 1 + 4, network
    assert after_next_start == []
