"""What profiling a model for a plan costs, against one plain training step of it, and what the profile cache saves.

For each model: the median of ``STEPS`` plain training steps (forward, cross-entropy, backward, SGD with momentum; the
first dropped), then the wall time of one ``profile()`` with stage times measured and no cache, then two profiles
into a fresh cache folder, the second of which reads the first. The bound is ``BOUND_STEPS`` plain steps plus
``BOUND_START_S`` of start-up. The models: the zoo's, transformers' from small configs (the `models` extra), and
torchvision's and timm's where they import (``make test-models`` builds an environment where they do). Torch on the
machine's threads, as training runs.
"""

from __future__ import annotations

import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgetrain.models import get_model_spec
from edgetrain.models.libraries import Logits
from edgetrain.profiling.profiler import profile

TITLE = "Profiling for a plan against one plain step, and the profile cache"
STEPS, QUICK_STEPS = 5, 2
BOUND_STEPS, BOUND_START_S, CACHED_S = 5.0, 2.0, 1.0

Case = tuple[str, Callable[[], nn.Module], tuple[int, ...]]


def _zoo(name: str) -> Callable[[], nn.Module]:
    return lambda: get_model_spec(name).build(10)


def _library(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except Exception:  # noqa: BLE001 - torchvision beside another torch fails in its own way
        return None


def cases(quick: bool) -> list[Case]:
    """(name, builder, image input shape) of each model this environment can build; the zoo's two, smaller, in a quick
    run."""
    found: list[Case] = [("resnet18", _zoo("resnet18"), (8, 3, 128, 128)),
                         ("mobilenet_v2", _zoo("mobilenet_v2"), (8, 3, 128, 128))]
    transformers = _library("transformers")
    if transformers is not None:
        layers = {"hidden_size": 192, "num_hidden_layers": 6, "num_attention_heads": 3, "intermediate_size": 768}
        found.append(("transformers ViT (6 x 192)", lambda: Logits(transformers.ViTForImageClassification(
            transformers.ViTConfig(image_size=64, patch_size=8, num_labels=10, **layers))), (8, 3, 64, 64)))
    torchvision = _library("torchvision")
    if torchvision is not None:
        found += [(f"torchvision {name}",
                   lambda name=name: torchvision.models.get_model(name, weights=None, num_classes=10),
                   (8, 3, 128, 128)) for name in ("resnet18", "efficientnet_b0")]
    timm = _library("timm")
    if timm is not None:
        found += [(f"timm {name}", lambda name=name: timm.create_model(name, pretrained=False, num_classes=10),
                   (8, 3, 128, 128)) for name in ("convnext_atto", "mobilevitv2_050")]
    if quick:   # the zoo's two at a quarter of the pixels and half the batch
        return [(name, build, (4, 3, 64, 64)) for name, build, _ in found[:2]]
    return found


def plain_step_s(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Median wall time of a plain training step (SGD with momentum), the first dropped."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...], steps: int) -> dict[str, Any]:
    """One model's plain step, uncached profile and cached second profile."""
    torch.manual_seed(0)
    model = build().train()
    x, y = torch.randn(shape), torch.arange(shape[0]) % 10
    step_s = plain_step_s(model, x, y, steps)
    profile_s = _timed(lambda: profile(model, x, y))
    with tempfile.TemporaryDirectory(prefix="bench-profile-cache-") as folder:
        first_s = _timed(lambda: profile(model, x, y, cache=Path(folder)))
        cached_s = _timed(lambda: profile(model, x, y, cache=Path(folder)))
    return {"model": name, "input": list(shape), "step_s": step_s, "profile_s": profile_s, "first_cached_s": first_s,
            "cached_s": cached_s, "within_bound": profile_s <= BOUND_STEPS * step_s + BOUND_START_S,
            "cached_within": cached_s <= CACHED_S}


def run(quick: bool) -> dict[str, Any]:
    """Every model this environment builds (two in a quick run)."""
    steps = QUICK_STEPS if quick else STEPS
    rows = [measure(name, build, shape, steps) for name, build, shape in cases(quick)]
    libraries = {name: getattr(_library(name), "__version__", None) for name in ("transformers", "torchvision", "timm")}
    return {"steps": steps, "threads": torch.get_num_threads(), "libraries": libraries, "rows": rows}


def render(result: dict[str, Any]) -> str:
    """Per model: the plain step, the profile, their ratio and the bound; the cached profile."""
    lines = [f"| {r['model']} | {'x'.join(map(str, r['input']))} | {r['step_s']:.3f} | {r['profile_s']:.2f} | "
             f"{r['profile_s'] / r['step_s']:.1f} | {BOUND_STEPS * r['step_s'] + BOUND_START_S:.2f} | "
             f"{'yes' if r['within_bound'] else 'no'} | {r['cached_s']:.3f} |" for r in result["rows"]]
    return (f"Each model: the median of {result['steps']} plain training steps (SGD with momentum, the first dropped), "
            "one profile with stage times measured and no cache, then two profiles into a fresh cache folder, the "
            f"second read from the first; torch on {result['threads']} threads. The bound is {BOUND_STEPS:g} plain "
            f"steps plus {BOUND_START_S:g} s; a cached profile should take at most {CACHED_S:g} s. Libraries here: "
            + ", ".join(f"{name} {version}" if version else f"{name} absent"
                        for name, version in result["libraries"].items()) + ".\n\n"
            "| model | input | plain step (s) | profile (s) | profile / step | bound (s) | within | cached (s) |\n"
            "|---|---|---:|---:|---:|---:|---|---:|\n" + "\n".join(lines) + f"\n\n**{headline(result)}.**")


def headline(result: dict[str, Any]) -> str:
    """How many models profile within the bound, and the slowest cached profile."""
    rows = result["rows"]
    within = sum(r["within_bound"] for r in rows)
    ratios = [r["profile_s"] / r["step_s"] for r in rows]
    return (f"profiling within {BOUND_STEPS:g} plain steps + {BOUND_START_S:g} s on {within} of {len(rows)} models "
            f"(profile / step {min(ratios):.1f}-{max(ratios):.1f}); a second profile from the cache in at most "
            f"{max(r['cached_s'] for r in rows):.2f} s")
