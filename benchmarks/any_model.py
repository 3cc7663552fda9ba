"""Full-size models no one shaped for edgetrain, traced into stages and trained under ``Checkpointed``.

For each model of :func:`edgetrain.models.cases.model_cases` (the full-size set at its published size, and the three
user models of :mod:`edgetrain.models.user_examples`) at a tiny batch: profile once (FLOP times), then at three
budgets (the least feasible, the middle, keep-all's peak) one step of ``Checkpointed(model, memory=budget,
chain=chain)`` against plain autograd from the same weights and RNG state: the worst relative gradient error
``max |g - g_ref| / max |g_ref|`` over the parameters, and the bytes of a second step (momentum buffers by then
exist) by the c10 allocator's records against the plan's predicted peak. One torch thread.

Each model runs twice: by ``Checkpointed.step_loss``, and as a user's training loop does,
``cross_entropy(wrapped(x), y).backward()`` (NOTE [ Checkpointed in a user loop ]).

Then recomputation inside coarse stages (NOTE [ Blocks planned inside ] in ``models/segmented.py``), on
:func:`~edgetrain.models.cases.block_model_cases` (inputs where activations, not weights, set the least budget): per
model the least feasible budget of the chain as traced and of the two-level plan (``planners/blocks.py``); the
predicted peak of each at equal recompute factors ρ; and the two-level plan trained for real at its least budget, at
each ρ's budget and at keep-all, with the same checks.

GPT-2 small's three budgets coincide at this batch: with SGD its step peaks when every gradient exists (weights,
momentum and gradients, 1.49 GB), above its activations up to about a thousand tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from edgetrain.models import stages_of
from edgetrain.models.cases import Case, block_model_cases, model_cases
from edgetrain.models.segmented import SegmentedStage, segmented_stages
from edgetrain.planners import plan
from edgetrain.planners.blocks import least_block_bytes, plan_blocks
from edgetrain.profiling import profile
from edgetrain.runtime import StepCheck, check_step, three_budgets
from edgetrain.runtime.verify import LOOPS

TITLE = "Checkpointed on full-size models no one shaped for edgetrain"

RHOS = (1.1, 1.25, 1.5)
THREADS = 1
# the quick run: two user models and one traced full-size model in both loops, one model's two-level plans
QUICK_MODELS = ("mobilenet_v3_small", "user_skip_cat", "user_sequential_cnn")
QUICK_BLOCK_MODELS = ("unet_w16",)


def _check(check: StepCheck) -> dict[str, Any]:
    return {"budget_bytes": check.budget_bytes, "predicted_peak_bytes": check.predicted_peak_bytes,
            "measured_peak_bytes": check.measured_peak_bytes, "recompute_factor": check.recompute_factor,
            "forward_advances": check.forward_advances, "worst_grad_error": check.worst_grad_error,
            "tracked_peak_bytes": check.tracked_peak_bytes,
            "predicted_tracked_peak_bytes": check.predicted_tracked_peak_bytes,
            "memtracker_peak_bytes": check.memtracker_peak_bytes}


def _three_budgets(name: str, build: Callable[[], Case]) -> dict[str, Any]:
    """One model's steps at its three budgets, in each loop."""
    torch.manual_seed(0)
    model, x, y = build()
    chain = profile(model, x, y, measure_time=False)
    budgets = three_budgets(chain)
    return {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
            "stages": len(stages_of(model)), "input_shape": list(x.shape), "rng_state_bytes": chain.rng_state_bytes,
            "frozen_parameters": sum(not p.requires_grad for p in model.parameters()),
            "steps": {loop: [_check(check_step(model, x, y, budget, chain, loop=loop)) for budget in budgets]
                      for loop in LOOPS}}


def _blocks(name: str, build: Callable[[], Case]) -> dict[str, Any] | None:
    """The chain as traced against the two-level plan: least budgets, peaks at equal ρ, real steps (step loop)."""
    torch.manual_seed(0)
    model, x, y = build()
    chain = profile(model, x, y, measure_time=False)
    stages = segmented_stages(stages_of(model), x)
    segmented = [isinstance(s, SegmentedStage) for s in stages] + [False]
    if not any(segmented):
        return None
    twins = profile(nn.Sequential(*stages), x, y, measure_time=False)
    least_whole, _, keep_all_peak = three_budgets(chain)
    least_two = least_block_bytes(chain, twins, segmented)
    rhos = [{"rho": rho, "as_traced_peak_bytes": plan(chain, recompute=rho).predicted_peak_bytes,
             "two_level_peak_bytes": plan_blocks(chain, twins, segmented, recompute=rho).plan.predicted_peak_bytes}
            for rho in RHOS]
    budgets = [("least two-level", least_two), ("least as traced", least_whole),
               *((f"ρ {r['rho']} two-level", r["two_level_peak_bytes"]) for r in rhos), ("keep-all", keep_all_peak)]
    steps = [{"label": label, **_check(check_step(model, x, y, budget, chain, twins=twins))}
             for label, budget in budgets]
    return {"model": name, "input_shape": list(x.shape), "stages": len(stages), "segmented": sum(segmented),
            "least_as_traced_bytes": least_whole, "least_two_level_bytes": least_two,
            "keep_all_bytes": keep_all_peak, "rhos": rhos, "steps": steps}


def run(quick: bool) -> dict[str, Any]:
    """Every model's three budgets in both loops, then the two-level plans of the activation-bound inputs."""
    torch.set_num_threads(THREADS)
    cases, block_cases = model_cases(), block_model_cases()
    names = QUICK_MODELS if quick else tuple(cases)
    block_names = QUICK_BLOCK_MODELS if quick else tuple(block_cases)
    blocks = [_blocks(name, block_cases[name]) for name in block_names]
    return {"threads": THREADS, "models": [_three_budgets(name, cases[name]) for name in names],
            "blocks": [b for b in blocks if b is not None],
            "not_segmented": [name for name, b in zip(block_names, blocks, strict=True) if b is None]}


def _steps(result: dict[str, Any], loop: str) -> list[dict[str, Any]]:
    return [step for model in result["models"] for step in model["steps"][loop]]


def _below(steps: list[dict[str, Any]]) -> str:
    """'a-b bytes below the prediction', or how many steps went above it."""
    gaps = [s["predicted_peak_bytes"] - s["measured_peak_bytes"] for s in steps]
    above = sum(gap < 0 for gap in gaps)
    if min(gaps) == max(gaps) == 0:
        text = "measured equal to the prediction"
    else:
        text = f"measured {min(gaps):,d}-{max(gaps):,d} bytes below the prediction"
    return text if not above else f"{text}; {above} above it"


def _memtracker(result: dict[str, Any]) -> str:
    """How PyTorch's MemTracker counts the user loop's steps against edgetrain's tracker."""
    counted = [(model, s) for model in result["models"] for s in model["steps"]["user"]
               if s.get("memtracker_peak_bytes") is not None]
    if not counted:
        return "PyTorch's MemTracker did not run"
    gaps = [s["tracked_peak_bytes"] - s["memtracker_peak_bytes"] for _, s in counted]
    text = f"PyTorch's MemTracker agrees to the byte on {gaps.count(0)} of {len(counted)} steps"
    under = [(gap, model) for gap, (model, _) in zip(gaps, counted, strict=True) if gap]
    if under:
        states = all(gap > 0 and gap % model["rng_state_bytes"] == 0 for gap, model in under)
        text += (f" and reads {min(g for g, _ in under):,d}-{max(g for g, _ in under):,d} bytes "
                 f"{'less' if all(g > 0 for g, _ in under) else 'apart'} on {len(under)}")
        if states:
            text += " (the generator states kept to recompute dropout, which it does not see)"
    return text


def _not_counted(result: dict[str, Any]) -> list[str]:
    """The models MemTracker did not run on, and why, as a paragraph (none: nothing)."""
    missed = [m for m in result["models"] if any(s.get("memtracker_peak_bytes") is None for s in m["steps"]["user"])]
    if not missed:
        return []
    why = [f"{m['model']} ({m['frozen_parameters']} frozen parameter{'s' * (m['frozen_parameters'] != 1)})"
           if m["frozen_parameters"] else m["model"] for m in missed]
    return [f"MemTracker did not run on {', '.join(why)}: it hooks the gradient of every parameter, and refuses a "
            "root module called twice in a step.", ""]


def _error(value: float) -> str:
    return "0.0" if value == 0 else f"{value:.1e}"


def headline(result: dict[str, Any]) -> str:
    """The one-line figure of the step loop: steps, models, worst gradient error, measured against predicted."""
    steps = _steps(result, "step")
    error = _error(max(s["worst_grad_error"] for s in steps))
    return (f"{len(steps)} steps of {len(result['models'])} models: error {error}, {_below(steps)}; "
            f"{_memtracker(result)}")


def render(result: dict[str, Any]) -> str:
    """The per-model table of both loops, then the two-level plans."""
    mb = 1e6
    rows = []
    for m in result["models"]:
        steps = m["steps"]["step"]
        gaps = {loop: ", ".join(f"{s['predicted_peak_bytes'] - s['measured_peak_bytes']:,d}" for s in m["steps"][loop])
                for loop in LOOPS}
        error = max(s["worst_grad_error"] for loop in LOOPS for s in m["steps"][loop])
        rhos = ", ".join(f"{s['recompute_factor']:.3f}" for s in steps)
        rows.append(f"| {m['model']} | {' x '.join(map(str, m['input_shape']))} | {m['parameters']:,d} | "
                    f"{m['stages']} | {steps[0]['budget_bytes'] / mb:.2f} / {steps[-1]['budget_bytes'] / mb:.2f} | "
                    f"{rhos} | {gaps['step']} | {gaps['user']} | {_error(error)} |")
    text = [f"Each model is profiled once (FLOP times, {result['threads']} torch thread) and trained one step under "
            "`Checkpointed(model, memory=budget)` at each of three budgets (the least feasible, the middle, keep-all's "
            "peak), from the same weights and RNG state as plain autograd: the worst relative gradient error "
            "`max |g - g_ref| / max |g_ref|` over the parameters, and a second step's peak (momentum buffers exist by "
            "then) by the c10 allocator's records (kernels' scratch included) against the plan's prediction. "
            "`step` runs `Checkpointed.step_loss`; `user` runs `cross_entropy(wrapped(x), y).backward()` as a "
            "user's loop does. In the user loop a third step runs under PyTorch's own `MemTracker` "
            "(`torch.distributed._tools.mem_tracker`), which counts tensor storages at the dispatcher as edgetrain's "
            "tracker does, with hooks of its own on every module; its peak is compared with edgetrain's tracker and "
            "with the plan's peak without kernels' scratch.", "",
            f"**By `step_loss`: {headline(result)}. In a user loop: {len(_steps(result, 'user'))} steps, "
            f"{_below(_steps(result, 'user'))}.**", "",
            *_not_counted(result),
            "| model | input | parameters | stages | least / keep-all budget MB | planned ρ | predicted - measured, "
            "bytes (step) | the same (user loop) | worst gradient error |", "|---|---|---|---|---|---|---|---|---|",
            *rows]
    if result["blocks"]:
        text += ["", "## Recomputation inside coarse stages", "",
                 "Two-level plans (`blocks=True`) recompute inside the stages tracing leaves coarse (a dense block, a "
                 "U-Net level). Per model: the least feasible budget of the chain as traced and of the two-level "
                 "plan, and the predicted peak of each at equal recompute factors ρ.", "",
                 "| model | input | segmented stages | least as traced MB | least two-level MB | "
                 + " | ".join(f"ρ {rho}: as traced → two-level MB" for rho in RHOS) + " |",
                 "|---|---|---|---|---|" + "---|" * len(RHOS)]
        for b in result["blocks"]:
            peaks = " | ".join(f"{r['as_traced_peak_bytes'] / mb:.1f} → {r['two_level_peak_bytes'] / mb:.1f}"
                               for r in b["rhos"])
            text.append(f"| {b['model']} | {' x '.join(map(str, b['input_shape']))} | {b['segmented']} of "
                        f"{b['stages']} | {b['least_as_traced_bytes'] / mb:.1f} | {b['least_two_level_bytes'] / mb:.1f}"
                        f" | {peaks} |")
        steps = [s for b in result["blocks"] for s in b["steps"]]
        text += ["", f"The two-level plans trained for real at their least budget, the traced chain's least, each ρ's "
                 f"peak and keep-all: {len(steps)} steps, {_below(steps)}, worst gradient error "
                 f"{_error(max(s['worst_grad_error'] for s in steps))}.", "",
                 "| model | budget | bytes | predicted - measured, bytes | planned ρ (inner recomputation too) |",
                 "|---|---|---|---|---|"]
        text += [f"| {b['model']} | {s['label']} | {s['budget_bytes']:,d} | "
                 f"{s['predicted_peak_bytes'] - s['measured_peak_bytes']:,d} | {s['recompute_factor']:.3f} |"
                 for b in result["blocks"] for s in b["steps"]]
    if result["not_segmented"]:
        text += ["", f"No stage of {', '.join(result['not_segmented'])} cuts into segments: tracing already cuts "
                 "them at every residual add."]
    return "\n".join(text)

