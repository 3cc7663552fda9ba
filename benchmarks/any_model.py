"""Full-size models no one shaped for edgetrain, traced into stages and trained under ``Checkpointed``.

For each model (the full-size set at its published size, and the three user models of
:mod:`edgetrain.models.user_examples`)
at a tiny batch: profile once (FLOP times), then at three budgets (the least feasible, the
middle, keep-all's peak) one step of ``Checkpointed(model, memory=budget, chain=chain)``
against plain autograd from the same weights and RNG state: the worst relative gradient error
``max |g - g_ref| / max |g_ref|`` over the parameters, and the live tensor bytes of a second
step (momentum buffers by then exist) against the plan's predicted peak. One torch thread.

    python benchmarks/any_model.py [--models unet,gpt2] [--out out/any_model.json]
    python benchmarks/any_model.py --loop user [--blocks] [--out out/any_model_user.json]
    python benchmarks/any_model.py --blocks [--models densenet121,unet] [--out out/any_model_blocks.json]

Writes one JSON row per model and budget and prints a table. ``--loop user`` runs each step as
a user's training loop does, ``cross_entropy(wrapped(x), y).backward()`` (NOTE [ Checkpointed in
a user loop ]), instead of ``Checkpointed.step_loss``; the column ``pred-meas`` is the predicted
peak minus the measured one, in bytes (negative: measured above the prediction).

With ``--blocks``, recomputation inside coarse stages (NOTE [ Blocks planned inside ] in
``models/segmented.py``): per model the least feasible budget of the chain as traced and of the
two-level plan (``planners/blocks.py``); the predicted peak of each at equal recompute factors
ρ; and the two-level plan trained for real at its least budget, at each ρ's budget and at
keep-all, with the same checks (gradients against autograd, measured against predicted peak).

GPT-2 small's three budgets coincide at this batch: with SGD its step peaks when every gradient
exists (weights, momentum and gradients, 1.49 GB), above its activations up to about a thousand
tokens; its test-size variant in ``tests/test_edge_models.py`` has three distinct budgets.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from edgetrain.models import (
    densenet121,
    efficientnet_b0,
    gpt_decoder,
    mobilenet_v3_small,
    stages_of,
    transformer_encoder,
    unet,
    yolov8,
)
from edgetrain.models.segmented import SegmentedStage, segmented_stages
from edgetrain.models.user_examples import SkipCat, encoder_in_sequential, sequential_cnn
from edgetrain.planners import plan
from edgetrain.planners.blocks import least_block_bytes, plan_blocks
from edgetrain.profiling import profile
from edgetrain.runtime import StepCheck, check_step, three_budgets
from edgetrain.runtime.verify import LOOPS

RHOS = (1.1, 1.25, 1.5)

Case = tuple[nn.Module, torch.Tensor, torch.Tensor]


def _images(batch: int, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))


def model_cases() -> dict[str, Callable[[], Case]]:
    def encoder() -> Case:
        model = encoder_in_sequential(width=64, layers=4, vocab=1000, tokens=32)
        return model, torch.randint(0, 1000, (8, 32)), torch.randint(0, 10, (8,))

    def gpt2() -> Case:
        tokens = torch.randint(0, 50257, (1, 32))
        return gpt_decoder(), tokens, torch.roll(tokens, -1, 1)

    return {
        "mobilenet_v3_small": lambda: (mobilenet_v3_small(), *_images(4, 64, 1000)),
        "efficientnet_b0": lambda: (efficientnet_b0(), *_images(4, 64, 1000)),
        "densenet121": lambda: (densenet121(), *_images(4, 64, 1000)),
        "unet": lambda: (unet(3, 2), torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))),
        "yolov8n": lambda: (yolov8(), torch.randn(2, 3, 128, 128), torch.randint(0, 144, (2, 336))),
        "gpt2": gpt2,
        "user_skip_cat": lambda: (SkipCat(channels=16), *_images(8, 32, 10)),
        "user_encoder_in_sequential": encoder,
        "user_sequential_cnn": lambda: (sequential_cnn(channels=16, image=32), *_images(8, 32, 10)),
    }


def block_model_cases() -> dict[str, Callable[[], Case]]:
    """Inputs where activations, not weights, set the least budget (recomputing inside a stage frees activations)."""
    def gpt_small() -> Case:
        tokens = torch.randint(0, 1000, (2, 256))
        return gpt_decoder(vocab=1000, context=256, layers=4, width=256, heads=4), tokens, torch.roll(tokens, -1, 1)

    def zoo_transformer() -> Case:   # the zoo's encoder: stages() gives each nn.TransformerEncoderLayer whole
        model = transformer_encoder(num_layers=4, d_model=256, nhead=4, dim_feedforward=1024, vocab_size=1000,
                                    max_len=256, num_classes=10)
        return model, torch.randint(0, 1000, (4, 256)), torch.randint(0, 10, (4,))

    return {
        "densenet121": lambda: (densenet121(), *_images(4, 128, 1000)),
        "zoo_transformer_4x256": zoo_transformer,
        "unet_w16": lambda: (unet(3, 2, width=16), torch.randn(2, 3, 128, 128), torch.randint(0, 2, (2, 128, 128))),
        "gpt_4x256": gpt_small,
        "user_encoder_in_sequential": model_cases()["user_encoder_in_sequential"],
        "yolov8n": lambda: (yolov8(), torch.randn(2, 3, 256, 256), torch.randint(0, 144, (2, 1344))),
    }


def _row(check: StepCheck) -> dict[str, object]:
    return {"budget_bytes": check.budget_bytes, "predicted_peak_bytes": check.predicted_peak_bytes,
            "measured_peak_bytes": check.measured_peak_bytes, "measured_over_predicted": check.measured_over_predicted,
            "recompute_factor": check.recompute_factor, "forward_advances": check.forward_advances,
            "worst_grad_error": check.worst_grad_error}


def run(name: str, build: Callable[[], Case], loop: str) -> list[dict[str, object]]:
    torch.manual_seed(0)
    model, x, y = build()
    start = time.perf_counter()
    chain = profile(model, x, y, measure_time=False)
    rows = []
    for budget in three_budgets(chain):
        check = check_step(model, x, y, budget, chain, loop=loop)
        row = {"model": name, "loop": loop, "parameters": sum(p.numel() for p in model.parameters()),
               "stages": len(stages_of(model)), "input_shape": list(x.shape), **_row(check)}
        rows.append(row)
        print(f"{name:28s} {row['parameters']:>11,d} {row['stages']:>4d} {budget:>12,d} "
              f"{check.predicted_peak_bytes:>12,d} {check.measured_peak_bytes:>12,d} "
              f"{check.predicted_peak_bytes - check.measured_peak_bytes:>9,d} "
              f"{check.measured_over_predicted:.5f} {check.recompute_factor:.3f} {check.worst_grad_error:.1e}",
              flush=True)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def run_blocks(name: str, build: Callable[[], Case], loop: str) -> list[dict[str, object]]:
    """Chain as traced against the two-level plan: least budgets, peaks at equal ρ, real steps."""
    torch.manual_seed(0)
    model, x, y = build()
    start = time.perf_counter()
    chain = profile(model, x, y, measure_time=False)
    stages = segmented_stages(stages_of(model), x)
    segmented = [isinstance(s, SegmentedStage) for s in stages] + [False]
    if not any(segmented):
        print(f"{name}: no stage cuts into segments")
        return []
    twins = profile(nn.Sequential(*stages), x, y, measure_time=False)
    least_whole, _, keep_all_peak = three_budgets(chain)
    least_two = least_block_bytes(chain, twins, segmented)
    print(f"{name}: {sum(segmented)} of {len(stages)} stages segmented "
          f"({', '.join(f'{i}:{len(s.pieces)}' for i, s in enumerate(stages) if isinstance(s, SegmentedStage))}); "
          f"least budget {least_whole:,d} -> {least_two:,d} bytes ({least_two / least_whole:.3f}), "
          f"keep-all {keep_all_peak:,d}", flush=True)
    rows: list[dict[str, object]] = []
    budgets = [("least two-level", least_two), ("least as traced", least_whole)]
    for rho in RHOS:
        whole_peak = plan(chain, recompute=rho).predicted_peak_bytes
        two_peak = plan_blocks(chain, twins, segmented, recompute=rho).plan.predicted_peak_bytes
        print(f"  rho {rho}: predicted peak as traced {whole_peak:,d}, two-level {two_peak:,d} "
              f"({two_peak / whole_peak:.3f})", flush=True)
        rows.append({"model": name, "mode": "blocks", "rho": rho, "as_traced_peak_bytes": whole_peak,
                     "two_level_peak_bytes": two_peak})
        budgets.append((f"rho {rho} two-level", two_peak))
    budgets.append(("keep-all", keep_all_peak))
    for label, budget in budgets:
        check = check_step(model, x, y, budget, chain, twins=twins, loop=loop)
        traced_rho = plan(chain, memory=budget).recompute_factor if budget >= least_whole else None
        rows.append({"model": name, "mode": "blocks", "loop": loop, "label": label,
                     "least_as_traced_bytes": least_whole, "least_two_level_bytes": least_two,
                     "as_traced_recompute_factor": traced_rho, **_row(check)})
        print(f"  {label:20s} {budget:>12,d} {check.predicted_peak_bytes:>12,d} {check.measured_peak_bytes:>12,d} "
              f"{check.measured_over_predicted:.5f} {check.recompute_factor:.3f} {check.worst_grad_error:.1e} "
              f"{'-' if traced_rho is None else f'{traced_rho:.3f}'}", flush=True)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help="comma-separated names (default: all of the mode's)")
    parser.add_argument("--blocks", action="store_true", help="recomputation inside coarse stages, against the chain")
    parser.add_argument("--loop", choices=LOOPS, default="step",
                        help="step: Checkpointed.step_loss; user: cross_entropy(wrapped(x), y).backward()")
    parser.add_argument("--out", default=None,
                        help="JSON rows (default out/any_model[_blocks][_user].json)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = model_cases()
    suffix = ("_blocks" if args.blocks else "") + ("_user" if args.loop == "user" else "")
    out = args.out or f"out/any_model{suffix}.json"
    if args.blocks:
        cases = block_model_cases()
    names = args.models.split(",") if args.models else list(cases)
    if args.blocks:
        print(f"  {'budget':20s} {'bytes':>12s} {'predicted':>12s} {'measured':>12s} meas/pred   rho  grad err "
              "rho as traced")
        rows = [row for name in names for row in run_blocks(name, cases[name], args.loop)]
    else:
        print(f"{'model':28s} {'parameters':>11s} {'stg':>4s} {'budget':>12s} {'predicted':>12s} {'measured':>12s} "
              f"{'pred-meas':>9s} meas/pred   rho  grad err")
        rows = [row for name in names for row in run(name, cases[name], args.loop)]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
