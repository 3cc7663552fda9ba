"""Tests of POET's MILP planner (``edgetrain.planners.milp.solve``).

The replay :func:`simulate_graph_schedule` is the oracle: every schedule the MILP returns is
replayed, must meet its budget and deadline, and must cost what the solver's objective says.
Optima are checked against hand-derived graphs (the value to drop, to page or to recompute is
forced by construction) and against exhaustive search over every recomputation pattern of
tiny chains.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import numpy as np
import pytest
import torch
from calibration import TEST_HOST
from torch import nn

from edgetrain.core.chain import Chain, StageCost
from edgetrain.costs.energy import EnergyProfile, page_energy_j
from edgetrain.costs.timemodel import training_rate
from edgetrain.devices import get_device
from edgetrain.errors import EdgetrainError, InfeasibleBudgetError, ScheduleError
from edgetrain.planners.milp.solve import (
    GraphSchedule,
    TrainingGraph,
    TrainingNode,
    chain_training_graph,
    coarsen,
    keep_all_schedule,
    milp,
    minimum_bytes,
    paging_schedule,
    recompute_schedule,
    simulate_graph_schedule,
    training_graph,
)
from edgetrain.planners.milp.variants import variants_table
from edgetrain.profiling.graph import capture_graph

RPI4 = EnergyProfile.from_device(get_device("rpi4"), training_rate(get_device("rpi4"), TEST_HOST))


def fwd(name: str, energy: float, mem: int, deps: tuple[int, ...] = (), *, time: float | None = None,
        page: tuple[float, float] = (50.0, 50.0), page_time: tuple[float, float] = (1.0, 1.0)) -> TrainingNode:
    """A forward node; ``page`` is (page-in, page-out) energy (dear by default), ``page_time`` their times."""
    return TrainingNode(name, time_s=energy if time is None else time, energy_j=energy, mem_bytes=mem, deps=deps,
                        pagein_energy_j=page[0], pageout_energy_j=page[1], pagein_time_s=page_time[0],
                        pageout_time_s=page_time[1])


def bwd(name: str, energy: float, mem: int, deps: tuple[int, ...]) -> TrainingNode:
    return TrainingNode(name, time_s=energy, energy_j=energy, mem_bytes=mem, deps=deps, backward=True)


def check(tg: TrainingGraph, result, budget: int, deadline: float | None = None) -> None:
    """The replay accepts the schedule, meets budget and deadline, and reproduces the objective."""
    stats = simulate_graph_schedule(tg, result, memory_bytes=budget)
    assert stats.peak_bytes == result.peak_bytes <= budget
    assert stats.energy_j == pytest.approx(result.energy_j, rel=1e-12)
    if result.status == "optimal":
        assert result.energy_j == pytest.approx(result.objective_j, rel=1e-7, abs=1e-9)
    else:  # an incumbent cut short may recompute or page what nothing reads; the schedule drops it
        assert result.energy_j <= result.objective_j * (1 + 1e-7) + 1e-9
    assert stats.energy_j == pytest.approx(stats.energy_compute_j + stats.energy_pagein_j + stats.energy_pageout_j)
    if deadline is not None:
        assert stats.time_s <= deadline * (1 + 1e-9)
    assert result.bound_j <= result.energy_j * (1 + 1e-9)


def one_stored_value() -> TrainingGraph:
    """``a`` must leave RAM during ``b``/``c`` and come back for ``Bb``: page it or recompute it.

    Keep-all peaks at 31 B (a, b, c, Bc); at 21 B stage ``Bc`` holds b, c and Bc only, so ``a``
    is out of RAM from stage 2 on, and ``Bb`` needs it again.
    """
    return TrainingGraph((
        fwd("a", 5.0, 10, page=(0.5, 0.5), page_time=(3.0, 3.0)),
        fwd("b", 1.0, 10, (0,)),
        fwd("c", 1.0, 10, (1,)),
        bwd("Bc", 1.0, 1, (2, 1)),
        bwd("Bb", 1.0, 1, (3, 0)),
        bwd("Ba", 1.0, 1, (4,)),
    ))


def two_candidates() -> TrainingGraph:
    """At 22 B one of ``x`` (3 J) and ``y`` (2 J) must be dropped before ``z``: the cheaper, ``y``, is."""
    return TrainingGraph((
        fwd("x", 3.0, 10), fwd("y", 2.0, 10), fwd("z", 1.0, 10),
        bwd("Bz", 1.0, 1, (2,)), bwd("Bxy", 1.0, 1, (3, 0, 1)),
    ))


def random_chain(rng: random.Random, length: int, scale: int = 1) -> Chain:
    stages = tuple(StageCost(name=f"s{i}", fwd_time_s=rng.choice([0.5, 1.0, 2.0, 3.0]),
                             bwd_time_s=rng.choice([1.0, 2.0, 4.0]), out_bytes=rng.randint(1, 4) * scale,
                             saved_bytes=0, input_saved=rng.random() < 0.7, output_saved=rng.random() < 0.7)
                   for i in range(length))
    return Chain(stages, input_bytes=scale)


def brute_force(tg: TrainingGraph) -> list[tuple[int, float]]:
    """(peak, energy) of every recomputation pattern without paging that replays, each replayed."""
    # The minimal-storage rule the planner reads back with.
    from edgetrain.planners.milp.replay import schedule_from_decisions

    n = len(tg)
    cells = [(t, i) for t in range(n) for i in range(t) if not tg.nodes[i].backward and t <= tg.need_end[i]]
    z = np.zeros((n, n), dtype=bool)
    found = []
    for bits in itertools.product((False, True), repeat=len(cells)):
        R = np.eye(n, dtype=bool)
        for on, (t, i) in zip(bits, cells, strict=False):
            R[t, i] = on
        try:
            stats = simulate_graph_schedule(tg, schedule_from_decisions(tg, R, z, z))
        except ScheduleError:
            continue
        found.append((stats.peak_bytes, stats.energy_j))
    return found


def assert_matches_brute_force(tg: TrainingGraph) -> None:
    """At every budget from the minimum to keep-all, the MILP's optimum is the exhaustive one."""
    patterns = brute_force(tg)
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    for budget in range(minimum_bytes(tg), peak + 1):
        fits = [e for p, e in patterns if p <= budget]
        if not fits:
            with pytest.raises(InfeasibleBudgetError):
                milp(tg, budget, paging=False)
            continue
        result = milp(tg, budget, paging=False)
        assert result.energy_j == pytest.approx(min(fits), rel=1e-9)
        check(tg, result, budget)


# --- optima known by hand --------------------------------------------------------------------------
def test_unlimited_memory_is_one_pass() -> None:
    tg = chain_training_graph(random_chain(random.Random(3), 6, scale=1000), RPI4)
    result = milp(tg, 10**12)
    assert result.status == "optimal"
    assert result.energy_j == pytest.approx(tg.compute_energy_j)
    assert (np.eye(len(tg), dtype=bool) == result.R).all()
    assert not result.M_in.any() and not result.M_out.any()
    check(tg, result, 10**12)


def test_keep_all_budget_needs_no_recomputation() -> None:
    tg = one_stored_value()
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    assert peak == 31
    result = milp(tg, peak)
    assert result.energy_j == pytest.approx(tg.compute_energy_j)
    check(tg, result, peak)


def test_forced_recomputation_takes_the_cheapest() -> None:
    tg = two_candidates()
    assert minimum_bytes(tg) == 22
    result = milp(tg, 22, paging=False)
    assert result.energy_j == pytest.approx(tg.compute_energy_j + 2.0)
    assert result.R[:, 1].sum() == 2 and result.R[:, 0].sum() == 1
    check(tg, result, 22)


def test_paging_chosen_when_cheaper_than_recomputing() -> None:
    tg = one_stored_value()
    result = milp(tg, 21)
    assert result.energy_j == pytest.approx(tg.compute_energy_j + 1.0)
    assert result.M_out[:, 0].sum() == 1 and result.M_in[:, 0].sum() == 1
    assert result.R[:, 0].sum() == 1
    assert result.energy_pagein_j == pytest.approx(0.5) and result.energy_pageout_j == pytest.approx(0.5)
    check(tg, result, 21)


def test_recomputation_chosen_when_cheaper_than_paging() -> None:
    base = one_stored_value()
    cheap_a = TrainingGraph((fwd("a", 0.5, 10, page=(0.5, 0.5)), *base.nodes[1:]))
    result = milp(cheap_a, 21)
    assert result.energy_j == pytest.approx(cheap_a.compute_energy_j + 0.5)
    assert result.R[:, 0].sum() == 2 and not result.M_in.any() and not result.M_out.any()
    check(cheap_a, result, 21)


def test_without_paging_it_recomputes() -> None:
    tg = one_stored_value()
    result = milp(tg, 21, paging=False)
    assert result.energy_j == pytest.approx(tg.compute_energy_j + 5.0)
    assert not result.M_in.any() and not result.SSd.any()
    check(tg, result, 21)


def test_binding_deadline_trades_energy_for_time() -> None:
    """Paging ``a`` costs 1 J and 6 s, recomputing it 5 J and 5 s: a 5 s margin forces recomputation."""
    tg = one_stored_value()
    free = milp(tg, 21)
    assert free.time_s == pytest.approx(tg.compute_time_s + 6.0)
    deadline = tg.compute_time_s + 5.0
    bound = milp(tg, 21, deadline_s=deadline)
    assert bound.energy_j == pytest.approx(tg.compute_energy_j + 5.0)
    assert not bound.M_in.any()
    check(tg, bound, 21, deadline)


def test_deadline_below_one_pass_is_refused() -> None:
    tg = one_stored_value()
    with pytest.raises(EdgetrainError, match="deadline"):
        milp(tg, 100, deadline_s=tg.compute_time_s * 0.9)


def test_budget_and_deadline_together_infeasible() -> None:
    """21 B forces paging or recomputation; a deadline of one pass allows neither."""
    tg = one_stored_value()
    with pytest.raises(InfeasibleBudgetError) as info:
        milp(tg, 21, deadline_s=tg.compute_time_s, time_limit_s=10)
    assert info.value.minimum_bytes == minimum_bytes(tg)


def test_budget_below_the_largest_step_raises_with_the_minimum() -> None:
    tg = two_candidates()
    with pytest.raises(InfeasibleBudgetError) as info:
        milp(tg, 21)
    assert info.value.minimum_bytes == 22 and info.value.budget_bytes == 21


def paged_back_chain() -> Chain:
    """At 11 B, ``x_1`` (F0's output) must leave RAM during B1 after recomputing F1 from it."""
    return Chain((StageCost("s0", 0.5, 1.0, 2, 2, input_saved=False, output_saved=True),
                  StageCost("s1", 0.5, 1.0, 4, 4, input_saved=False, output_saved=True),
                  StageCost("s2", 2.0, 2.0, 3, 3, input_saved=False, output_saved=True)), input_bytes=1)


@pytest.mark.parametrize("write_once", [True, False])
def test_value_used_then_dropped_then_paged_back_in(write_once: bool) -> None:
    """Stage B1 recomputes F1 from ``x_1``, drops ``x_1`` and pages it in for B0 (23.5513 J, as paging-dp).

    Recomputing F0 for B0 instead costs 24 J. The value is freed in the stage at whose end it is paged
    in: counting it as kept for the next stage would forbid this schedule.
    """
    profile = EnergyProfile("x", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)
    tg = chain_training_graph(paged_back_chain(), profile)
    result = milp(tg, 11, mip_gap=1e-9, write_once=write_once)
    assert result.energy_j == pytest.approx(22.5 + page_energy_j(2, profile, "in") + page_energy_j(2, profile, "out"))
    assert result.energy_j < 24.0
    assert result.M_in[4, 0] and result.R[4, 1] and result.R[:, 0].sum() == 1
    check(tg, result, 11)


def test_replay_frees_a_value_paged_in_at_the_end_of_the_stage() -> None:
    """The replay counts a paged-in value from the next stage's start, not through the stage."""
    profile = EnergyProfile("x", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)
    tg = chain_training_graph(paged_back_chain(), profile)
    n = len(tg)
    R = np.eye(n, dtype=bool)
    R[4, 1] = True                                    # B1's stage recomputes F1 from x_1
    S = np.zeros((n, n), dtype=bool)
    for t, i in ((1, 0), (2, 0), (2, 1), (3, 0), (3, 2), (4, 0), (4, 3), (5, 4), (5, 0)):
        S[t, i] = True
    none = np.zeros((n, n), dtype=bool)
    M_in, M_out = none.copy(), none.copy()
    M_in[4, 0] = M_out[0, 0] = True                  # x_1 written in its stage, read back after B1
    paged = GraphSchedule(R=R, S=S, M_in=M_in, M_out=M_out, SSd=none)
    kept = GraphSchedule(R=R, S=S, M_in=none, M_out=none, SSd=none)
    assert simulate_graph_schedule(tg, paged, memory_bytes=11).peak_bytes == 11
    assert simulate_graph_schedule(tg, kept).peak_bytes == 13   # x_1 held through B1


# --- exhaustive search ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force_on_tiny_chains(seed: int) -> None:
    assert_matches_brute_force(chain_training_graph(random_chain(random.Random(seed), 3), RPI4))


def test_matches_brute_force_on_a_diamond() -> None:
    """a -> (b, c) -> d with a skip: the DAG case, every budget from the minimum to keep-all."""
    tg = TrainingGraph((
        fwd("a", 2.0, 4), fwd("b", 1.0, 3, (0,)), fwd("c", 3.0, 2, (0,)), fwd("d", 1.0, 2, (1, 2)),
        bwd("Bd", 1.0, 5, (3, 1, 2)), bwd("Bc", 1.0, 4, (4, 0)), bwd("Bb", 1.0, 4, (4, 0)),
        bwd("Ba", 1.0, 1, (5, 6)),
    ), resident_bytes=1)
    assert_matches_brute_force(tg)


@pytest.mark.slow
def test_matches_brute_force_with_paging() -> None:
    """Every recomputation and paging pattern of a 5-node graph (25k replays, ~10 s)."""
    tg = TrainingGraph((
        fwd("a", 2.0, 4, page=(0.3, 0.4), page_time=(0.5, 0.5)), fwd("b", 1.0, 3, (0,), page=(0.2, 0.9)),
        fwd("c", 3.0, 2, (1,), page=(1.5, 0.1)), bwd("Bc", 1.0, 2, (2, 1)), bwd("Bb", 1.0, 2, (3, 0)),
    ), resident_bytes=1)
    from edgetrain.planners.milp.replay import schedule_from_decisions

    n, end = len(tg), tg.need_end
    cells = ([("R", t, i) for t in range(n) for i in range(t) if not tg.nodes[i].backward and t <= end[i]]
             + [("out", t, i) for t in range(n) for i in range(n) if i <= t <= end[i] - 2]
             + [("in", t, i) for t in range(n) for i in range(n) if i < t < end[i]])
    patterns = []
    for bits in itertools.product((False, True), repeat=len(cells)):
        m = {k: np.zeros((n, n), dtype=bool) for k in ("R", "in", "out")}
        m["R"] |= np.eye(n, dtype=bool)
        for on, (k, t, i) in zip(bits, cells, strict=False):
            m[k][t, i] = on
        try:
            stats = simulate_graph_schedule(tg, schedule_from_decisions(tg, m["R"], m["in"], m["out"]))
        except ScheduleError:
            continue
        patterns.append((stats.peak_bytes, stats.energy_j))
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    for budget in range(minimum_bytes(tg), peak + 1):
        result = milp(tg, budget)
        assert result.energy_j == pytest.approx(min(e for p, e in patterns if p <= budget), rel=1e-9)
        check(tg, result, budget)


# --- replay, heuristics, time limit --------------------------------------------------------------
def test_paging_schedule_reaches_the_lower_bound() -> None:
    tg = chain_training_graph(random_chain(random.Random(5), 12, scale=10**6), RPI4)
    stats = simulate_graph_schedule(tg, paging_schedule(tg))
    assert stats.peak_bytes == minimum_bytes(tg)
    assert stats.energy_compute_j == pytest.approx(tg.compute_energy_j)
    simulate_graph_schedule(tg, recompute_schedule(tg))


def test_replay_rejects_a_missing_dependency() -> None:
    tg = one_stored_value()
    n = len(tg)
    z = np.zeros((n, n), dtype=bool)
    S = keep_all_schedule(tg).S.copy()
    S[4, 0] = False  # Bb needs a
    with pytest.raises(ScheduleError, match="needs"):
        simulate_graph_schedule(tg, GraphSchedule(R=np.eye(n, dtype=bool), S=S, M_in=z, M_out=z, SSd=z))
    M_in = z.copy()
    M_in[3, 0] = True  # a page-in with nothing on flash
    with pytest.raises(ScheduleError, match="flash"):
        simulate_graph_schedule(tg, GraphSchedule(R=np.eye(n, dtype=bool), S=keep_all_schedule(tg).S, M_in=M_in,
                                                  M_out=z, SSd=z))


def test_time_limit_returns_a_feasible_schedule() -> None:
    tg = chain_training_graph(random_chain(random.Random(1), 30, scale=10**6), RPI4)
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    budget = (peak + minimum_bytes(tg)) // 2
    for paging in (True, False):
        result = milp(tg, budget, time_limit_s=0.05, paging=paging)
        assert result.status == "time_limit"
        stats = simulate_graph_schedule(tg, result, memory_bytes=budget)
        assert stats.energy_j == pytest.approx(result.energy_j)
        assert result.solve_time_s >= 0.05  # stopped by its own clock, not before the limit


def test_warm_start_from_a_previous_result() -> None:
    tg = chain_training_graph(random_chain(random.Random(2), 8, scale=10**6), RPI4)
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    budget = (3 * peak + minimum_bytes(tg)) // 4
    first = milp(tg, budget)
    again = milp(tg, budget, warm_start=first, time_limit_s=0.01)
    assert again.energy_j <= first.energy_j * (1 + 1e-9)
    check(tg, first, budget)


def test_deadline_is_met_on_a_medium_chain() -> None:
    """Between the recompute-only optimum's time and the unconstrained one: energy in between too."""
    tg = chain_training_graph(random_chain(random.Random(4), 10, scale=10**6), RPI4)
    peak = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    budget = (peak + minimum_bytes(tg)) // 2
    free = milp(tg, budget)
    recompute = milp(tg, budget, paging=False)
    deadline = min(free.time_s, recompute.time_s)
    bound = milp(tg, budget, deadline_s=deadline)
    check(tg, bound, budget, deadline)
    assert free.energy_j - 1e-9 <= bound.energy_j <= max(free.energy_j, recompute.energy_j) + 1e-9


# --- cost models ---------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn(self.fc1(x)))
        return self.fc2(h) + self.fc2(h.flip(1)[:, :32])


def test_training_graph_from_operators() -> None:
    graph = capture_graph(Tiny(), (8, 16), target=torch.zeros(8, dtype=torch.long))
    tg = training_graph(graph, RPI4)
    names = [n.name for n in tg.nodes]
    forward = [n for n in tg.nodes if not n.backward]
    # inputs are resident; the in-place relu shares bn's node, the slice view flip's
    assert "x" not in names and "target" not in names and "relu" not in names and "getitem" not in names
    assert len(forward) == tg.meta["n_forward"] == len(graph.nodes) - 4
    params = sum(n.param_bytes for n in graph.nodes)
    inputs = sum(n.out_bytes for n in graph.nodes if n.kind == "input")
    assert tg.resident_bytes >= 3 * params + inputs  # weights, gradients, momentum, batch
    index = {n.name: k for k, n in enumerate(tg.nodes)}
    bn_b = tg.nodes[index["bn.backward"]]
    # bn's backward needs fc1's output (saved input) and its own value (relu saves its output)
    assert index["fc1"] in bn_b.deps and index["bn"] in bn_b.deps
    # and the gradient from each reader of the relu output
    readers = [k for k, n in enumerate(tg.nodes) if not n.backward and index["bn"] in n.deps]
    for r in readers:
        back = index.get(f"{tg.nodes[r].name}.backward")
        if back is not None:
            assert back in bn_b.deps
    fc1 = graph.nodes[[n.name for n in graph.nodes].index("fc1")]
    assert tg.nodes[index["fc1"]].energy_j == pytest.approx(fc1.fwd_flops / RPI4.compute_flops_per_s
                                                            * RPI4.compute_power_w)
    assert tg.nodes[index["fc1"]].pageout_energy_j == pytest.approx(page_energy_j(fc1.out_bytes, RPI4, "out"))
    result = milp(tg, simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes)
    assert result.energy_j == pytest.approx(tg.compute_energy_j)


def test_chain_training_graph_rules() -> None:
    stages = (StageCost("s0", 1.0, 2.0, out_bytes=4, saved_bytes=6, input_saved=True, output_saved=False),
              StageCost("s1", 1.0, 2.0, out_bytes=3, saved_bytes=3, input_saved=True, output_saved=True),
              StageCost("s2", 1.0, 2.0, out_bytes=2, saved_bytes=0, input_saved=False, output_saved=False))
    chain = Chain(stages, input_bytes=5, name="c")
    tg = chain_training_graph(chain, RPI4)
    assert [n.name for n in tg.nodes] == ["F0", "F1", "F2", "B2", "B1", "B0"]
    assert [n.mem_bytes for n in tg.nodes] == [6, 3, 2, 3, 4, 0]
    assert tg.nodes[3].deps == ()            # B2: last stage, keeps nothing
    assert tg.nodes[4].deps == (0, 1, 3)     # B1: x_1 = F0, own output, B2
    assert tg.nodes[5].deps == (0, 4)        # B0: record with extra saved tensors, B1; x_0 resident
    assert tg.resident_bytes == chain.resident_bytes + chain.gradients_bytes
    assert tg.nodes[0].energy_j == pytest.approx(RPI4.compute_power_w * 1.0)


def test_coarsen_merges_cheap_forward_runs_and_stays_safe() -> None:
    tg = TrainingGraph((
        fwd("a", 2.0, 4), fwd("cheap", 0.0, 8, (0,)), fwd("c", 3.0, 2, (1,)),
        bwd("Bc", 1.0, 2, (2,)), bwd("Ba", 1.0, 1, (3, 0)),
    ))
    small = coarsen(tg)
    assert len(small) == len(tg) - 1 and small.compute_energy_j == pytest.approx(tg.compute_energy_j)
    merged = small.nodes[1]
    assert merged.deps == (0,) and merged.workspace_bytes >= 8
    assert minimum_bytes(small) >= minimum_bytes(tg)
    budget = simulate_graph_schedule(small, keep_all_schedule(small)).peak_bytes
    check(small, milp(small, budget), budget)


@pytest.mark.slow
def test_resnet18_operator_graph_solves_to_a_checked_schedule() -> None:
    """The POET-size model: a schedule the replay accepts within the budget (solve times: the milp_variants
    benchmark)."""
    with torch.device("meta"):
        from edgetrain.models import resnet18
        model = resnet18()
    graph = capture_graph(model, (8, 3, 224, 224), target=torch.zeros(8, dtype=torch.long))
    tg = training_graph(graph, RPI4)
    keep = simulate_graph_schedule(tg, keep_all_schedule(tg)).peak_bytes
    for fraction in (0.75, 0.6):
        budget = int(tg.resident_bytes + fraction * (keep - tg.resident_bytes))
        result = milp(tg, budget, time_limit_s=60)
        assert result.status in ("optimal", "time_limit")
        check(tg, result, budget)
        assert math.isfinite(result.mip_gap)


def test_the_variants_table_gives_each_milp_variant_with_the_spread_of_its_solves() -> None:
    # Prepare: two variants' rows as operator_milp_times writes them, three solves and one.
    rows = [{"activation_fraction": 0.6, "variant": "no paging", "memory_bps": 2e9, "status": "time_limit",
             "energy_j": 18.0650001, "one_pass_energy_j": 17.567, "mip_gaps": [5e-4, 5.6e-4, 1e-4],
             "statuses": ["time_limit", "optimal", "time_limit"], "energies_j": [18.0650001, 18.065, 18.06],
             "solve_time_spread": {"n": 3, "median": 60.0, "q1": 59.0, "q3": 61.0, "iqr": 2.0, "cov_pct": 2.5}},
            {"activation_fraction": 1.0, "variant": "paging", "memory_bps": None, "status": "optimal",
             "energy_j": 16.3769999999, "one_pass_energy_j": 16.377, "mip_gaps": [0.0],
             "statuses": ["optimal"], "energies_j": [16.377],
             "solve_time_spread": {"n": 1, "median": 0.12, "q1": 0.12, "q3": 0.12, "iqr": 0.0, "cov_pct": None}}]
    # Execute
    table = variants_table(rows).splitlines()
    # Assert: every status seen, the energies' range, the largest gap, no negative zero, the spread by hand.
    assert table[2] == ("| 2 GB/s | 0.60 | no paging | optimal/time_limit | 18.060-18.065 | 0.498 | 5.6e-04 | "
                        "60.00 (IQR 2.00, CoV 2.5%, n=3) |")
    assert table[3] == "| none | 1.00 | paging | optimal | 16.377 | 0.000 | 0.0e+00 | 0.12 (IQR 0.00, CoV -, n=1) |"


def test_plans_that_leave_the_generator_states_out_give_a_minimum_that_counts_them_and_fits() -> None:
    """The MILP and the energy planner plan below the budget by the generator states' reserve: a refusal's
    minimum is the one without states plus that reserve, and a plan at exactly that minimum is made."""
    from edgetrain.planners.energy_plan import plan_energy
    from edgetrain.planners.milp.strategy import plan_milp

    profile = EnergyProfile("x", 1.0, 3.0, 1e-3, 4.0, 0.5, 1e-3, 2.0, 0.8)
    free = paged_back_chain()
    drawing = dataclasses.replace(free, rng_state_bytes=5)   # 3 drawing stages: 3 states and a replay's copy
    assert free.rng_reserve_bytes == 0 and drawing.rng_reserve_bytes == 20
    for planner in (lambda chain, budget: plan_milp(chain, profile, budget, time_limit_s=10),
                    lambda chain, budget: plan_energy(chain, profile, budget, strategy="paging-dp")):
        with pytest.raises(InfeasibleBudgetError) as info:
            planner(free, 0)
        least = info.value.minimum_bytes
        assert least is not None
        planner(free, least)
        with pytest.raises(InfeasibleBudgetError, match="20 bytes of them the generator states'") as info:
            planner(drawing, least + 19)
        assert info.value.minimum_bytes == least + 20 and info.value.budget_bytes == least + 19
        planner(drawing, least + 20)
