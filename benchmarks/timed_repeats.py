"""Wall time of a whole command over repeated runs, with its spread (issue #16: every timing with its spread).

For timings the docs quote of a command as a whole ("answers in about a second", "a full run takes
N minutes"): runs the command ``--runs`` times in turn and prints the median, IQR and CoV of its
wall time (:func:`edgetrain.benchstats.spread`) with the software setup, as JSON. The command's
own output is discarded; a run that fails stops the benchmark with its exit code. Beside the wall
time it reports the CPU time (user + system) the command's processes used, which a shared
machine's load stretches far less than the wall time.

Usage::

    python benchmarks/timed_repeats.py --runs 5 -- edgetrain memory --model resnet152 --batch 50 --image 1500
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from edgetrain.benchstats import software_setup, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="Runs of the command, one after another.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.runs < 1:
        parser.error("give --runs >= 1 and a command after --")
    wall_s, cpu_s = [], []
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        wall_s.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            print(f"{' '.join(command)} failed with exit code {done.returncode}", file=sys.stderr)
            sys.exit(done.returncode)
    print(json.dumps({"command": command, "wall_s": spread(wall_s).to_dict(), "cpu_s": spread(cpu_s).to_dict(),
                      "runs_wall_s": wall_s, "runs_cpu_s": cpu_s, "setup": software_setup()}, indent=1))


if __name__ == "__main__":
    main()
