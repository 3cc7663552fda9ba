"""The optimizer stepped inside the backward: the chain's accounting, the wrapper's updates and peak."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from steps import peak_tracks
from torch import nn

from edgetrain import Checkpointed
from edgetrain.core.chain import Chain, StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.models.stages import training_stages
from edgetrain.profiling import LiveBytesTracker, profile
from edgetrain.runtime import three_budgets
from edgetrain.runtime.step_in_backward import shared_gradient_bytes


def _three_stage_chain() -> Chain:
    """Two weighted stages whose records keep their outputs, then the loss (sizes chosen to add up by hand)."""
    return Chain(stages=(StageCost("a", 1.0, 1.0, out_bytes=10, saved_bytes=10, param_bytes=100, grad_bytes=100,
                                   output_saved=True),
                         StageCost("b", 1.0, 1.0, out_bytes=10, saved_bytes=10, param_bytes=50, grad_bytes=50,
                                   output_saved=True),
                         StageCost("loss", 1.0, 1.0, out_bytes=4, saved_bytes=4)), input_bytes=8)


def test_the_gradients_of_a_stage_live_only_in_its_backward() -> None:
    # Plain: stage 0's backward runs with stage 1's 50 gradient bytes held: 158 resident + x_1 + δ_1 + 50 + 100.
    # In the backward: 178 + 100; with an update transient of 7 bytes per parameter, 285.
    chain = _three_stage_chain()
    assert simulate(chain, keep_all(3)).peak_bytes == 328
    stepped = chain.with_step_in_backward()
    assert simulate(stepped, keep_all(3)).peak_bytes == 278
    assert stepped.gradients_bytes == 0 and stepped.resident_bytes == chain.resident_bytes
    with_update = replace(chain, optimizer_workspace_bytes=7).with_step_in_backward()
    assert simulate(with_update, keep_all(3)).peak_bytes == 285
    assert with_update.optimizer_workspace_bytes == 0
    # stage b's gradient shared with an earlier stage stays held through stage a's backward: the plain peak again
    assert simulate(chain.with_step_in_backward([0, 50, 0]), keep_all(3)).peak_bytes == 328
    with pytest.raises(ValueError, match="at most its grad_bytes"):
        chain.with_step_in_backward([0, 51, 0])
    with pytest.raises(ValueError, match="already steps"):
        stepped.with_step_in_backward()
    with pytest.raises(ValueError, match="before with_step_in_backward"):
        stepped.with_optimizer("adam")


def test_a_stage_holding_a_shared_weight_pays_its_update_in_its_backward() -> None:
    # Stage a holds the weight (its bytes counted there), stage b makes its gradient (counted there, held until a's
    # backward); a's backward adds its part (50 bytes of workspace) and then runs the update (7 bytes): 228 + 57.
    chain = Chain(stages=(StageCost("a", 1.0, 1.0, out_bytes=10, saved_bytes=10, param_bytes=100,
                                    bwd_workspace_bytes=50, output_saved=True),
                          StageCost("b", 1.0, 1.0, out_bytes=10, saved_bytes=10, grad_bytes=100, output_saved=True),
                          StageCost("loss", 1.0, 1.0, out_bytes=4, saved_bytes=4)),
                  input_bytes=8, optimizer_workspace_bytes=7)
    assert simulate(chain.with_step_in_backward([0, 100, 0]), keep_all(3)).peak_bytes == 285


def _conv_flatten_linear() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))


def _sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _assert_steps_as_one_optimizer(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int,
                                   loop: str = "step") -> None:
    """Three steps of ``Checkpointed(memory=budget, step_in_backward=...)`` against one SGD after plain backprop:
    the same parameters (<= 1e-6 relative), no gradient left, the tracker's peak the prediction (each stage's
    backward measured with its gradients dropped as made: ``profile(step_in_backward=True)``)."""
    reference, mine = copy.deepcopy(model), copy.deepcopy(model)
    optimizer = _sgd(list(reference.parameters()))
    wrapped = Checkpointed(mine, sample=x, target=y, memory=budget, measure_time=False, step_in_backward=_sgd)
    assert all(torch.equal(p, r) for p, r in zip(mine.parameters(), reference.parameters(), strict=True))
    for step in range(3):
        nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with LiveBytesTracker() as tracker:
            tracker.register_training_state(mine, None, x, y)
            tracker.register(t for opt in wrapped.step_optimizers.values() for state in opt.state.values()
                             for t in state.values())
            if loop == "user":
                nn.functional.cross_entropy(wrapped(x), y).backward()
            else:
                wrapped.step_loss(x, y)
        if step > 0:   # the momentum buffers exist from the first step on, as the plan counts them
            assert peak_tracks(tracker.peak_bytes, wrapped.plan.predicted_peak_bytes), (budget, tracker.peak_bytes)
    assert all(p.grad is None for p in mine.parameters())
    for p, r in zip(mine.parameters(), reference.parameters(), strict=True):
        assert ((p - r).abs().max() / r.abs().max()).item() <= 1e-6


@pytest.mark.parametrize("loop", ["step", "user"])
def test_updates_equal_one_optimizer_after_plain_backprop_and_the_peak_holds(loop: str) -> None:
    model, x, y = _conv_flatten_linear()
    chain = profile(model, x, y, measure_time=False)
    budgets = three_budgets(chain.with_step_in_backward())
    assert budgets[0] < three_budgets(chain)[0]
    for budget in budgets:
        _assert_steps_as_one_optimizer(model, x, y, budget, loop)


class _Blocks(nn.Module):
    """Two stages of two Linear layers each, then a head: a stage's backward makes two weights' gradients, one
    after the other, and with the optimizer in the backward the first is dropped before the second is made."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
                                    for _ in range(2))
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def stages(self) -> list[nn.Module]:
        return [*self.blocks, self.head]


def test_a_stage_whose_backward_drops_each_gradient_as_made_is_planned_as_measured() -> None:
    """``profile(step_in_backward=True)`` measures each stage's backward with its gradients dropped as made: a
    block's two layers' gradients (263,168 bytes each with the bias) never meet, which the bound without the
    measurement counts at once; the measured peak is one layer's gradients lower, less at most the two activation
    gradients (4 KiB each) that the engine holds longer there. The tracker's peak is the measured plan's."""
    torch.manual_seed(0)
    model, x, y = _Blocks(), torch.randn(4, 256), torch.randint(0, 10, (4,))
    measured = profile(model, x, y, measure_time=False, step_in_backward=True)
    bound = replace(measured, stages=tuple(replace(s, bwd_stepped_workspace_bytes=None) for s in measured.stages))
    block = measured.stages[0]
    assert block.grad_bytes == 2 * 257 * 256 * 4
    gap = bound.with_step_in_backward().stages[0].bwd_workspace_bytes - \
        measured.with_step_in_backward().stages[0].bwd_workspace_bytes
    layer, activation = 257 * 256 * 4, 4 * 256 * 4
    assert layer - 2 * activation <= gap <= layer
    for budget in three_budgets(measured.with_step_in_backward()):
        _assert_steps_as_one_optimizer(model, x, y, budget)


def test_a_parameter_two_stages_share_is_stepped_once_its_last_part_is_added_and_the_peak_holds() -> None:
    torch.manual_seed(0)
    shared = nn.Linear(16, 16)
    model = nn.Sequential(shared, nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), shared, nn.ReLU(), nn.Linear(16, 10))
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    assert shared_gradient_bytes(training_stages(model)) == [0, 0, 0, 0, 16 * 17 * 4, 0, 0, 0]
    chain = profile(model, x, y, measure_time=False)
    for budget in three_budgets(chain.with_step_in_backward(shared_gradient_bytes(training_stages(model)))):
        _assert_steps_as_one_optimizer(model, x, y, budget)


def test_an_optimizer_of_another_kind_than_planned_is_refused() -> None:
    model, x, y = _conv_flatten_linear()
    with pytest.raises(ValueError, match="builds adam but the plan is for optimizer='sgd'"):
        Checkpointed(model, sample=x, target=y, recompute=1.5, measure_time=False,
                     step_in_backward=lambda ps: torch.optim.Adam(ps))


def test_a_model_wrapped_again_is_stepped_once_per_backward() -> None:
    model, x, y = _conv_flatten_linear()
    reference = copy.deepcopy(model)
    optimizer = _sgd(list(reference.parameters()))
    Checkpointed(model, sample=x, target=y, recompute=1.5, measure_time=False, step_in_backward=_sgd)
    wrapped = Checkpointed(model, sample=x, target=y, recompute=1.5, measure_time=False, step_in_backward=_sgd)
    for _ in range(2):
        wrapped.step_loss(x, y)
        nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for p, r in zip(model.parameters(), reference.parameters(), strict=True):
        assert ((p - r).abs().max() / r.abs().max()).item() <= 1e-6
