"""Wall time of a whole command over repeated runs, with its spread (every timing is given with its spread).

For timings the docs quote of a command as a whole ("answers in about a second", "a full run takes
N minutes"): runs the command ``--runs`` times in turn and prints the median, IQR and CoV of its
wall time (:func:`edgetrain.bench.stats.spread`) with the software setup, as JSON. The command's
own output is discarded; a run that fails stops the benchmark with its exit code. Beside the wall
time it reports the CPU time (user + system) the command's processes used, which a shared
machine's load stretches far less than the wall time.

Usage::

    python benchmarks/timed_repeats.py --runs 5 -- edgetrain memory --model resnet152 --batch 50 --image 1500
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetrain.bench.stats import software_setup, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="Runs of the command, one after another.")
    parser.add_argument("--unimportable", default="",
                        help="comma-separated top-level modules the command cannot import (needs the test extra)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.runs < 1:
        parser.error("give --runs >= 1 and a command after --")
    blocked = {name.strip() for name in args.unimportable.split(",") if name.strip()}
    with tempfile.TemporaryDirectory() as blocker_dir:
        env = _blocking_env(blocked, Path(blocker_dir)) if blocked else None
        wall_s, cpu_s = _time_runs(command, args.runs, env)
    print(json.dumps({"command": command, "unimportable": sorted(blocked), "wall_s": spread(wall_s).to_dict(),
                      "cpu_s": spread(cpu_s).to_dict(), "runs_wall_s": wall_s, "runs_cpu_s": cpu_s,
                      "setup": software_setup()}, indent=1))


def _blocking_env(blocked: set[str], folder: Path) -> dict[str, str]:
    """The environment of a command that cannot import ``blocked``: a ``sitecustomize`` in ``folder``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_install import BLOCKER  # the blocker the lean-install test trusts

    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def _time_runs(command: list[str], runs: int, env: dict[str, str] | None) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system of the children) seconds of each of ``runs`` runs; exits if one fails."""
    wall_s, cpu_s = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        wall_s.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            print(f"{' '.join(command)} failed with exit code {done.returncode}", file=sys.stderr)
            sys.exit(done.returncode)
    return wall_s, cpu_s


if __name__ == "__main__":
    main()
