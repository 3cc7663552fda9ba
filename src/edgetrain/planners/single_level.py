"""One level of recomputation: regions of stages that save only their input and are recomputed once.

This is the shape of plan that ``torch.utils.checkpoint`` regions express, and so the one that
``torch.compile`` can fuse inside while AOTAutograd recomputes each region in the backward
(:class:`~edgetrain.runtime.regions.Regions`). Every stage is either kept (recorded once, in the
forward) or recomputed inside a region (``STARTS`` opens one, ``GOES_ON`` continues it); a region
is recorded again just before its own backward, never nested.
"""

from __future__ import annotations

from ..core.chain import Chain
from ..core.schedule import Backward, Forward, Keep, Op, Schedule
from ..core.simulator import simulate
from ..errors import InfeasibleBudgetError
from ..units import format_bytes
from .uniform import record_and_reverse, segment_bounds

__all__ = ["KEPT", "STARTS", "GOES_ON", "MAX_GROUPS", "single_level", "single_level_plan", "stage_groups"]

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


# NOTE [ Searching long chains in groups ]
# The local search changes one stage's kind at a time from every checkpoint_sequential
# segmentation: on L stages about L starts x 3L moves per step x tens of steps, each move a
# simulation of O(L) ops. That is seconds on the ~20 stages of a ResNet or a U-Net, and hours on
# EfficientNet-B0's 79 traced stages (where fit_compiled's regions candidates would not come back). A
# chain of more than MAX_GROUPS model stages is searched in MAX_GROUPS groups of consecutive stages
# instead: a group is kept whole or lies whole in regions, and each group begins where a region may
# open (a stage that saves its input), so a region of groups is a region of stages. The plans found
# are a subset of the stage-wise search's, simulated on the stages themselves, so every prediction
# stays exact; what is lost is regions that begin or end inside a group. Chains of up to
# MAX_GROUPS + 1 stages are searched stage by stage.
MAX_GROUPS = 24


def stage_groups(opens: list[bool], max_groups: int = MAX_GROUPS) -> list[int]:
    """The first stage of each group the search moves (NOTE [ Searching long chains in groups ]): every model
    stage (all but the last, the loss) on a short chain; else ``max_groups`` of the stages where a region may
    open, spread evenly, the first stage always among them."""
    model_stages = len(opens) - 1
    if model_stages <= max_groups:
        return list(range(model_stages))
    openings = [0] + [i for i in range(1, model_stages) if opens[i]]
    if len(openings) <= max_groups:
        return openings
    return [openings[start] for start, _ in segment_bounds(len(openings), max_groups)]


def _stage_kinds(group_kinds: list[int], firsts: list[int], length: int) -> list[int]:
    """The stage kinds of a plan over groups: a kept group keeps its stages, a group opening a region opens it at
    its first stage and continues it over the rest, a continuing group continues it; the loss stage is kept."""
    kinds = [KEPT] * length
    for group, (start, end) in enumerate(zip(firsts, [*firsts[1:], length - 1], strict=True)):
        kind = group_kinds[group]
        kinds[start:end] = [kind] + [GOES_ON if kind != KEPT else KEPT] * (end - start - 1)
    return kinds


def single_level_plan(chain: Chain, budget_bytes: int) -> list[int]:
    """The kinds of a fast single-level plan within ``budget_bytes``, by local search on the simulator.

    From every ``checkpoint_sequential`` segmentation, and from keeping every stage, one stage's kind
    changes at a time while that lowers (bytes over the budget, time); the best end point wins. A
    heuristic (the optimal DP's nested plans are not single-level); on a chain of more than
    ``MAX_GROUPS`` model stages it moves groups of stages (NOTE [ Searching long chains in groups ]).

    A region opens only at a stage that saves its input: ``torch.utils.checkpoint`` holds a region's
    input until the region's backward is done, which the schedule (and edgetrain's executor) frees as
    soon as the first stage is recorded again when that stage does not save it (a ReLU saves its output).

    Raises:
        InfeasibleBudgetError: no plan it finds fits ``budget_bytes``.
    """
    length = chain.length
    stage_opens = [stage.input_saved for stage in chain.stages]
    firsts = stage_groups(stage_opens, MAX_GROUPS)
    groups = len(firsts) + 1   # the loss stage is a group of its own, always kept
    opens = [stage_opens[first] for first in firsts] + [stage_opens[-1]]
    costs: dict[tuple[int, ...], tuple[int, float]] = {}

    def cost(group_kinds: list[int]) -> tuple[int, float]:
        key = tuple(group_kinds)
        if key not in costs:
            stats = simulate(chain, single_level(_stage_kinds(group_kinds, firsts, length)))
            costs[key] = max(stats.peak_bytes - budget_bytes, 0), stats.time_s
        return costs[key]

    starts = [[KEPT] * groups]
    for segments in range(2, groups):   # checkpoint_sequential's segments of the model's groups, the last kept
        uniform = [KEPT] * groups
        for start, end in segment_bounds(groups - 1, segments)[:-1]:
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
    return _stage_kinds(best, firsts, length)
