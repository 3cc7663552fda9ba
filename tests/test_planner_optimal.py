"""Tests of the optimal (dynamic-programming) planner.

The simulator is the oracle throughout: every rebuilt schedule is simulated and must meet
its budget with the time the table predicted. Beyond that, the table is checked against
four things that share no code with it: its own pure-Python reference, Griewank's closed
form on chains where his model is exact, the uniform planner's schedules (dominance), and an
exhaustive search over simulator states on tiny chains.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.core.chain import Chain, StageCost
from edgetrain.core.schedule import Backward, Forward, Keep, Op, Schedule, keep_all
from edgetrain.core.simulator import simulate, validate
from edgetrain.errors import InfeasibleBudgetError
from edgetrain.planners.dp import grid as dp_grid
from edgetrain.planners.dp.exact import exact_minimum_bytes
from edgetrain.planners.dp.optimal import OptimalTable, optimal, solve
from edgetrain.planners.revolve import revolve, revolve_advances
from edgetrain.planners.uniform import uniform


def random_chain(rng: random.Random, length: int, *, scale_bytes: int = 1, flags: bool = True) -> Chain:
    """A heterogeneous chain: times, sizes, workspaces, gradients and record flags all vary.

    ``saved_bytes`` includes the output, as the profiler measures it; the backward workspace
    may be negative (autograd frees saved tensors while it runs).
    """
    stages = []
    for i in range(length):
        out = rng.randint(1, 6)
        stages.append(StageCost(
            name=f"s{i}", fwd_time_s=rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]),
            bwd_time_s=rng.choice([0.5, 1.0, 2.0, 3.0, 4.5]), out_bytes=out * scale_bytes,
            saved_bytes=(out + rng.randint(0, 6)) * scale_bytes, grad_bytes=rng.choice([0, 0, 1, 2, 3]) * scale_bytes,
            fwd_workspace_bytes=rng.choice([0, 0, 1, 2]) * scale_bytes,
            rec_workspace_bytes=rng.choice([0, 0, 1, 3]) * scale_bytes,
            bwd_workspace_bytes=rng.choice([0, 0, 1, 2, -1, -3]) * scale_bytes,
            input_saved=not flags or rng.random() < 0.7, output_saved=not flags or rng.random() < 0.7))
    return Chain(tuple(stages), input_bytes=rng.randint(1, 4) * scale_bytes, buffer_bytes=rng.randint(0, 3),
                 optimizer_workspace_bytes=rng.choice([0, 0, 2, 5]) * scale_bytes)


def keep_all_peak(chain: Chain) -> int:
    return simulate(chain, keep_all(chain.length)).peak_bytes


def exact_table(chain: Chain, max_memory_bytes: int) -> OptimalTable:
    """A table whose unit is the sizes' common divisor (small integer chains): no rounding."""
    table = solve(chain, max_memory_bytes, slots=max_memory_bytes + 1)
    assert table.unit_bytes == dp_grid.common_unit_bytes(chain)
    return table


# --- (1) rebuilt schedules are valid, within budget, and take the predicted time ------------------

@st.composite
def chains_and_budgets(draw: st.DrawFn) -> tuple[Chain, float, int]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    chain = random_chain(rng, draw(st.integers(1, 14)), scale_bytes=draw(st.sampled_from([1, 1000, 4099])))
    return chain, draw(st.floats(0.0, 1.0)), draw(st.sampled_from([60, 137, 500]))


@settings(max_examples=150, deadline=None)
@given(case=chains_and_budgets())
def test_rebuilt_schedule_meets_budget_in_predicted_time(case: tuple[Chain, float, int]) -> None:
    chain, fraction, slots = case
    top = 2 * keep_all_peak(chain)   # room for the rounding slack (see the uniform tests below)
    table = solve(chain, top, slots=slots)
    budget = table.min_memory_bytes + int(fraction * (top - table.min_memory_bytes))

    schedule = table.schedule(budget)
    stats = simulate(chain, schedule)

    assert stats.peak_bytes <= budget
    assert stats.time_s == pytest.approx(table.time_s(budget), rel=1e-9)
    assert schedule.strategy == "optimal"
    assert schedule.params == {"slots": slots, "budget_bytes": budget, "unit_bytes": table.unit_bytes}


@pytest.mark.parametrize("seed", range(20))
def test_exact_grid_is_tight_at_the_minimum(seed: int) -> None:
    """With exact units the accounting is not just safe but exact: the least budget is reached."""
    chain = random_chain(random.Random(seed), 1 + seed % 9)
    table = exact_table(chain, keep_all_peak(chain))

    stats = simulate(chain, table.schedule(table.min_memory_bytes))

    assert stats.peak_bytes == table.min_memory_bytes
    assert table.min_memory_bytes == exact_minimum_bytes(chain)


def test_optimal_is_solve_then_rebuild() -> None:
    chain = random_chain(random.Random(5), 9, scale_bytes=1000)
    budget = (keep_all_peak(chain) + solve(chain, keep_all_peak(chain)).min_memory_bytes) // 2

    assert optimal(chain, budget).ops == solve(chain, budget).schedule(budget).ops


def test_long_chain_in_few_slots() -> None:
    """The rebuild walks an explicit stack; a 300-stage chain in 12 bytes nests deep."""
    chain = Chain.uniform(300)
    schedule = optimal(chain, 12, slots=12)

    stats = simulate(chain, schedule)

    assert stats.peak_bytes <= 12
    assert stats.backward_count == 300


# --- (2) the reference and the fast solver fill identical tables ---------------------------------

@pytest.mark.parametrize("seed", range(25))
def test_reference_and_fast_tables_are_identical(seed: int) -> None:
    rng = random.Random(1000 + seed)
    chain = random_chain(rng, rng.randint(1, 7), scale_bytes=rng.choice([1, 997]))
    grid = dp_grid.without_paging(
        dp_grid.discretise(chain, keep_all_peak(chain) - chain.resident_bytes, rng.choice([5, 23, 64])))

    fast_cost_s, fast_choice = dp_grid.solve_fast(grid)
    reference_cost_s, reference_choice = dp_grid.solve_reference(grid)

    np.testing.assert_array_equal(fast_cost_s, reference_cost_s)
    np.testing.assert_array_equal(fast_choice, reference_choice)
    assert np.isfinite(fast_cost_s).any()


# --- (3) Griewank's closed form ------------------------------------------------------------------

def griewank_chain(length: int) -> Chain:
    """Unit steps whose records are so large that two never fit together, plus a free loss stage.

    That is Griewank's model: a tape holds one step. The zero-size loss stage matters:
    edgetrain's loss seeds its own gradient (``δ_L`` costs nothing), which would otherwise
    let the first reversal hold one more checkpoint than Revolve counts.
    """
    record_bytes = length + 10
    body = [StageCost(f"layer{i}", 1.0, 1.0, out_bytes=1, saved_bytes=record_bytes) for i in range(length)]
    return Chain((*body, StageCost("loss", 0.0, 0.0, out_bytes=0, saved_bytes=0)), input_bytes=1)


def revolve_with_loss(length: int, slots: int) -> Schedule:
    """Revolve's schedule on the body of :func:`griewank_chain`, the loss taped with the last step."""
    ops: list[Op] = []
    for op in revolve(Chain.uniform(length), slots).ops:
        ops.append(op)
        if op == Forward(length - 1, Keep.ALL):
            ops += [Forward(length, Keep.ALL), Backward(length)]
    return Schedule(tuple(ops), length + 1)


@pytest.mark.parametrize(("length", "slots"), [(n, s) for n in range(1, 17) for s in range(1, n + 1)])
def test_griewank_chain_matches_revolve_closed_form(length: int, slots: int) -> None:
    """At Revolve's simulated peak the DP takes exactly ``2l + t(l, s)``, and not a byte less suffices."""
    chain = griewank_chain(length)
    peak = simulate(chain, revolve_with_loss(length, slots)).peak_bytes
    table = exact_table(chain, peak)
    best_s = 2 * length + revolve_advances(length, slots)

    assert table.time_s(peak) == best_s
    if peak - 1 >= table.min_memory_bytes:
        assert table.time_s(peak - 1) > best_s


@pytest.mark.parametrize(("length", "slots"), [(n, s) for n in (2, 5, 8, 13, 21) for s in range(1, n + 1)])
def test_uniform_chain_never_slower_than_revolve(length: int, slots: int) -> None:
    """On ``Chain.uniform`` a record costs no more than a checkpoint and ``δ_L``/``x_0`` are free,
    so the DP may beat Revolve; it must never lose to it."""
    chain = Chain.uniform(length)
    stats = simulate(chain, revolve(chain, slots))

    assert exact_table(chain, stats.peak_bytes).time_s(stats.peak_bytes) <= stats.time_s


def test_uniform_chain_beats_revolve_by_hand() -> None:
    """``Chain.uniform(8)`` in 5 bytes: Revolve with one slot holds ``x_i``, its record and two
    gradients (4 bytes above ``x_0``) and needs ``16 + 28`` time units. The DP in the same memory
    records the last two stages together (``δ_8`` is free) and the first two (``x_0`` and ``δ_0``
    are free): 20 advances, 36 time units."""
    chain = Chain.uniform(8)
    assert simulate(chain, revolve(chain, 1)).peak_bytes == 5
    table = solve(chain, 5)

    ops = table.schedule(5).ops

    assert table.time_s(5) == 36.0
    assert ops[:8] == (Forward(0, Keep.INPUT), *(Forward(i) for i in range(1, 6)), Forward(6, Keep.ALL),
                       Forward(7, Keep.ALL))
    assert ops[-4:] == (Forward(0, Keep.ALL), Forward(1, Keep.ALL), Backward(1), Backward(0))


# --- (4) never slower than uniform segments -------------------------------------------------------

@pytest.mark.parametrize(("length", "segments"), [(n, s) for n in (1, 4, 9, 16, 30) for s in range(1, n + 1)])
def test_never_slower_than_uniform_on_uniform_chains(length: int, segments: int) -> None:
    chain = Chain.uniform(length)
    stats = simulate(chain, uniform(chain, segments))

    assert exact_table(chain, stats.peak_bytes).time_s(stats.peak_bytes) <= stats.time_s


@pytest.mark.parametrize("seed", range(12))
def test_never_slower_than_uniform_given_rounding_slack(seed: int) -> None:
    """Rounding slack: a schedule nests at most ``L - 1`` deep and each level hands its child one
    rounded-up amount, plus one rounded local peak, so it is charged under ``L`` units more than
    its bytes: the table finds it at any budget ``L * unit_bytes`` above its peak."""
    rng = random.Random(2000 + seed)
    chain = random_chain(rng, rng.randint(6, 24), scale_bytes=rng.choice([1009, 65537]))
    table = solve(chain, 2 * keep_all_peak(chain))
    slack = chain.length * table.unit_bytes

    for segments in range(1, chain.length + 1):
        stats = simulate(chain, uniform(chain, segments))
        assert table.time_s(stats.peak_bytes + slack) <= stats.time_s * (1 + 1e-12)


# --- (5) monotonic in the budget -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_time_never_increases_with_budget(seed: int) -> None:
    rng = random.Random(3000 + seed)
    chain = random_chain(rng, rng.randint(2, 30), scale_bytes=rng.choice([1, 4096]))
    table = solve(chain, keep_all_peak(chain), slots=300)
    budgets = np.linspace(table.min_memory_bytes, keep_all_peak(chain), 200).astype(int)

    times = [table.time_s(int(b)) for b in budgets]

    assert all(later <= earlier for earlier, later in itertools.pairwise(times))
    assert times[-1] == pytest.approx(chain.compute_time_s)   # plain backprop fits at its own peak


# --- (6) infeasible budgets ------------------------------------------------------------------------

def test_budget_below_table_minimum_raises_with_it() -> None:
    chain = random_chain(random.Random(7), 12, scale_bytes=1000)
    table = solve(chain, keep_all_peak(chain))

    with pytest.raises(InfeasibleBudgetError) as info:
        table.schedule(table.min_memory_bytes - 1)

    assert info.value.minimum_bytes == table.min_memory_bytes
    assert info.value.budget_bytes == table.min_memory_bytes - 1
    validate(chain, table.schedule(table.min_memory_bytes))


@pytest.mark.parametrize("seed", range(8))
def test_budget_below_exact_minimum_raises_with_it(seed: int) -> None:
    chain = random_chain(random.Random(4000 + seed), 10)
    minimum = exact_table(chain, keep_all_peak(chain)).min_memory_bytes

    with pytest.raises(InfeasibleBudgetError) as info:
        optimal(chain, minimum - 1)

    assert info.value.minimum_bytes == minimum
    assert simulate(chain, optimal(chain, minimum)).peak_bytes == minimum


def test_budget_below_resident_memory_raises() -> None:
    chain = replace(Chain.uniform(4, param_bytes=10), name="weights")

    with pytest.raises(InfeasibleBudgetError) as info:
        optimal(chain, chain.resident_bytes - 1)

    assert info.value.minimum_bytes == exact_table(chain, 200).min_memory_bytes


def test_optimizer_step_sets_the_minimum() -> None:
    """Adam's step needs every gradient plus two parameter-sized temporaries at once."""
    chain = replace(Chain.uniform(6, param_bytes=4), optimizer_workspace_bytes=40)
    step_bytes = chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes

    table = solve(chain, step_bytes + 10)

    assert table.min_memory_bytes == step_bytes
    with pytest.raises(InfeasibleBudgetError) as info:
        optimal(chain, step_bytes - 1)
    assert info.value.minimum_bytes == step_bytes


def test_budget_lost_to_rounding_says_so() -> None:
    """Just above the exact minimum a coarse grid may find nothing; the error says what to change."""
    chain = random_chain(random.Random(11), 20, scale_bytes=1009)
    minimum = exact_minimum_bytes(chain)

    with pytest.raises(InfeasibleBudgetError, match="slots >=") as info:
        optimal(chain, minimum, slots=25)

    assert info.value.minimum_bytes == minimum


def test_budget_above_the_table_is_refused() -> None:
    table = solve(Chain.uniform(5), 12)

    with pytest.raises(ValueError, match="above the table's maximum"):
        table.schedule(13)


# --- (7) exhaustive search on tiny chains ----------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """A simulator state (``simulator.SimState``) plus the value the last op produced."""

    held: frozenset[int]
    recorded: frozenset[int]
    delta: int | None
    grads_bytes: int
    last_output: int


class Search:
    """Least-time schedule within a budget by Dijkstra over simulator states (Forward/Backward only).

    It re-implements the simulator's accounting independently; every schedule it returns is
    replayed through :func:`simulate`. ``in_order_persistent`` keeps to the DP's class: a
    ``Forward(i, none)`` only continues an advance (``x_i`` was just produced), never releases
    a checkpoint kept from earlier; and stage ``i`` is never recorded while ``i+1`` is recorded
    and waiting for its backward.
    """

    def __init__(self, chain: Chain, *, in_order_persistent: bool) -> None:
        self.chain, self.restricted = chain, in_order_persistent
        self.values, self.stages = chain.value_bytes, chain.stages

    def covered(self, value: int, recorded: frozenset[int]) -> bool:
        return (value - 1) in recorded and self.stages[value - 1].output_saved

    def memory(self, node: Node) -> int:
        chain, recorded = self.chain, node.recorded
        total = chain.weights_bytes + chain.optimizer_state_bytes + node.grads_bytes
        total += sum(self.stages[i].saved_bytes - (0 if self.stages[i].output_saved else self.values[i + 1])
                     for i in recorded)
        for k in range(chain.length + 1):
            pinned = k in recorded and self.stages[k].input_saved
            if (k in node.held or pinned or self.covered(k, recorded)) and not self.covered(k, recorded):
                total += self.values[k]
        if node.delta is not None and node.delta < chain.length:
            total += self.values[node.delta]
        return total

    def moves(self, node: Node) -> list[tuple[Op, int, float, Node]]:
        """``(op, peak while it runs, time, next node)`` for every op the simulator accepts."""
        out, before = [], self.memory(node)
        next_backward = -1 if node.delta is None else node.delta - 1
        chain_length = self.chain.length
        for i in range(next_backward + 1):
            if i in node.recorded or not (i in node.held or self.covered(i, node.recorded)):
                continue
            stage = self.stages[i]
            for keep in Keep:
                if self.restricted and keep is Keep.NONE and i > 0 and node.last_output != i:
                    continue
                if self.restricted and keep is Keep.ALL and (i + 1) in node.recorded:
                    continue
                output_dead = node.delta is not None and i + 1 == node.delta < chain_length  # stage i+1 done
                held = set(node.held) | (set() if output_dead else {i + 1})
                if keep is not Keep.INPUT and i > 0:
                    held.discard(i)
                recorded = node.recorded | {i} if keep is Keep.ALL else node.recorded
                extra = stage.saved_bytes + stage.rec_workspace_bytes if keep is Keep.ALL else (
                    self.values[i + 1] + stage.fwd_workspace_bytes)
                after = Node(frozenset(held), recorded, node.delta, node.grads_bytes, i + 1)
                out.append((Forward(i, keep), max(before + extra, self.memory(after)), stage.fwd_time_s, after))
        if next_backward in node.recorded:
            i, stage = next_backward, self.stages[next_backward]
            held = set(node.held) - {i + 1, i if i > 0 else -1}
            after = Node(frozenset(held), node.recorded - {i}, i if i > 0 else None,
                         node.grads_bytes + stage.grad_bytes, -1)
            peak = before + (self.values[i] if i > 0 else 0) + stage.grad_bytes + stage.bwd_workspace_bytes
            out.append((Backward(i), max(peak, self.memory(after)), stage.bwd_time_s, after))
        return out

    def best(self, budget_bytes: int) -> tuple[float, tuple[Op, ...]] | None:
        chain = self.chain
        start = Node(frozenset({0}), frozenset(), chain.length, 0, -1)
        step_bytes = chain.resident_bytes + chain.gradients_bytes + chain.optimizer_workspace_bytes
        if self.memory(start) > budget_bytes or step_bytes > budget_bytes:
            return None
        best_s, parent = {start: 0.0}, {}
        queue, tie = [(0.0, 0, start)], itertools.count(1)
        while queue:
            time_s, _, node = heapq.heappop(queue)
            if time_s > best_s[node]:
                continue
            if node.delta is None:
                ops = []
                while node in parent:
                    node, op = parent[node]
                    ops.append(op)
                return time_s, tuple(reversed(ops))
            for op, peak, op_time_s, after in self.moves(node):
                if peak <= budget_bytes and time_s + op_time_s < best_s.get(after, math.inf):
                    best_s[after], parent[after] = time_s + op_time_s, (node, op)
                    heapq.heappush(queue, (time_s + op_time_s, next(tie), after))
        return None


def table_time(table: OptimalTable, budget: int) -> float | None:
    try:
        return table.time_s(budget)
    except InfeasibleBudgetError:
        return None


@pytest.mark.parametrize("seed", range(30))
def test_dp_is_exhaustively_optimal_among_in_order_persistent_schedules(seed: int) -> None:
    rng = random.Random(5000 + seed)
    chain = random_chain(rng, rng.randint(1, 4))
    top = keep_all_peak(chain)
    table = exact_table(chain, top)
    search = Search(chain, in_order_persistent=True)

    for budget in range(chain.resident_bytes, top + 1):
        found = search.best(budget)
        if found is None:
            assert table_time(table, budget) is None
            continue
        stats = simulate(chain, Schedule(found[1], chain.length))
        assert stats.peak_bytes <= budget and stats.time_s == pytest.approx(found[0])
        assert table_time(table, budget) == pytest.approx(found[0], rel=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_dp_never_beats_the_unrestricted_search(seed: int) -> None:
    """A DP time below the exhaustive optimum would mean one of them mis-accounts memory."""
    rng = random.Random(6000 + seed)
    chain = random_chain(rng, rng.randint(1, 4))
    top = keep_all_peak(chain)
    table = exact_table(chain, top)
    search = Search(chain, in_order_persistent=False)

    for budget in range(table.min_memory_bytes, top + 1):
        found = search.best(budget)
        assert found is not None
        assert table.time_s(budget) >= found[0] - 1e-9


def test_known_gap_releasing_a_checkpoint_by_advancing_from_it() -> None:
    """Outside the DP's class: ``F0n F1i F2n F3a B3 F1n F2a B2 F0a F1a B1 B0`` keeps the small
    ``x_1`` (2 bytes) instead of ``x_2`` (4 bytes) through the backward of stage 3, then advances
    ``x_1 -> x_2`` with ``keep="none"``, which releases ``x_1``, and later rebuilds it from ``x_0``.
    It takes 17 time units in 16 bytes; the best persistent schedule takes 18."""
    sizes = [(1.0, 2, 4), (1.0, 4, 4), (2.0, 3, 3), (2.0, 4, 7)]   # (fwd = bwd time, out, saved)
    chain = Chain(tuple(StageCost(f"s{i}", t, t, out, saved) for i, (t, out, saved) in enumerate(sizes)),
                  input_bytes=1)

    unrestricted = Search(chain, in_order_persistent=False).best(16)
    restricted = Search(chain, in_order_persistent=True).best(16)

    assert unrestricted is not None and restricted is not None
    assert unrestricted[0] == 17.0
    assert restricted[0] == 18.0 == exact_table(chain, 16).time_s(16)
