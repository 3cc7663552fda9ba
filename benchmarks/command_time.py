"""How long the commands the guides quote take, as a whole: wall time and CPU time over repeated runs.

The guides give a few commands with how long they take ("answers without allocating, in seconds";
what numba's JIT buys a workstation's ``plan``). Each of those commands runs several times in a
fresh process, the commands interleaved round by round so that a machine's load falls on each
alike, and the result is the median, IQR and CoV of its wall time and of the CPU time (user +
system) its processes used (:func:`edgetrain.bench.stats.spread`); a shared machine's load
stretches the CPU time far less than the wall time. A command quoted "without numba" runs where
numba and llvmlite cannot be imported (:func:`edgetrain.sysutil.imports.blocking_environment`),
as on an install without the ``plan`` extra. The command's own output is discarded; a run that
fails stops the benchmark.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgetrain.bench.stats import Spread, spread
from edgetrain.errors import EdgetrainError
from edgetrain.sysutil.imports import blocking_environment

TITLE = "How long the commands the guides quote take"

MEMORY = ["memory", "--model", "resnet152", "--batch", "50", "--image", "1500"]
PLAN = ["plan", "--model", "resnet101", "--batch", "8", "--image", "224", "--memory", "900MiB"]
NO_JIT = ("numba", "llvmlite")
# name: (the command after `edgetrain`, the modules it cannot import, the guide that quotes it)
COMMANDS: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    "memory": (MEMORY, (), "fit"),
    "plan": (PLAN, (), "workstation"),
    "plan without numba": (PLAN, NO_JIT, "workstation"),
}


def time_run(args: list[str], env: dict[str, str] | None, cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system of the child) seconds of one run of ``python -m edgetrain ARGS``.

    Raises:
        EdgetrainError: the command failed.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgetrain", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, check=False)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise EdgetrainError(f"edgetrain {' '.join(args)} failed with exit code {done.returncode}: "
                             f"{done.stderr.strip()[-500:]}")
    return wall_s, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def run(quick: bool) -> dict[str, Any]:
    """Every command once a round, in turn; then ``edgetrain memory --json`` once for the figure it answers."""
    rounds = 1 if quick else 5
    times: dict[str, dict[str, list[float]]] = {name: {"wall_s": [], "cpu_s": []} for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="edgetrain-command-time-") as tmp:
        cwd = Path(tmp)
        envs = {}
        for name, (_, blocked, _) in COMMANDS.items():
            if blocked:
                (cwd / name.replace(" ", "_")).mkdir()
                envs[name] = blocking_environment(blocked, cwd / name.replace(" ", "_"))
        for _ in range(rounds):
            for name, (args, _, _) in COMMANDS.items():
                wall_s, cpu_s = time_run(args, envs.get(name), cwd)
                times[name]["wall_s"].append(wall_s)
                times[name]["cpu_s"].append(cpu_s)
        answer = subprocess.run([sys.executable, "-m", "edgetrain", *MEMORY, "--json"], capture_output=True,
                                text=True, check=True, cwd=cwd).stdout
    return {"rounds": rounds,
            "commands": [{"name": name, "command": " ".join(["edgetrain", *args]), "unimportable": list(blocked),
                          "guide": guide, "wall_s": spread(times[name]["wall_s"]).to_dict(),
                          "cpu_s": spread(times[name]["cpu_s"]).to_dict(), "runs_wall_s": times[name]["wall_s"],
                          "runs_cpu_s": times[name]["cpu_s"]}
                         for name, (args, blocked, guide) in COMMANDS.items()],
            "memory_answer": json.loads(answer)}


def _seconds(value: dict[str, Any]) -> str:
    s = Spread.from_dict(value)
    return f"{s.median:.2f} s" + ("" if s.n == 1 else f" (IQR {s.q1:.2f}-{s.q3:.2f} s, CoV {s.cov_text})")


def render(result: dict[str, Any]) -> str:
    """One row per command: CPU and wall time with their spread; then what ``edgetrain memory`` answered."""
    rows = [f"| `{c['command']}` | {', '.join(c['unimportable']) or '-'} | {_seconds(c['cpu_s'])} | "
            f"{_seconds(c['wall_s'])} | [{c['guide']}](../guide/{c['guide']}.md) |" for c in result["commands"]]
    by_name = {c["name"]: Spread.from_dict(c["cpu_s"]).median for c in result["commands"]}
    answer = result["memory_answer"]
    return (f"Each command in a fresh process, the commands in turn, {result['rounds']} "
            f"round{'s' if result['rounds'] != 1 else ''}: the CPU time (user + system) of its processes and its "
            "wall time, medians with their spread. A command run with modules it cannot import runs as on an "
            "install without them.\n\n"
            "| command | cannot import | CPU | wall | quoted in |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"`edgetrain memory` answers {answer['total_bytes'] / 2**30:.1f} GiB for one training step of "
            f"{answer['model']} at batch {answer['batch']}, {answer['size']} px, without allocating it. Without "
            f"numba, `plan` takes {by_name['plan without numba'] / by_name['plan']:.1f}x the CPU time it takes "
            "with numba's JIT.")
