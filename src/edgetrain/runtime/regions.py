"""A single-level plan as ``torch.utils.checkpoint`` regions, for ``torch.compile`` to fuse inside.

NOTE [ Checkpoint regions in one compiled graph ]
``Checkpointed(compile_stages=True)`` compiles each stage alone: a stage boundary stops kernel
fusion, and recomputation reruns the compiled stages outside autograd. :class:`Regions` instead
runs the stages in order with each region of a single-level plan
(:func:`~edgetrain.planners.single_level.single_level_plan`) inside one non-reentrant
``torch.utils.checkpoint``; ``torch.compile`` of the whole module then traces one graph in which
AOTAutograd recomputes those regions in the backward, fused like the rest. Uncompiled, it runs
exactly the single-level schedule (the ``compile_budget`` benchmark's ``edgetrain+regions`` setting).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from ..planners.single_level import GOES_ON, KEPT, STARTS

__all__ = ["Regions"]


class Regions(nn.Module):
    """``stages`` in order, each region of recomputed ones (by ``kinds``, one per stage) in one checkpoint."""

    def __init__(self, stages: list[nn.Module], kinds: list[int]) -> None:
        super().__init__()
        if len(stages) != len(kinds):
            raise ValueError(f"{len(stages)} stages but {len(kinds)} kinds")
        self.stages = nn.ModuleList(stages)
        self.ranges: list[tuple[int, int, bool]] = []   # (first stage, end, recomputed)
        for i, kind in enumerate(kinds):
            if kind == GOES_ON or (kind == KEPT and self.ranges and not self.ranges[-1][2]):
                self.ranges[-1] = (self.ranges[-1][0], i + 1, self.ranges[-1][2])
            else:
                self.ranges.append((i, i + 1, kind == STARTS))

    def run(self, start: int, end: int, h: Any) -> Any:
        for stage in self.stages[start:end]:
            h = stage(h)
        return h

    def forward(self, h: Any) -> Any:
        for start, end, recomputed in self.ranges:
            h = checkpoint(self.run, start, end, h, use_reentrant=False) if recomputed else self.run(start, end, h)
        return h
