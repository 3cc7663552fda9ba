"""A byte budget for torch.compile (runtime/compiled.py, NOTE [ A byte budget for torch.compile ])."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from edgetrain.errors import InfeasibleBudgetError
from edgetrain.profiling import profile
from edgetrain.runtime import compiled as compiled_module
from edgetrain.runtime import three_budgets
from edgetrain.runtime.compiled import CompiledCandidate, fit_compiled, measured_step_peak_bytes, training_step

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _mlp() -> nn.Sequential:
    """Compiles in seconds; bias-free linears before BatchNorm (a bias there has a zero gradient, all rounding)."""
    torch.manual_seed(0)
    def block(width: int) -> nn.Sequential:
        return nn.Sequential(nn.Linear(width, width, bias=False), nn.BatchNorm1d(width), nn.Tanh())
    return nn.Sequential(block(32), block(32), block(32), block(32), nn.Linear(32, 10)).double()


@pytest.mark.slow
def test_the_compiled_step_fits_its_budget_and_gives_autograds_gradients() -> None:
    """In float64: inductor's fused float32 reductions round differently from eager's, ~1e-6 relative on their own.
    The peak is the allocator's records (LiveBytesTracker, a dispatch mode, saw plain training's peak here: the
    compiled step does not run as compiled under it)."""
    model, reference = _mlp(), _mlp()
    x, y = torch.randn(64, 32, dtype=torch.float64), torch.randint(0, 10, (64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    chain = profile(model, x, y, measure_time=False)
    budget = three_budgets(chain)[1]   # below plain training's peak
    before = copy.deepcopy(model.state_dict())

    fit = fit_compiled(model, x, y, budget, optimizer, chain=chain, partitioner_budgets=(1.0, 0.5))

    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())   # search undone
    assert not optimizer.state   # its momentum too
    assert fit.predicted_peak_bytes <= budget and fit.chosen in fit.candidates
    assert len({(c.partitioner_budget, c.regions) for c in fit.candidates}) == len(fit.candidates) >= 3
    nn.functional.cross_entropy(fit.module(x), y).backward()
    nn.functional.cross_entropy(reference(x), y).backward()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None
        assert (mine.grad - theirs.grad).abs().max() <= 1e-6 * theirs.grad.abs().max()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # The module built afresh is the chosen candidate's graph, compiled at its partitioner budget
    step = training_step(fit.module, x, y, optimizer, nn.functional.cross_entropy)
    assert measured_step_peak_bytes(step) == fit.chosen.step_peak_bytes <= budget - chain.between_steps_bytes


def _candidates(monkeypatch: pytest.MonkeyPatch, measured: list[CompiledCandidate]) -> None:
    monkeypatch.setattr(compiled_module, "compiled_candidates", lambda *args, **kwargs: measured)
    monkeypatch.setattr(compiled_module, "build_compiled", lambda model, candidate: model)


def test_the_fastest_candidate_that_fits_is_chosen_and_below_them_all_the_least_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: inductor's graphs at 1.0 (fast, large) and 0.5, and two regions plans; the budget leaves 700 bytes
    model = _mlp()
    x, y = torch.randn(64, 32, dtype=torch.float64), torch.randint(0, 10, (64,))
    chain = profile(model, x, y, measure_time=False)
    measured = [CompiledCandidate(1.0, None, 900, 0.010), CompiledCandidate(0.5, None, 700, 0.013),
                CompiledCandidate(1.0, "SR...", 650, 0.012), CompiledCandidate(1.0, "SRR..", 500, 0.020)]
    _candidates(monkeypatch, measured)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # Execute and assert: of those within 700 bytes the fastest, the regions plan SR...
    fit = fit_compiled(model, x, y, chain.between_steps_bytes + 700, optimizer, chain=chain)
    assert fit.chosen == measured[2] and fit.predicted_peak_bytes == chain.between_steps_bytes + 650
    # A budget at 700 exactly still takes inductor's 0.5 graph over the slower SRR..
    _candidates(monkeypatch, measured[:2] + measured[3:])
    assert fit_compiled(model, x, y, chain.between_steps_bytes + 700, optimizer, chain=chain).chosen == measured[1]
    # Below every candidate: one line naming the least total measured
    with pytest.raises(InfeasibleBudgetError, match=re.escape("regions SRR.. at partitioner budget 1.0")) as error:
        fit_compiled(model, x, y, chain.between_steps_bytes + 499, optimizer, chain=chain)
    assert error.value.minimum_bytes == chain.between_steps_bytes + 500
