"""Solve time of the optimal planner's table (target: 152 stages, 500 slots, under 1 s on 2 cores).

Prints one JSON object:

* ``first_call``: seconds of ``import edgetrain`` and of a fresh process's first ``solve``
  on a 3-stage chain, with an empty numba cache (``cold_cache``: the solve compiles the
  kernel) and then with the cache that run left (``warm_cache``: it loads it), each in a
  subprocess;
* ``cases``: per chain, the median wall and CPU seconds of ``solve`` over ``--repeats`` runs
  at budgets up to plain backprop's peak, the grid (units and unit size), the time of one
  rebuild, and the least budget as a fraction of that peak.

Usage: ``python -m benchmarks run optimal_speed [--quick]``.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

from edgetrain.core.chain import Chain, StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.planners.dp.optimal import solve

log = logging.getLogger("optimal_speed")

FIRST_CALL = """
import time
start = time.perf_counter()
from edgetrain.core.chain import Chain
from edgetrain.planners.dp.optimal import solve
imported = time.perf_counter()
solve(Chain.uniform(3), 10)
print(imported - start, time.perf_counter() - imported)
"""


def synthetic_chain(length: int, seed: int = 0) -> Chain:
    """Heterogeneous stages with ResNet-like spreads of size (1-64x) and time; some records keep no input."""
    rng = random.Random(seed)
    stages = [StageCost(f"s{i}", fwd_time_s=rng.uniform(0.5, 2.0), bwd_time_s=rng.uniform(1.0, 4.0),
                        out_bytes=rng.randint(1, 64) * 100_000, saved_bytes=rng.randint(64, 200) * 100_000,
                        grad_bytes=rng.randint(0, 50) * 10_000, bwd_workspace_bytes=rng.randint(-5, 20) * 10_000,
                        input_saved=rng.random() < 0.8)
              for i in range(length)]
    return Chain(tuple(stages), input_bytes=5_000_000, name=f"synthetic{length}")


def first_call_s(cache_dir: str) -> dict[str, float]:
    """Seconds of ``import edgetrain`` and of a first tiny solve in a fresh interpreter using ``cache_dir``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, check=True, capture_output=True, text=True)
    import_s, solve_s = (float(word) for word in out.stdout.split())
    return {"import_s": import_s, "first_solve_s": solve_s}


def time_case(chain: Chain, slots: int, repeats: int) -> dict[str, object]:
    top = simulate(chain, keep_all(chain.length)).peak_bytes
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        table = solve(chain, top, slots=slots)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    budget = (table.min_memory_bytes + top) // 2
    start = time.perf_counter()
    table.schedule(budget)
    rebuild_s = time.perf_counter() - start
    return {"chain": chain.name, "length": chain.length, "slots": slots, "units": len(table.top_values),
            "unit_bytes": table.unit_bytes, "solve_s": statistics.median(walls),
            "solve_cpu_s": statistics.median(cpus), "solve_all_s": walls, "rebuild_s": rebuild_s,
            "min_memory_fraction": table.min_memory_bytes / top}


TITLE = "The optimal planner's solve time"


def run(quick: bool) -> dict[str, object]:
    """Time the table's solve on 52- and 152-stage chains (and ResNet-152's, LinearResNet-152's), 500 slots."""
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory() as cache_dir:
        first = {"cold_cache": first_call_s(cache_dir), "warm_cache": first_call_s(cache_dir)}
    solve(Chain.uniform(3), 10)   # compile or load the kernel in this process before timing

    from edgetrain.profiling.estimate import chain_for
    from edgetrain.profiling.linear_resnet import linear_resnet

    chains = [synthetic_chain(52), synthetic_chain(152),
              replace(chain_for("resnet152", 8, 224), name="resnet152-b8-224"), linear_resnet(152, 8, 224)]
    cases = []
    for chain in chains:
        log.info("timing %s (%d stages)", chain.name, chain.length)
        cases.append(time_case(chain, 500, repeats))

    from numba import get_num_threads

    return {"numba_threads": get_num_threads(), "repeats": repeats, "first_call": first, "cases": cases}


def render(result: dict[str, Any]) -> str:
    """The cases as a table, then the first call's costs."""
    rows = [f"| {c['chain']} | {c['length']} | {c['units']} | {c['solve_s']:.3f} | {c['solve_cpu_s']:.3f} | "
            f"{c['rebuild_s']:.4f} | {c['min_memory_fraction']:.3f} |" for c in result["cases"]]
    cold, warm = result["first_call"]["cold_cache"], result["first_call"]["warm_cache"]
    return ("The optimal planner (Beaumont et al.'s dynamic programme for heterogeneous chains) solves its table "
            "once per chain and rebuilds a schedule for any budget from it. Each solve is timed at a budget of "
            f"keep-all's peak with 500 memory slots; the figures are medians of {result['repeats']} solves, with "
            f"numba at {result['numba_threads']} threads.\n\n"
            "| chain | stages | grid units | solve (s) | solve CPU (s) | rebuild (s) | least budget / keep-all |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"A fresh process pays {cold['import_s']:.2f} s to import edgetrain and {cold['first_solve_s']:.2f} s for "
            f"its first solve with an empty numba cache (the kernel compiles), {warm['first_solve_s']:.2f} s once the "
            "cache holds it.")
