"""Memory of a fine-tuning step under each update scheme, measured, against full fine-tuning with plain backprop.

For MobileNetV2 and ResNet-18 at one batch and image size, each scheme (NOTE [ Update schemes ] in
``edgetrain/models/update.py``) is profiled on real tensors, then a real step is run twice with the executor
(``edgetrain.runtime.check_step``): without recomputation, and at the least budget any schedule reaches. Each run's
gradients are compared with plain autograd's on the same frozen model, and its peak is measured by the c10
allocator's records (the second step, with the optimizer's state). The ratio is full fine-tuning's measured plain
peak over the scheme's measured peak.

Usage: ``python -m benchmarks run update_schemes [--quick]``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.models import get_model_spec
from edgetrain.models.update import apply_update
from edgetrain.planners.choose import least_step_bytes
from edgetrain.profiling import profile
from edgetrain.runtime import check_step
from edgetrain.units import format_bytes

log = logging.getLogger("update_schemes")

TITLE = "Fine-tuning less: memory of each update scheme"
SCHEMES = ("all", "bias", "last:1", "last:2", "last:4", "last:8")
QUICK_SCHEMES = ("all", "bias", "last:2")
CASES = (("mobilenet_v2", 8, 128), ("resnet18", 8, 128))
HEADLINE_CASE = CASES[0]   # the case the README quotes
QUICK_CASES = (("mobilenet_v2", 4, 64),)


def measure(model_name: str, batch: int, image: int, scheme: str) -> dict[str, Any]:
    """One scheme on one model: what trains, the predicted and measured peaks, plain and at the least budget."""
    spec = get_model_spec(model_name)
    torch.manual_seed(0)
    model = spec.build(10)
    model.train()
    trained = apply_update(model, scheme)
    x, y = spec.example_input(batch, image), spec.example_target(batch, num_classes=10)
    chain = profile(model, x, y, measure_time=False)
    plain_budget = simulate(chain, keep_all(chain.length)).peak_bytes
    runs = {}
    for label, budget in (("plain", plain_budget), ("least", least_step_bytes(chain))):
        check = check_step(model, x, y, budget, chain)
        runs[label] = {"budget_bytes": budget, "predicted_peak_bytes": check.predicted_peak_bytes,
                       "measured_peak_bytes": check.measured_peak_bytes, "recompute_factor": check.recompute_factor,
                       "worst_grad_error": check.worst_grad_error}
    trained_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"model": model_name, "batch": batch, "image": image, "scheme": scheme, "stages": chain.length,
            "trained_tensors": len(trained), "trained_bytes": trained_bytes, "weights_bytes": chain.weights_bytes,
            **runs}


def run(quick: bool) -> dict[str, Any]:
    """Every scheme on every case; one intra-op thread, where the allocator's records see every kernel's scratch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = []
        for model_name, batch, image in QUICK_CASES if quick else CASES:
            for scheme in QUICK_SCHEMES if quick else SCHEMES:
                log.info("%s b%d %dpx: %s", model_name, batch, image, scheme)
                rows.append(measure(model_name, batch, image, scheme))
    finally:
        torch.set_num_threads(threads)
    return {"rows": rows}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def render(result: dict[str, Any]) -> str:
    """One table per case: the scheme, what trains, the plain and least peaks, and the ratio to full plain."""
    parts = ["Each scheme freezes the parameters it does not train; the stages before the first trained one run once "
             "without recording (NOTE [ Update schemes ]). *Measured* is the c10 allocator's peak of a real step "
             "(the second, with the optimizer's state); *ratio* is full fine-tuning's measured plain peak over it. "
             "Every step's gradients equal plain autograd's on the same frozen model (worst error shown)."]
    cases = list(dict.fromkeys((r["model"], r["batch"], r["image"]) for r in result["rows"]))
    for model_name, batch, image in cases:
        rows = [r for r in result["rows"] if (r["model"], r["batch"], r["image"]) == (model_name, batch, image)]
        full = next(r for r in rows if r["scheme"] == "all")["plain"]["measured_peak_bytes"]
        lines = [f"## {model_name}, batch {batch}, {image} px\n",
                 "| scheme | stages | trained | plain: predicted / measured MiB | ratio | least: predicted / "
                 "measured MiB | ρ | ratio | worst gradient error |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            plain, least = r["plain"], r["least"]
            error = max(plain["worst_grad_error"], least["worst_grad_error"])
            lines.append(f"| {r['scheme']} | {r['stages']} | {format_bytes(r['trained_bytes'])} | "
                         f"{_mib(plain['predicted_peak_bytes'])} / {_mib(plain['measured_peak_bytes'])} | "
                         f"{full / plain['measured_peak_bytes']:.2f} | {_mib(least['predicted_peak_bytes'])} / "
                         f"{_mib(least['measured_peak_bytes'])} | {least['recompute_factor']:.3f} | "
                         f"{full / least['measured_peak_bytes']:.2f} | {error:.1e} |")
        parts.append("\n".join(lines))
    over = [f"{r['model']} {r['scheme']} {label}" for r in result["rows"] for label in ("plain", "least")
            if r[label]["measured_peak_bytes"] > r[label]["predicted_peak_bytes"]]
    parts.append("Measured above predicted: " + (", ".join(over) if over else "in no run."))
    return "\n\n".join(parts)


def headline(result: dict[str, Any]) -> str:
    """The README's figure: MobileNetV2's last 1-4 stages and bias-only against full fine-tuning's plain step."""
    by_scheme = {r["scheme"]: r for r in result["rows"] if (r["model"], r["batch"], r["image"]) == HEADLINE_CASE}
    full = by_scheme["all"]["plain"]["measured_peak_bytes"]
    last = [full / by_scheme[f"last:{k}"]["plain"]["measured_peak_bytes"] for k in (1, 2, 4)]
    bias = full / by_scheme["bias"]["least"]["measured_peak_bytes"]
    return (f"MobileNetV2 at batch {HEADLINE_CASE[1]}, {HEADLINE_CASE[2]} px: {min(last):.1f}-{max(last):.1f}x below "
            f"full fine-tuning's plain step with the last 1-4 stages trained; bias-only {bias:.2f}x with a plan")
