"""One level of recomputation: regions of stages that save only their input and are recomputed once.

This is the shape of plan that ``torch.utils.checkpoint`` regions express, and so the one that
``torch.compile`` can fuse inside while AOTAutograd recomputes each region in the backward
(:class:`~edgetrain.runtime.regions.Regions`). Every stage is either kept (recorded once, in the
forward) or recomputed inside a region (``STARTS`` opens one, ``GOES_ON`` continues it); a region
is recorded again just before its own backward, never nested.
"""

from __future__ import annotations

from ..chain import Chain
from ..errors import InfeasibleBudgetError
from ..schedule import Backward, Forward, Keep, Op, Schedule, simulate
from ..units import format_bytes
from .uniform import record_and_reverse, segment_bounds

__all__ = ["KEPT", "STARTS", "GOES_ON", "single_level", "single_level_plan"]

KEPT, STARTS, GOES_ON = 0, 1, 2   # a stage's kind in a single-level plan


def single_level(kinds: list[int]) -> Schedule:
    """The schedule of a single-level plan: its forward keeps every kept stage's record and each region's
    input; its backward records each region again, once, right before back-propagating it."""
    ops: list[Op] = [Forward(i, (Keep.ALL, Keep.INPUT, Keep.NONE)[kind]) for i, kind in enumerate(kinds)]
    for i in reversed(range(len(kinds))):
        if kinds[i] == KEPT:
            ops.append(Backward(i))
        elif kinds[i] == STARTS:
            end = next((j for j in range(i + 1, len(kinds)) if kinds[j] != GOES_ON), len(kinds))
            ops += record_and_reverse(i, end)
    return Schedule(tuple(ops), len(kinds), strategy="single-level")


def _moves(kinds: list[int], opens: list[bool]) -> list[list[int]]:
    """Every valid plan that differs from ``kinds`` in one stage's kind (the loss stage, the last, stays kept)."""
    moves = []
    for i in range(len(kinds) - 1):
        for kind in (KEPT, STARTS, GOES_ON):
            opens_nothing = kind == GOES_ON and (i == 0 or kinds[i - 1] == KEPT)
            orphans_next = kind == KEPT and kinds[i + 1] == GOES_ON
            if kind != kinds[i] and not opens_nothing and not orphans_next and (kind != STARTS or opens[i]):
                moves.append([*kinds[:i], kind, *kinds[i + 1:]])
    return moves


def single_level_plan(chain: Chain, budget_bytes: int) -> list[int]:
    """The kinds of a fast single-level plan within ``budget_bytes``, by local search on the simulator.

    From every ``checkpoint_sequential`` segmentation, and from keeping every stage, one stage's kind
    changes at a time while that lowers (bytes over the budget, time); the best end point wins. A
    heuristic (the optimal DP's nested plans are not single-level): cheap, on a chain of ~20 stages
    a few hundred simulations.

    A region opens only at a stage that saves its input: ``torch.utils.checkpoint`` holds a region's
    input until the region's backward is done, which the schedule (and edgetrain's executor) frees as
    soon as the first stage is recorded again when that stage does not save it (a ReLU saves its output).

    Raises:
        InfeasibleBudgetError: no plan it finds fits ``budget_bytes``.
    """
    def cost(kinds: list[int]) -> tuple[int, float]:
        stats = simulate(chain, single_level(kinds))
        return max(stats.peak_bytes - budget_bytes, 0), stats.time_s

    length = chain.length
    opens = [stage.input_saved for stage in chain.stages]
    starts = [[KEPT] * length]
    for segments in range(2, length):   # checkpoint_sequential's segments of the model's stages, the last kept
        uniform = [KEPT] * length
        for start, end in segment_bounds(length - 1, segments)[:-1]:
            uniform[start:end] = [STARTS] + [GOES_ON] * (end - start - 1)
        if all(opens[i] for i, kind in enumerate(uniform) if kind == STARTS):
            starts.append(uniform)
    ends = []
    for kinds in starts:
        current = cost(kinds)
        while True:
            trial = min(((cost(move), move) for move in _moves(kinds, opens)), default=None)
            if trial is None or trial[0] >= current:
                break
            current, kinds = trial
        ends.append((current, kinds))
    (over_bytes, _), best = min(ends)
    if over_bytes > 0:
        raise InfeasibleBudgetError(f"no single-level plan found within {format_bytes(budget_bytes)} "
                                    f"({budget_bytes} bytes) for {chain.name or 'this chain'}",
                                    budget_bytes=budget_bytes)
    return best
