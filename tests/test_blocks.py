"""Recomputation inside a coarse stage (NOTE [ Blocks planned inside ]): cuts that carry several tensors,
segments checkpointed, and the two-level plan trained for real against plain autograd."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from chains import around_least
from steps import (
    StepPeaks,
    allocator_step_peaks,
    check_tracks,
    peaks_track,
    step_peaks,
    with_paged_records,
)
from torch import fx, nn

from edgetrain.core.chain import Chain
from edgetrain.core.schedule import PageOut, PageOutRecord, Schedule, keep_all
from edgetrain.core.simulator import simulate
from edgetrain.costs.energy import EnergyProfile
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.models import stages_of, transformer_encoder_small
from edgetrain.models.edge_vision import DenseNet
from edgetrain.models.segmented import SegmentedStage, _Graph, segmented_stage, segmented_stages
from edgetrain.models.stages import training_stages
from edgetrain.planners.blocks import block_variants, least_block_bytes, page_blocks, plan_blocks
from edgetrain.planners.choose import least_step_bytes
from edgetrain.planners.dp.paging import least_paging_peak, paging_dp
from edgetrain.profiling import profile
from edgetrain.runtime import Executor, PagingStats, check_step


class Ladder(nn.Module):
    """Three convolutions whose outputs all meet at the end: after the first, every cut carries two
    or three tensors, so the traced chain has the whole ladder as one stage. BatchNorm and dropout
    check that recomputed segments leave statistics and masks as plain autograd's."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, channels, 3, padding=1)
        self.b = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1))
        self.c = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(), nn.Dropout(0.3),
                               nn.Conv2d(channels, channels, 3, padding=1))
        self.head = nn.Linear(3 * channels, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        b = self.b(a)
        c = self.c(b)
        return self.head(torch.cat([a, b, torch.tanh(c)], 1).mean((2, 3)))


def ladder_stage() -> tuple[Ladder, fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    model = Ladder()
    stages = stages_of(model)
    coarse = [s for s in stages if isinstance(s, fx.GraphModule) and len(list(s.graph.nodes)) > 10]
    assert len(coarse) == 1
    x = torch.randn(2, 3, 16, 16)
    for stage in stages[:stages.index(coarse[0])]:
        x = stage(x)
    return model, coarse[0], x.detach()


def test_a_stage_cut_where_several_tensors_pass_computes_what_it_did() -> None:
    model, stage, x = ladder_stage()
    twin = segmented_stage(stage, x)
    assert isinstance(twin, SegmentedStage) and len(twin.pieces) >= 2
    assert max(twin.inputs_per_segment) >= 2   # a boundary of several tensors
    assert {id(p) for p in twin.parameters()} <= {id(p) for p in model.parameters()}

    reference = copy.deepcopy(stage)
    results = []
    for module in (reference, twin):
        x_in = x.clone().requires_grad_(True)
        torch.manual_seed(3)
        y = module(x_in)
        y.square().sum().backward()
        results.append((y.detach(), x_in.grad, [p.grad for p in module.parameters()],
                        [b.clone() for b in module.buffers()], torch.get_rng_state()))
    (y0, gx0, g0, b0, r0), (y1, gx1, g1, b1, r1) = results
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1) and torch.equal(r0, r1)
    assert all(torch.equal(p, q) for p, q in zip(g0, g1, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(b0, b1, strict=True))  # statistics updated once


def test_a_stage_of_one_op_chain_is_not_segmented() -> None:
    stage = fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4)))
    assert segmented_stage(stage, torch.randn(2, 4)) is None


Dense = tuple[nn.Module, torch.Tensor, torch.Tensor, Chain, Chain, list[bool]]


@pytest.fixture(scope="module")
def dense() -> Dense:
    """A small DenseNet: each dense block is one traced stage, every cut inside carries its feature maps."""
    torch.manual_seed(0)
    model = DenseNet(blocks=(3, 3), growth=8, init_features=8, num_classes=5)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 5, (2,))
    chain = profile(model, x, y, measure_time=False)
    stages = segmented_stages(stages_of(model), x)
    segmented = [isinstance(s, SegmentedStage) for s in stages] + [False]
    twins = profile(nn.Sequential(*stages), x, y, measure_time=False)
    return model, x, y, chain, twins, segmented


def test_two_level_plan_is_pure_and_lowers_the_least_budget(dense: Dense) -> None:
    _, _, _, chain, twins, segmented = dense
    assert sum(segmented) == 2
    variants = list(block_variants(chain, twins, segmented))
    assert [sum(inside) for _, inside in variants] == [0, 1, 2] and variants[0][0] == chain
    least = least_block_bytes(chain, twins, segmented)
    assert least < simulate(chain, keep_all(chain.length)).peak_bytes
    with pytest.raises(InfeasibleBudgetError) as refused:
        plan_blocks(chain, twins, segmented, memory=least - 1)
    assert refused.value.minimum_bytes == least
    roomy = plan_blocks(chain, twins, segmented, memory=10**12)
    assert not any(roomy.inside) and roomy.recompute_factor == 1.0   # nothing to gain: the fastest is plain
    tight = plan_blocks(chain, twins, segmented, memory=least)
    assert any(tight.inside) and tight.plan.predicted_peak_bytes <= least
    for rho in (1.1, 1.5):
        within = plan_blocks(chain, twins, segmented, recompute=rho)
        assert within.recompute_factor <= rho + 1e-9


def test_a_plan_that_only_adds_recomputation_is_never_planned_faster_than_the_plain_step() -> None:
    """NOTE [ A segmented stage is never faster than its whole stage ]: a twin profiled in another pass
    can be timed faster than its whole stage (the 0.83 and 0.71 "planned rho" of the compile_budget benchmark under
    load)."""
    plain = Chain.uniform(4, fwd_time_s=1.0, bwd_time_s=2.0, act_bytes=100, saved_bytes=100)
    whole = replace(plain, stages=(plain.stages[0], replace(plain.stages[1], saved_bytes=5000), *plain.stages[2:]))
    noisy = replace(whole.stages[1], saved_bytes=200, fwd_time_s=0.6, bwd_time_s=1.5)   # measured < 1 + 2 + 1
    twins = replace(whole, stages=(whole.stages[0], noisy, *whole.stages[2:]))
    segmented = [False, True, False, False]
    tight = plan_blocks(whole, twins, segmented, memory=least_block_bytes(whole, twins, segmented))
    assert tight.inside == (False, True, False, False)
    # the twin costs what it runs at least: the whole stage's forward, then its backward and one more forward
    assert (tight.chain.stages[1].fwd_time_s, tight.chain.stages[1].bwd_time_s) == (1.0, 2.0 + 1.0)
    assert tight.recompute_factor >= 1 + 1 / whole.compute_time_s   # the one recomputed forward, at least
    slower = replace(noisy, fwd_time_s=1.5, bwd_time_s=4.0)             # above the floor: kept as measured
    twins = replace(whole, stages=(whole.stages[0], slower, *whole.stages[2:]))
    kept = plan_blocks(whole, twins, segmented, memory=least_block_bytes(whole, twins, segmented))
    assert (kept.chain.stages[1].fwd_time_s, kept.chain.stages[1].bwd_time_s) == (1.5, 4.0)


def test_dense_blocks_planned_inside_train_as_plain_autograd(dense: Dense) -> None:
    model, x, y, chain, twins, segmented = dense
    least_as_traced = least_step_bytes(chain)
    least = least_block_bytes(chain, twins, segmented)
    assert least < least_as_traced   # recomputing inside a dense block goes below the chain's floor
    check = check_step(model, x, y, least, chain, twins=twins)
    assert check.predicted_peak_bytes <= least
    assert check.worst_grad_error <= 1e-6, check
    assert check_tracks(check), check
    assert check.recompute_factor > 1


def trains_below_the_chains_floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                                  stages: list[nn.Module]) -> None:
    """At the two-level plan's least budget, below the plain chain's, a step is plain autograd's, peak as planned."""
    chain = profile(model, x, y, measure_time=False)
    segmented = [isinstance(s, SegmentedStage) for s in stages] + [False]
    twins = profile(nn.Sequential(*stages), x, y, measure_time=False)
    least = least_block_bytes(chain, twins, segmented)
    assert least < least_step_bytes(chain)
    check = check_step(model, x, y, least, chain, twins=twins)
    assert check.worst_grad_error <= 1e-6, check
    assert check_tracks(check), check


# Paging as good as free (latency 1 ns, 1 TB/s, 10 mW), so the paging DP pages where it can.
FREE_STORAGE = EnergyProfile("free", 1e9, 3.0, 1e-9, 1e12, 0.01, 1e-9, 1e12, 0.01)


def paged_step(dense: Dense, inside: Sequence[bool], schedule: Schedule, chain: Chain,
               page_dir: Path) -> tuple[float, StepPeaks, PagingStats | None]:
    """Two steps of ``schedule`` on the dense model's stages (segmented where ``inside``): the first's worst
    relative gradient error against plain autograd, the second's measured peaks, and its paging."""
    model, x, y = copy.deepcopy(dense[0]), dense[1], dense[2]
    reference = copy.deepcopy(dense[0])
    nn.functional.cross_entropy(reference(x), y).backward()
    stages = [t if use else s for s, t, use in zip(stages_of(model), segmented_stages(stages_of(model), x), inside,
                                                     strict=False)]
    executor = Executor(training_stages(nn.Sequential(*stages)), schedule, chain, page_dir=page_dir)
    executor.step(x, y)
    error = max(((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
                for p, r in zip(model.parameters(), reference.parameters(), strict=True) if r.grad is not None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with step_peaks(model, optimizer, x, y) as peaks:
        executor.step(x, y)
        optimizer.step()
    return error, peaks, executor.last_paging


def test_a_segmented_stages_record_pages_its_segments_inputs(dense: Dense, tmp_path: Path) -> None:
    """``torch.utils.checkpoint`` saves a segment's inputs through autograd's saved-tensor hooks, so paging a
    segmented stage's record writes exactly them (``saved_bytes - out_bytes`` of its twin) and reads them back."""
    _, _, _, chain, twins, segmented = dense
    inside = [i for i, s in enumerate(segmented) if s]
    variant = next(c for c, use in block_variants(chain, twins, segmented) if sum(use) == len(inside))
    schedule = with_paged_records(variant, inside)
    error, measured, paging = paged_step(dense, segmented, schedule, variant, tmp_path)
    internals = sum(twins.stages[i].saved_bytes - twins.stages[i].out_bytes for i in inside)
    assert paging is not None and paging.bytes_written == paging.bytes_read == internals > 0
    assert error <= 1e-6
    assert peaks_track(measured, variant, schedule), measured


def test_paging_inside_blocks_reaches_below_paging_the_chain_as_traced(dense: Dense, tmp_path: Path) -> None:
    _, _, _, chain, twins, segmented = dense
    least_as_traced = least_paging_peak(chain, FREE_STORAGE).minimum_bytes
    budget = least_block_bytes(chain, twins, segmented) + 10_000
    assert budget < least_as_traced
    with pytest.raises(InfeasibleBudgetError):
        paging_dp(chain, FREE_STORAGE, budget)
    paged = page_blocks(chain, twins, segmented, FREE_STORAGE, budget)
    assert any(paged.inside) and paged.result.stats.peak_bytes <= budget
    assert any(isinstance(op, (PageOut, PageOutRecord)) for op in paged.result.schedule.ops)
    error, measured, paging = paged_step(dense, paged.inside, paged.result.schedule, paged.chain, tmp_path)
    assert error <= 1e-6 and paging is not None and paging.pageouts > 0
    assert peaks_track(measured, paged.chain, paged.result.schedule), measured


def test_every_budget_from_the_stated_least_gets_a_two_level_paging_plan_within_it(dense: Dense) -> None:
    """A refusal states the least budget of any variant's paging schedule (NOTE [ Paging near the least budget ]),
    and that budget and every one above it get a plan within it: counted without kernels' scratch, a grid alone
    refuses 381,000 bytes and states 380,877 as the least, each variant's grid scaled to the budget rounding
    every schedule away."""
    _, _, _, chain, twins, segmented = dense
    with pytest.raises(InfeasibleBudgetError) as info:
        page_blocks(chain, twins, segmented, FREE_STORAGE, 1)
    least = info.value.minimum_bytes
    assert least == min(least_paging_peak(c, FREE_STORAGE).minimum_bytes
                        for c, _ in block_variants(chain, twins, segmented))
    for budget in [*around_least(least, simulate(chain, keep_all(chain.length)).peak_bytes), least + 123]:
        paged = page_blocks(chain, twins, segmented, FREE_STORAGE, budget)
        assert simulate(paged.chain, paged.result.schedule).peak_bytes <= budget


def test_multi_tensor_boundaries_train_as_plain_autograd_below_the_chains_floor() -> None:
    torch.manual_seed(0)
    model = Ladder(channels=8)
    x, y = torch.randn(2, 3, 24, 24), torch.randint(0, 5, (2,))
    stages = segmented_stages(stages_of(model), x)
    trains_below_the_chains_floor(model, x, y, stages)


class WritesBack(nn.Module):
    """``h`` is changed in place after ``a`` is made from it, through a view: no cut may carry ``h``
    (or its view) past that write, or a recomputed segment would read the changed value."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        flat = h.view(-1)
        g = torch.sigmoid(self.b(h))
        k = torch.relu(self.c(g))
        flat.mul_(2)
        return torch.cat([h, g, k], 1)


def test_no_cut_carries_a_value_changed_in_place_later() -> None:
    stage = fx.symbolic_trace(WritesBack())
    graph = _Graph(stage, torch.randn(2, 8))
    names = [node.name for node in graph.nodes]
    made, written = names.index("tanh"), names.index("mul_")
    assert graph.allowed   # cuts exist, before ``h`` is made and after the write
    assert not [i for i in graph.allowed if made <= i < written]


def test_encoder_layers_given_whole_by_stages_are_planned_inside() -> None:
    """The zoo's encoder: ``stages()`` gives each ``nn.TransformerEncoderLayer`` whole; traced, it cuts
    after its attention block (several tensors pass inside it), dropout included."""
    torch.manual_seed(0)
    model = transformer_encoder_small(num_layers=1, d_model=32, nhead=4, dim_feedforward=128, max_len=64)
    x, y = torch.randint(0, 1000, (2, 64)), torch.randint(0, 10, (2,))
    stages = segmented_stages(stages_of(model), x)
    assert [type(s).__name__ for s in stages] == ["TokenEmbedding", "SegmentedStage", "ClsHead"]
    trains_below_the_chains_floor(model, x, y, stages)


def test_a_segmented_stage_keeps_generator_states_for_the_segments_that_draw_and_its_plan_counts_them() -> None:
    """NOTE [ Generator states in the plan ]: torch's checkpoint keeps a generator state (5,056 bytes on CPU,
    made outside the dispatcher) for each segment that preserves it; only segments that draw do (three of the
    layer's five segments), and the profile counts them in the stage's
    record. By the c10 allocator's records the least two-level step is not above its prediction."""
    from edgetrain.runtime import Checkpointed

    torch.manual_seed(0)
    model = transformer_encoder_small(num_layers=1, d_model=32, nhead=4, dim_feedforward=128, max_len=64)
    x, y = torch.randint(0, 1000, (2, 64)), torch.randint(0, 10, (2,))
    stages = segmented_stages(stages_of(model), x)
    layer = stages[1]
    assert isinstance(layer, SegmentedStage)
    assert (layer.kept_rng_states, len(layer.inputs_per_segment)) == (3, 5)
    captured = []
    original = torch.get_rng_state

    def counted() -> torch.Tensor:
        captured.append(1)
        return original()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "get_rng_state", counted)
        layer(stages[0](x))   # recorded: each checkpointed segment that preserves the state takes one
    assert len(captured) == 3
    chain = profile(model, x, y, measure_time=False)
    twins = profile(nn.Sequential(*stages), x, y, measure_time=False)
    least = least_block_bytes(chain, twins, [False, True, False, False])
    wrapped = Checkpointed(model, sample=x, target=y, chain=chain, blocks=True, twins=twins, memory=least,
                           measure_time=False)
    assert wrapped.block_plan is not None and any(wrapped.block_plan.inside)
    measured, predicted = allocator_step_peaks(wrapped, model, x, y)
    assert measured <= predicted

