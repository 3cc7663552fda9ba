"""Published models of torchvision and timm, as their libraries build them (no weights, no edits, no wrapper), trained
two steps under ``Checkpointed`` at ρ = 1.5 and at the middle budget: gradients equal to plain autograd's, the
measured peak not above the plan by the allocator's records and by the tracker, and PyTorch's ``MemTracker`` within 1%
of the tracker. The families: convolutional, mobile (depthwise, squeeze-excite, hard-swish), vision transformers,
hierarchical and hybrid convolution-attention. These libraries import only beside the torch they were built for, so
the tests skip where they do not import (``make test-models`` builds an environment where they do)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import pytest
import torch
from torch import nn

from edgetrain import Checkpointed
from edgetrain.planners import plan
from edgetrain.runtime import StepCheck, check_step, three_budgets


def _library(name: str) -> object:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - torchvision beside another torch fails in its own way
        pytest.skip(f"{name} does not import here: {type(exc).__name__}")


def _torchvision(name: str, **args: object) -> Callable[[], nn.Module]:
    return lambda: _library("torchvision").models.get_model(name, weights=None, num_classes=10, **args)  # type: ignore[attr-defined]


def _timm(name: str, **args: object) -> Callable[[], nn.Module]:
    return lambda: _library("timm").create_model(name, pretrained=False, num_classes=10, **args)  # type: ignore[attr-defined]


# (builder, image side): images large enough that activations, not weights, set the least budget where it is cheap
MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "torchvision:resnet18": (_torchvision("resnet18"), 64),
    "torchvision:mobilenet_v3_small": (_torchvision("mobilenet_v3_small"), 64),
    "torchvision:efficientnet_b0": (_torchvision("efficientnet_b0"), 64),
    "torchvision:regnet_y_400mf": (_torchvision("regnet_y_400mf"), 64),
    "torchvision:shufflenet_v2_x0_5": (_torchvision("shufflenet_v2_x0_5"), 64),
    "torchvision:swin_t": (_torchvision("swin_t"), 64),
    "timm:convnext_atto": (_timm("convnext_atto"), 64),
    "timm:mobilevitv2_050": (_timm("mobilevitv2_050"), 64),
    "timm:vit_tiny_patch16_224": (_timm("vit_tiny_patch16_224", img_size=64), 64),
    "timm:resnet18d": (_timm("resnet18d"), 64),
    "timm:efficientnet_b0": (_timm("efficientnet_b0"), 64),
}
BATCH = 2


@functools.cache
def _checked(name: str) -> tuple[StepCheck, StepCheck]:
    """``name`` two steps at ρ = 1.5's budget and at the middle budget, each in a user's loop."""
    build, side = MODELS[name]
    torch.manual_seed(0)
    model = build().train()
    x = torch.randn(BATCH, 3, side, side)
    y = torch.arange(BATCH) % 10
    chain = Checkpointed(model, sample=x, target=y, recompute=1.5, measure_time=False, profile_cache=False).chain
    at_rho = plan(chain, recompute=1.5).predicted_peak_bytes
    middle = three_budgets(chain)[1]
    return tuple(check_step(model, x, y, budget, chain, loop="user") for budget in (at_rho, middle))  # type: ignore[return-value]


# Known gaps, seen in every library's models of the kind: a ViT's class token (the tracker reads batch x width floats
# over the plan: 1,536 bytes here, as transformers' ViT reads 512 at its width of 64; the input gradient of the stage
# that concatenates the token is a view into the gradient of the whole concatenation: OVER_PLAN in
# test_hf_models.py), and stochastic depth (8 bytes: one float per sample; not yet explained). strict: a fix shows
# here as an unexpected pass.
OVER_PLAN = {"timm:vit_tiny_patch16_224": "the class token: 1,536 bytes over the plan",
             "torchvision:swin_t": "stochastic depth: 8 bytes over the plan"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=OVER_PLAN[name]))
                                  if name in OVER_PLAN else name for name in sorted(MODELS)])
def test_a_published_model_trains_as_plain_autograd_within_its_plan(name: str) -> None:
    for check in _checked(name):
        assert check.worst_grad_error <= 1e-6, (name, check)
        assert check.measured_peak_bytes <= check.predicted_peak_bytes, (name, check)
        assert check.tracked_peak_bytes <= check.predicted_tracked_peak_bytes, (name, check)
        if check.memtracker_peak_bytes is not None:
            assert abs(check.memtracker_peak_bytes - check.tracked_peak_bytes) <= 0.01 * check.tracked_peak_bytes
