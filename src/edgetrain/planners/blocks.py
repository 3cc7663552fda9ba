"""A two-level plan: which coarse stages recompute inside (segmented), and the chain's schedule over them.

The inner level is fixed by ``models/segmented.py`` (NOTE [ Blocks planned inside ]): a
segmented stage saves only its segments' inputs and recomputes each segment once in its
backward, so it holds less than the whole stage and costs one more forward of it. The outer
level is :func:`~edgetrain.planners.plan` on a chain whose stage ``i`` is the whole stage's
cost or its segmented twin's. With ``m`` stages that have a twin there are ``2^m`` such chains;
this tries ``m + 1`` of them, segmenting the stages in order of the saved bytes segmenting
frees (largest first), and keeps the fastest within the budget (or, under a recompute factor,
the least peak within the factor, the factor taken against the plain step of the chain without
twins). Like every planner it is a pure function of cost models and a request.
:func:`page_blocks` does the same with the paging DP (``paging.py``) on each variant: recomputation
inside blocks, and paging of values and of records, a segmented stage's segment inputs included.

NOTE [ A segmented stage is never faster than its whole stage ]
A segmented twin runs every op of its whole stage forward, and in its backward every segment's
forward again and the same backward: it costs at least the whole stage's forward, and its
backward at least the whole stage's backward plus one more forward. The two chains' times come
from two profiles (two passes, minutes apart in a benchmark on a shared machine), so a twin can be
*measured* faster than its whole stage, and a plan that only adds recomputation would then be
planned below the plain step (ρ 0.83 and 0.71 in the ``compile_budget`` benchmark under load).
Counted in FLOPs (``measure_time=False``) the twin's backward would miss its extra forward altogether: torch's
``FlopCounterMode`` does not see the recomputation ``torch.utils.checkpoint`` runs inside the
backward (a checkpointed ``nn.Linear`` counts the same backward FLOPs as a plain one). So each
twin's times are taken as at least that floor, computed from the whole stage's: the measured part
above it (``torch.utils.checkpoint``'s own overhead) is kept, noise below it is not. Every variant
then costs at least the plain chain, and a two-level plan's factor is at least 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from ..core.chain import Chain, StageCost
from ..costs.energy import EnergyProfile
from ..errors import InfeasibleBudgetError
from ..units import parse_bytes
from .choose import Plan, least_step_bytes, plan
from .dp.paging import PagingResult, paging_dp

__all__ = ["BlockPlan", "PagedBlockPlan", "plan_blocks", "page_blocks", "block_variants", "least_block_bytes"]


@dataclass(frozen=True)
class BlockPlan:
    """The outer plan, the chain it was made on, and which stages run segmented."""

    plan: Plan
    chain: Chain
    inside: tuple[bool, ...]
    plain_time_s: float  # the step without any recomputation (no stage segmented)

    @property
    def recompute_factor(self) -> float:
        """Time over the plain step's, inner recomputation included."""
        return self.plan.predicted_time_s / self.plain_time_s


def block_variants(whole: Chain, twins: Chain, segmented: Sequence[bool]) -> Iterator[tuple[Chain, tuple[bool, ...]]]:
    """The chains tried: none segmented, then one more stage segmented each time, most saved bytes freed first.

    Args:
        whole: the chain of the stages as traced.
        twins: the chain of the same stages with the segmented ones in place (same length).
        segmented: which stages of ``twins`` are segmented.
    """
    if whole.length != twins.length or len(segmented) != whole.length:
        raise ValueError(f"the chains have {whole.length} and {twins.length} stages, the mask {len(segmented)}")
    order = sorted((i for i, s in enumerate(segmented) if s),
                   key=lambda i: twins.stages[i].saved_bytes - whole.stages[i].saved_bytes)
    inside = [False] * whole.length
    yield whole, tuple(inside)
    floored = [_segmented_cost(w, t) for w, t in zip(whole.stages, twins.stages, strict=True)]
    for i in order:
        inside[i] = True
        stages = tuple(t if use else w for w, t, use in zip(whole.stages, floored, inside, strict=True))
        yield replace(whole, stages=stages), tuple(inside)


def _segmented_cost(whole: StageCost, twin: StageCost) -> StageCost:
    """``twin`` with its times at least what the segmented stage runs of ``whole``'s: its forward, and in the
    backward one more forward and the backward (NOTE [ A segmented stage is never faster than its whole stage ])."""
    return replace(twin, fwd_time_s=max(twin.fwd_time_s, whole.fwd_time_s),
                   bwd_time_s=max(twin.bwd_time_s, whole.bwd_time_s + whole.fwd_time_s))


def plan_blocks(whole: Chain, twins: Chain, segmented: Sequence[bool], memory: int | str | None = None,
                recompute: float | None = None, *, strategy: str = "auto") -> BlockPlan:
    """The fastest two-level plan within ``memory``, or the least peak within ``recompute``.

    Raises:
        InfeasibleBudgetError: no variant fits; ``minimum_bytes`` is the least any reaches.
        ValueError: neither or both of ``memory`` and ``recompute``.
    """
    if (memory is None) == (recompute is None):
        raise ValueError("give exactly one of memory= (a budget) or recompute= (a factor ρ >= 1)")
    plain_s = whole.compute_time_s
    found: list[BlockPlan] = []
    minimum: int | None = None
    for chain, inside in block_variants(whole, twins, segmented):
        try:
            if memory is not None:
                chosen = plan(chain, memory=memory, strategy=strategy)
            else:
                assert recompute is not None
                factor = recompute * plain_s / chain.compute_time_s
                if factor < 1:
                    continue
                chosen = plan(chain, recompute=factor, strategy=strategy)
        except InfeasibleBudgetError as exc:
            if exc.minimum_bytes is not None:
                minimum = exc.minimum_bytes if minimum is None else min(minimum, exc.minimum_bytes)
            continue
        found.append(BlockPlan(chosen, chain, inside, plain_s))
    if not found:
        budget = parse_bytes(memory) if memory is not None else None
        raise InfeasibleBudgetError(f"budget {budget} bytes is below the least peak of any two-level plan, "
                                    f"{minimum} bytes", minimum_bytes=minimum, budget_bytes=budget)
    if memory is not None:
        return min(found, key=lambda b: (b.plan.predicted_time_s, sum(b.inside)))
    return min(found, key=lambda b: (b.plan.predicted_peak_bytes, b.plan.predicted_time_s))


@dataclass(frozen=True)
class PagedBlockPlan:
    """A two-level plan that also pages: the outer schedule (recomputation and paging), its chain and stats."""

    result: PagingResult
    chain: Chain
    inside: tuple[bool, ...]


def page_blocks(whole: Chain, twins: Chain, segmented: Sequence[bool], profile: EnergyProfile, memory: int | str,
                *, slots: int = 500) -> PagedBlockPlan:
    """The least-energy two-level plan within ``memory`` with paging: :func:`~edgetrain.planners.dp.paging.paging_dp`
    on each variant :func:`block_variants` gives, the least energy kept (fewer segmented stages on a tie).

    A segmented stage's record holds its segments' inputs, which ``torch.utils.checkpoint`` saves through
    autograd's saved-tensor hooks: paging the record (``PageOutRecord``) writes exactly them, and the
    executor's hooks page them like any stage's internals (NOTE [ Paged records ] in ``runtime/step_pager.py``).

    Raises:
        InfeasibleBudgetError: no variant fits; ``minimum_bytes`` is the least budget of any variant's paging
            schedule, in bytes without a grid (NOTE [ Paging near the least budget ] in ``paging.py``): it and every
            budget above it get a plan.
    """
    budget = parse_bytes(memory)
    found: list[PagedBlockPlan] = []
    minimum: int | None = None
    for chain, inside in block_variants(whole, twins, segmented):
        try:
            found.append(PagedBlockPlan(paging_dp(chain, profile, budget, slots=slots), chain, inside))
        except InfeasibleBudgetError as exc:
            if exc.minimum_bytes is not None:
                minimum = exc.minimum_bytes if minimum is None else min(minimum, exc.minimum_bytes)
    if not found:
        raise InfeasibleBudgetError(f"budget {budget} bytes is below the least peak of any two-level paging plan, "
                                    f"{minimum} bytes", minimum_bytes=minimum, budget_bytes=budget)
    return min(found, key=lambda b: (b.result.stats.energy_j or 0.0, sum(b.inside)))


def least_block_bytes(whole: Chain, twins: Chain, segmented: Sequence[bool]) -> int:
    """The least step peak of any variant :func:`plan_blocks` tries."""
    return min(least_step_bytes(chain) for chain, _ in block_variants(whole, twins, segmented))
