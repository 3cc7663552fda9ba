"""``Checkpointed(compile_stages=True)``: a plan made and run on inductor-compiled stages (NOTE [ Compiled stages ])."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgetrain.runtime import Checkpointed, three_budgets
from edgetrain.runtime.checkpointed import compiled_stages
from edgetrain.stages import training_stages

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 10))


def test_a_recomputing_plan_on_compiled_stages_trains_as_the_compiled_stages_do_under_autograd() -> None:
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    model, reference = _mlp(), _mlp()
    chain = Checkpointed(model, sample=x, target=y, recompute=1.0, compile_stages=True).chain
    wrapped = Checkpointed(model, sample=x, target=y, memory=three_budgets(chain)[0], chain=chain, compile_stages=True)
    assert all(isinstance(stage, torch._dynamo.eval_frame.OptimizedModule) for stage in wrapped._stages[:-1])
    assert wrapped.plan.recompute_factor > 1.0   # the least budget recomputes

    wrapped.step_loss(x, y)
    value = x
    for stage in compiled_stages(training_stages(reference))[:-1]:
        value = stage(value)
    nn.functional.cross_entropy(value, y).backward()

    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None, name
        assert (mine.grad - theirs.grad).abs().max() <= 1e-6 * theirs.grad.abs().max(), name
    # BatchNorm ran its statistics once per step, as autograd's single forward does
    assert torch.equal(model[1].num_batches_tracked, reference[1].num_batches_tracked)
    assert torch.allclose(model[1].running_mean, reference[1].running_mean, rtol=1e-6, atol=1e-7)
    assert torch.allclose(model[1].running_var, reference[1].running_var, rtol=1e-6, atol=1e-7)


def test_compiled_stages_leave_the_loss_stage_eager_and_raise_the_recompile_limit() -> None:
    import torch._dynamo.config as dynamo_config

    stages = training_stages(_mlp())
    compiled = compiled_stages(stages)
    assert compiled[-1] is stages[-1]
    assert [stage._orig_mod for stage in compiled[:-1]] == stages[:-1]   # type: ignore[union-attr]
    assert dynamo_config.recompile_limit >= 2 * len(stages)
