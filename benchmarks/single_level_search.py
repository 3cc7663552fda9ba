"""The single-level planner's search on long traced chains: in groups of stages against stage by stage.

``planners/single_level.py`` searches a chain of more than ``MAX_GROUPS`` model stages in groups of
consecutive stages (NOTE [ Searching long chains in groups ]). Per model (``benchmarks/any_model.py``'s
cases, profiled here with measured stage times, one thread) and per budget (the middle of
:func:`edgetrain.runtime.three_budgets` and halfway from it to keep-all), this times one search each
way in the same process and reports simulations, seconds and the plan's simulated step time and peak;
the stage-wise search is stopped after ``--limit`` seconds (a row says so). Writes JSON (``--out``)
and prints a markdown table.

    python benchmarks/single_level_search.py [--models efficientnet_b0,mobilenet_v3_small] [--limit 900]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from edgetrain.core.chain import Chain
from edgetrain.core.simulator import simulate
from edgetrain.planners import single_level as planner
from edgetrain.profiling import profile
from edgetrain.runtime import three_budgets


class _OutOfTime(Exception):
    pass


def _search(chain: Chain, budget: int, max_groups: int, limit_s: float) -> dict[str, Any]:
    """One search, counted and timed; stopped (``finished: False``) once it runs past ``limit_s``."""
    real, grouping, calls = planner.simulate, planner.MAX_GROUPS, [0]
    start = time.perf_counter()

    def counted(*args: Any) -> Any:
        calls[0] += 1
        if time.perf_counter() - start > limit_s:
            raise _OutOfTime
        return real(*args)
    planner.simulate, planner.MAX_GROUPS = counted, max_groups
    try:
        kinds = planner.single_level_plan(chain, budget)
    except _OutOfTime:
        return {"finished": False, "seconds": time.perf_counter() - start, "simulations": calls[0]}
    finally:
        planner.simulate, planner.MAX_GROUPS = real, grouping
    stats = simulate(chain, planner.single_level(kinds))
    return {"finished": True, "seconds": time.perf_counter() - start, "simulations": calls[0],
            "plan": "".join(".SR"[k] for k in kinds), "step_time_s": stats.time_s, "peak_bytes": stats.peak_bytes}


def _model_chain(name: str) -> Chain:
    from any_model import block_model_cases, model_cases  # benchmarks/ is the script's own folder
    model, x, y = {**model_cases(), **block_model_cases()}[name]()[:3]
    return profile(model, x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="efficientnet_b0,mobilenet_v3_small")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds before a stage-wise search is stopped")
    parser.add_argument("--out", type=Path, default=Path("out/single_level_search.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        chain = _model_chain(name)
        _, middle, keep_all = three_budgets(chain)
        for label, budget in (("middle", middle), ("3/4", (middle + keep_all) // 2)):
            for way, groups in (("groups", planner.MAX_GROUPS), ("stages", chain.length)):
                row = {"model": name, "stages": chain.length, "budget": label, "budget_bytes": budget, "search": way,
                       **_search(chain, budget, groups, args.limit)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"limit_s": args.limit, "rows": rows}, indent=1))
    print("\n| model | stages | budget | search | seconds | simulations | plan's step time s | peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        seconds = f"{r['seconds']:.1f}" if r["finished"] else f"{r['seconds']:.1f} (stopped)"
        plan = f"{r['step_time_s']:.5f} | {r['peak_bytes'] / 1e6:.1f}" if r["finished"] else "- | -"
        print(f"| {r['model']} | {r['stages']} | {r['budget']} | {r['search']} | {seconds} | {r['simulations']} "
              f"| {plan} |")

if __name__ == "__main__":
    main()
