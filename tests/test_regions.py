"""Single-level plans run as ``torch.utils.checkpoint`` regions (runtime/regions.py), compiled whole or not."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from benchmarks import compile_budget as bench
from edgetrain.core.simulator import simulate
from edgetrain.models import stages_of
from edgetrain.planners.single_level import GOES_ON, KEPT, STARTS, single_level, single_level_plan
from edgetrain.profiling import profile
from edgetrain.profiling.tracker import LiveBytesTracker
from edgetrain.runtime import three_budgets
from edgetrain.runtime.regions import Regions


def tiny_cnn() -> nn.Sequential:
    """Convolutions without bias: a bias before batch norm has a zero gradient, all rounding, in any relative check."""
    def block(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())
    return nn.Sequential(block(3, 8), block(8, 8), block(8, 8), block(8, 8),
                         nn.Flatten(), nn.Linear(8 * 16 * 16, 10))


def tiny_mlp() -> nn.Sequential:
    """Compiles in seconds where the CNN takes a minute on a cold inductor cache."""
    def block(width: int) -> nn.Sequential:
        return nn.Sequential(nn.Linear(width, width, bias=False), nn.BatchNorm1d(width), nn.Tanh())
    return nn.Sequential(block(32), block(32), block(32), block(32), nn.Linear(32, 10))


def case(model_fn: Callable[[], nn.Sequential] = tiny_cnn, input_shape: tuple[int, ...] = (4, 3, 16, 16),
         dtype: torch.dtype = torch.float32) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor, list[int], int]:
    """A fresh model, a batch, and a plan at the middle budget with a region that recomputes, and its predicted peak."""
    torch.manual_seed(0)
    model, x = model_fn().to(dtype), torch.randn(*input_shape, dtype=dtype)
    y = torch.randint(0, 10, (input_shape[0],))
    kinds, predicted_bytes = planned(model_fn, input_shape, dtype)
    return model, x, y, list(kinds), predicted_bytes


@functools.cache
def planned(model_fn: Callable[[], nn.Sequential], input_shape: tuple[int, ...],
            dtype: torch.dtype) -> tuple[tuple[int, ...], int]:
    """The plan of :func:`case`, made once per model (profiling and the search take seconds)."""
    torch.manual_seed(0)
    model, x = model_fn().to(dtype), torch.randn(*input_shape, dtype=dtype)
    chain = profile(model, x, torch.randint(0, 10, (input_shape[0],)), measure_time=False)
    kinds = single_level_plan(chain, three_budgets(chain)[1])
    assert STARTS in kinds
    return tuple(kinds), simulate(chain, single_level(kinds)).peak_bytes


def gradient_error(model: nn.Module, regions: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    reference = copy.deepcopy(model)
    nn.functional.cross_entropy(reference(x), y).backward()
    nn.functional.cross_entropy(regions(x), y).backward()
    return max(((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()   # type: ignore[operator,union-attr]
               for p, r in zip(model.parameters(), reference.parameters(), strict=True))


def test_regions_group_a_plan_into_checkpointed_and_plain_runs() -> None:
    regions = Regions([nn.Identity()] * 6, [KEPT, KEPT, STARTS, GOES_ON, STARTS, KEPT])
    assert regions.ranges == [(0, 2, False), (2, 4, True), (4, 5, True), (5, 6, False)]


def test_uncompiled_regions_hold_at_most_the_predicted_peak() -> None:
    """Here a region opening at a ReLU (which saves only its output) would hold one activation more than
    predicted: torch's checkpoint keeps the region's input through its backward. Regions open elsewhere."""
    model, x, y, kinds, predicted_bytes = case()
    regions = Regions(stages_of(model), kinds[:-1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    nn.functional.cross_entropy(regions(x), y).backward()
    optimizer.step()   # momentum buffers exist from here, as the chain's resident bytes count them
    optimizer.zero_grad(set_to_none=True)
    with LiveBytesTracker() as tracker:
        tracker.register_training_state(model, optimizer, x, y)
        nn.functional.cross_entropy(regions(x), y).backward()
        optimizer.step()
    assert tracker.peak_bytes <= predicted_bytes


def test_uncompiled_regions_give_plain_autograd_gradients() -> None:
    model, x, y, kinds, _ = case()
    assert gradient_error(model, Regions(stages_of(model), kinds[:-1]), x, y) == 0.0   # the very same ops


@pytest.mark.slow   # ~30 s on a cold inductor cache; the default run checks the same regions uncompiled
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("partitioner_budget", [1.0, 0.5])
def test_regions_compiled_whole_give_plain_autograd_gradients(partitioner_budget: float) -> None:
    """In float64: inductor's fused float32 reductions round differently from eager's, ~1e-6 relative on their own.
    At a partitioner budget below 1 inductor also recomputes what lies outside the regions."""
    import torch._functorch.config as functorch_config
    model, x, y, kinds, _ = case(tiny_mlp, (64, 32), torch.float64)   # at 16 rows the gradients held at the
    # last BatchNorm backward, with its scratch, are the peak of every plan
    torch._dynamo.reset()  # else the other budget's compiled code is reused: the budget is not in dynamo's guards
    compiled = torch.compile(Regions(stages_of(model), kinds[:-1]))
    with functorch_config.patch(activation_memory_budget=partitioner_budget):
        assert gradient_error(model, compiled, x, y) <= 1e-6


def _row(setting: str, mib: float, cpu_ratio: float, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "setting": setting, "step_tensor_peak_mib": mib, "step_cpu_time_ratio": cpu_ratio, **extra}


def test_a_regions_row_that_keeps_every_stage_at_the_levels_budget_is_the_same_graph_not_a_win() -> None:
    # Prepare: inductor at 1.0 and 0.5; regions at b=0.5 that keep every stage (inductor 0.5's own graph, timed a
    # hair faster), and regions at b=1.0 that recompute two stages, under 1.0's peak.
    rows = [_row("inductor:1.0", 100.0, 0.9), _row("inductor:0.5", 70.0, 0.8),
            _row("edgetrain:least", 50.0, 1.5),
            _row("edgetrain+regions@0.5=inductor:0.5", 70.0, 0.79, partitioner_budget=0.5,
                 single_level_kinds="....."),
            _row("edgetrain+regions@1.0=inductor:1.0", 90.0, 0.75, partitioner_budget=1.0,
                 single_level_kinds="SR..."),
            _row("edgetrain+regions=inductor:0.5", 60.0, 1.2, single_level_kinds="S.S..")]   # b=1.0 by default
    # Execute
    with_regions = {v["inductor"]: v for v in bench.verdicts(rows)}
    without = {v["inductor"]: v for v in bench.verdicts(rows, with_regions=False)}
    # Assert: at 0.5 the pick is inductor's graph, a tie; at 1.0 regions at b=1.0 win; the floor is the least peak
    # of edgetrain:least and the regions rows; without the regions rows only edgetrain:least fits.
    assert with_regions["inductor:0.5"]["same_graph"]
    assert with_regions["inductor:0.5"]["edgetrain"] == "b=0.5, no regions (inductor:0.5's graph)"
    assert with_regions["inductor:1.0"]["edgetrain"] == "b=1.0, regions SR..." and with_regions["inductor:1.0"][
        "no_slower"] and not with_regions["inductor:1.0"]["same_graph"]
    assert with_regions["floor"]["edgetrain_mib"] == 50.0 and with_regions["floor"]["below_floor"]
    assert not with_regions["floor"]["at_floor"]
    assert [without[level]["edgetrain"] for level in ("inductor:1.0", "inductor:0.5")] == ["edgetrain:least"] * 2
    assert not without["inductor:0.5"]["same_graph"]


@pytest.mark.parametrize(("least_mib", "below", "at"), [(69.0, True, False), (69.9, False, True), (70.3, False, True),
                                                          (70.4, False, False)])
def test_a_least_peak_within_half_a_percent_of_inductors_floor_is_a_tie_not_a_win(
        least_mib: float, below: bool, at: bool) -> None:
    rows = [_row("inductor:1.0", 100.0, 0.9), _row("inductor:0.5", 70.0, 0.8), _row("edgetrain:least", least_mib, 1.5)]
    floor = {v["inductor"]: v for v in bench.verdicts(rows)}["floor"]
    assert (floor["below_floor"], floor["at_floor"]) == (below, at)


def test_rows_with_the_optimizer_in_the_backward_are_judged_against_inductors_rows_of_that_contract_only() -> None:
    # Prepare: a whole-step pair (edgetrain's least 10.8 against inductor's 9.7) and an in-backward pair (edgetrain
    # 6.0 against inductor's 9.7: inductor's compiled backward makes every gradient before any hook runs)
    rows = [_row("inductor:1.0", 9.7, 0.8), _row("edgetrain:least", 10.8, 1.3),
            _row("inductor+step_in_backward:1.0", 9.7, 0.8), _row("edgetrain+step_in_backward:least", 6.0, 1.3)]
    # Execute
    by_level = {v["inductor"]: v for v in bench.verdicts(rows)}
    table = "\n".join(bench.verdict_table(bench.verdicts(rows)))
    # Assert: each floor from its own contract's rows; the whole-step level is not met by the in-backward row
    assert by_level["floor"]["edgetrain"] == "edgetrain:least" and not by_level["floor"]["below_floor"]
    assert by_level["floor+step_in_backward"]["edgetrain"] == "edgetrain+step_in_backward:least"
    assert by_level["floor+step_in_backward"]["below_floor"]
    assert by_level["inductor:1.0"]["edgetrain"] is None
    assert by_level["inductor+step_in_backward:1.0"]["edgetrain"] == "edgetrain+step_in_backward:least"
    assert "| least of any budget (step_in_backward) | 9.7 |" in table


def test_the_claims_count_the_models_no_slower_at_every_level_and_below_the_floor() -> None:
    # Prepare: model a, no slower at both levels and below the floor; model b slower at 1.0 and at its floor within
    # half a percent; b's in-backward pair below inductor's floor of that contract.
    rows = [_row("inductor:1.0", 100.0, 0.9), _row("inductor:0.5", 70.0, 0.8), _row("edgetrain:least", 50.0, 0.7),
            *({**row, "model": "b"} for row in (
                _row("inductor:1.0", 10.0, 0.9), _row("edgetrain:least", 9.97, 1.5),
                _row("inductor+step_in_backward:1.0", 10.0, 0.9), _row("edgetrain+step_in_backward:least", 6.0, 1.6)))]
    # Execute
    claims = bench.claims(rows)
    # Assert
    assert claims == [
        "* At every level inductor reached, edgetrain is no slower on **1 of 2** model(s) (0 of the 3 levels a tie: "
        "`fit_compiled` took inductor's own graph at that level).",
        "* Below inductor's floor (the least any of its budgets reached) edgetrain trains with a whole step on "
        "**1 of 2**; at it (a tie) on 1.",
        "* With the optimizer stepped in the backward, below inductor's floor of that contract on **1 of 1**."]


def test_a_compiled_row_names_inductors_graph_at_another_budget_and_its_regions_win_as_regions() -> None:
    # Prepare: edgetrain+compiled at inductor 0.5's level took inductor's own graph at 0.0 (lower and faster
    # here); at 1.0's level it took regions.
    rows = [_row("inductor:1.0", 100.0, 0.9), _row("inductor:0.5", 70.0, 0.8),
            _row("edgetrain+compiled=inductor:0.5", 65.0, 0.78, partitioner_budget=0.0, single_level_kinds="....."),
            _row("edgetrain+compiled=inductor:1.0", 90.0, 0.75, partitioner_budget=1.0, single_level_kinds="SR...")]
    # Execute
    by_level = {v["inductor"]: v for v in bench.verdicts(rows)}
    table = "\n".join(bench.verdict_table(bench.verdicts(rows)))
    # Assert: not the same graph as the level's, but inductor's own, and the table says so; regions are edgetrain's
    assert by_level["inductor:0.5"]["inductor_graph"] and not by_level["inductor:0.5"]["same_graph"]
    assert by_level["inductor:0.5"]["edgetrain"] == "b=0.0, no regions (inductor:0.0's graph)"
    assert "no slower: inductor's own graph at another budget" in table
    assert not by_level["inductor:1.0"]["inductor_graph"] and by_level["inductor:1.0"]["no_slower"]
    assert by_level["floor"]["edgetrain_mib"] == 65.0   # the compiled rows count for the floor too
    assert [bench.whole_graph(row) for row in rows] == [False, False, True, True]


def test_a_row_whose_rounds_took_inductors_graphs_at_different_budgets_is_named_round_by_round() -> None:
    rows = [_row("inductor:0.5", 70.0, 0.8),
            _row("edgetrain+compiled=inductor:0.5", 70.0, 0.8, partitioner_budget=0.5, single_level_kinds=".....",
                 single_level_kinds_by_round=[".....", "....."], partitioner_budget_by_round=[0.0, 0.5])]
    verdict = bench.verdicts(rows)[0]
    assert verdict["edgetrain"] == ("by round: b=0.0, no regions (inductor:0.0's graph); "
                                    "b=0.5, no regions (inductor:0.5's graph)")
    assert verdict["inductor_graph"] and not verdict["same_graph"]   # round 1 ran another budget's graph
