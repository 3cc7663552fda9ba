"""The single-level planner's search on long traced chains: in groups of stages against stage by stage.

``planners/single_level.py`` searches a chain of more than ``MAX_GROUPS`` model stages in groups of consecutive
stages (NOTE [ Searching long chains in groups ]). Per model (:mod:`edgetrain.models.cases`, profiled here with
measured stage times, one thread) and per budget (the middle of :func:`edgetrain.runtime.three_budgets` and halfway
from it to keep-all), this times one search each way in the same process
(:func:`edgetrain.planners.search_timing.timed_search`) and reports simulations, seconds and the plan's simulated
step time and peak; the stage-wise search is stopped after ``LIMIT_S`` seconds (a row says so).
"""

from __future__ import annotations

from typing import Any

import torch

from edgetrain.models.cases import case
from edgetrain.planners import single_level as planner
from edgetrain.planners.search_timing import timed_search
from edgetrain.profiling import profile
from edgetrain.runtime import three_budgets

TITLE = "The single-level search on long chains: in groups against stage by stage"

MODELS = ("efficientnet_b0", "mobilenet_v3_small")
LIMIT_S = 180.0   # stage by stage, EfficientNet-B0's 79 stages take hours: the limit says how far past it lies
QUICK_MODELS = ("mobilenet_v3_small",)
QUICK_LIMIT_S = 30.0
THREADS = 1


def run(quick: bool) -> dict[str, Any]:
    """Per model and budget, one search in groups and one stage by stage (stopped at the limit)."""
    limit = QUICK_LIMIT_S if quick else LIMIT_S
    torch.set_num_threads(THREADS)
    rows = []
    for name in QUICK_MODELS if quick else MODELS:
        torch.manual_seed(0)
        model, x, y = case(name)
        chain = profile(model, x, y)
        _, middle, keep_all = three_budgets(chain)
        budgets = (("middle", middle),) if quick else (("middle", middle), ("3/4", (middle + keep_all) // 2))
        for label, budget in budgets:
            for way, groups in (("groups", planner.MAX_GROUPS), ("stages", chain.length)):
                rows.append({"model": name, "stages": chain.length, "budget": label, "budget_bytes": budget,
                             "search": way, "max_groups": groups,
                             **timed_search(chain, budget, groups, limit).to_dict()})
    return {"limit_s": limit, "max_groups": planner.MAX_GROUPS, "threads": THREADS, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """One row per model, budget and way of searching; a stopped search says so."""
    lines = []
    for r in result["rows"]:
        seconds = f"{r['seconds']:.1f}" if r["finished"] else f"{r['seconds']:.1f} (stopped)"
        plan = f"{r['step_time_s']:.5f} | {r['peak_bytes'] / 1e6:.1f}" if r["finished"] else "- | -"
        lines.append(f"| {r['model']} | {r['stages']} | {r['budget']} ({r['budget_bytes'] / 1e6:.1f} MB) | "
                     f"{r['search']} | {seconds} | {r['simulations']:,d} | {plan} |")
    return (f"`single_level_plan` searches a chain of more than {result['max_groups']} model stages in "
            f"{result['max_groups']} groups of consecutive stages, each group beginning where a region may open; "
            "stage by stage, the same local search moves one stage at a time. Each model is profiled with measured "
            f"stage times at {result['threads']} torch thread; each search runs once, both ways in the same process, "
            "at the middle of the three budgets (least, middle, keep-all) and, in a full run, halfway from it to "
            f"keep-all. A stage-wise search still running after {result['limit_s']:.0f} s is stopped. The plan's "
            "step time and peak are the simulator's, on the stages themselves.\n\n"
            "| model | stages | budget | search | seconds | simulations | plan's step time s | peak MB |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines))
