"""The founding paper's Figure 1: the least peak memory against the recompute factor ρ, and its two claims.

Kukreja et al., *Training on the Edge: The why and the how* (PAISE 2019), plot Revolve's least memory per ρ for
LinearResNet-18..152 and claim, of batch 8 at 500 px on a 2 GB node, that at ρ = 1 even ResNet-18 does not fit and
that every model fits with ρ > 1.6. Three models of a step judge them: LinearResNet on the paper's own totals,
LinearResNet on our activation sizes (both Revolve), and the real ResNets with the optimal planner
(:func:`edgetrain.reports.figure1.figure1_curves`). The same curves as ``edgetrain reproduce figure1``, which also
plots them.
"""

from __future__ import annotations

from typing import Any

from edgetrain.devices import get_device
from edgetrain.profiling.linear_resnet import LINEAR_RESNET_DEPTHS
from edgetrain.reports.figure1 import RESNET_FAMILY, Figure1, figure1_curves, figure1_markdown
from edgetrain.units import format_bytes

TITLE = "The paper's Figure 1"
DEVICE = "odroid-xu4"   # the paper's 2 GB node
QUICK_DEPTHS = (18, 50)


def run(quick: bool) -> dict[str, Any]:
    """Every family's curves on the paper's four panels (quick: ResNet-18 and -50 only)."""
    budget_bytes = get_device(DEVICE).memory_bytes
    assert budget_bytes is not None
    return {"device": DEVICE, **figure1_curves(budget_bytes, QUICK_DEPTHS if quick else LINEAR_RESNET_DEPTHS).to_dict()}


def render(result: dict[str, Any]) -> str:
    return figure1_markdown(Figure1.from_dict(result))


def headline(result: dict[str, Any]) -> str:
    """The README's figure: the least ρ at which the real ResNets fit, batch 8 at 500 px."""
    figure = Figure1.from_dict(result)
    factors = list(figure.claim(RESNET_FAMILY).values())
    if None in factors:
        return f"at batch 8, 500 px not every ResNet fits {format_bytes(figure.budget_bytes)}"
    return (f"ResNets at batch 8, 500 px fit {figure.budget_bytes / 2**30:g} GiB at "
            f"ρ = {min(factors):.2f}-{max(factors):.2f} with the optimal planner")
