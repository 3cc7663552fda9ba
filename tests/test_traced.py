"""Models without ``stages()``: traced with torch.fx and cut where one tensor passes (NOTE [ Traced stages ]).

The three user models (:mod:`edgetrain.models.user_examples`) train under ``Checkpointed`` at three
budgets from the least feasible to plain training's peak with gradients equal to plain autograd and the measured peak
what the plan predicted; untraceable models are refused in one line naming the construct.
"""

from __future__ import annotations

import pytest
import torch
from steps import assert_trains_at_three_budgets, check_tracks
from torch import fx, nn

from edgetrain.models import NotTraceableError, resnet18, stages_of, traced_stages
from edgetrain.models.user_examples import SkipCat, encoder_in_sequential, sequential_cnn
from edgetrain.planners import plan
from edgetrain.profiling import profile
from edgetrain.runtime import check_step, three_budgets


def run_chain(stages: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for stage in stages:
        x = stage(x)
    return x


def user_case(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    y = torch.randint(0, 10, (4,))
    if name == "skip_cat":
        return SkipCat(), torch.randn(4, 3, 16, 16), y
    if name == "encoder_in_sequential":
        return encoder_in_sequential(), torch.randint(0, 100, (4, 8)), y
    return sequential_cnn(), torch.randn(4, 3, 16, 16), y


@pytest.mark.parametrize("name", ["skip_cat", "encoder_in_sequential", "sequential_cnn"])
def test_user_models_train_at_three_budgets_as_plain_autograd(name: str) -> None:
    """By ``step_loss`` and in a user loop (``cross_entropy(wrapped(x), y).backward()``, NOTE [ Checkpointed
    in a user loop ]), which held the output's gradient over the plan (+160 bytes) while its backward
    ran the rest of the schedule inside the autograd function's."""
    model, x, y = user_case(name)
    chain = profile(model, x, y, measure_time=False)
    for loop in ("step", "user"):
        assert_trains_at_three_budgets(model, x, y, chain, loop=loop)


def test_skip_connection_region_is_one_stage_and_stages_share_the_parameters() -> None:
    model = SkipCat()
    stages = stages_of(model)
    # a | relu | b, relu, cat (h and g both live: one region) | c | relu | mean | head
    assert [type(s).__name__ for s in stages] == ["Conv2d", "Stage_relu", "Stage_b_cat", "Conv2d", "Stage_relu_2",
                                                  "Stage_mean", "Linear"]
    assert stages[0] is model.a and stages[3] is model.c
    assert {id(p) for s in stages for p in s.parameters()} == {id(p) for p in model.parameters()}
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(run_chain(stages, x), model(x))


def test_encoder_is_cut_between_its_layers() -> None:
    model = encoder_in_sequential(layers=4)
    stages = stages_of(model)
    # Embedding, then per layer (attention + residual, norm, feed-forward + residual, norm), then the
    # Sequential's own Flatten and Linear as written: the encoder is not opaque.
    assert len(stages) == 1 + 4 * 4 + 2
    assert [type(s).__name__ for s in stages[-2:]] == ["Flatten", "Linear"]
    assert sum(isinstance(s, nn.LayerNorm) for s in stages) == 8
    model.train()
    x = torch.randint(0, 100, (2, 8))
    torch.manual_seed(3)
    expected = model(x)
    torch.manual_seed(3)
    assert torch.equal(run_chain(stages, x), expected)  # dropout included: same ops, same order


def test_plain_sequential_keeps_its_children() -> None:
    model = sequential_cnn()
    assert stages_of(model) == list(model)


def test_no_cut_before_an_in_place_change_of_the_value() -> None:
    # ResNet's bn1 is followed by ReLU(inplace=True): a stage input rewritten in place would make
    # recomputation read garbage, so bn1 and relu share a stage.
    stages = traced_stages(nn.Sequential(resnet18(num_classes=10)))
    assert type(stages[1]).__name__ == "Stage__0_bn1__0_relu"
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
    assert [type(s).__name__ for s in traced_stages(model)] == ["Stage__0__1", "Linear"]


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.a(x)
        return x


def test_untraceable_model_is_refused_naming_the_construct() -> None:
    with pytest.raises(NotTraceableError) as caught:
        stages_of(Branchy())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("Branchy cannot be traced into stages: TraceError: symbolically traced variables "
                              "cannot be used as inputs to control flow")
    assert "test_traced.py" in message and "if x.sum() > 0:" in message


def test_untraceable_submodule_is_kept_whole() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Branchy(), nn.ReLU(), nn.Linear(4, 2))
    stages = stages_of(model)
    assert stages[1] is model[1]
    x = torch.randn(3, 4)
    assert torch.equal(run_chain(stages, x), model(x))


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class PairOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


class OptionalMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.a(x if mask is None else x * mask)


def test_inputs_and_outputs_a_chain_cannot_carry_are_refused() -> None:
    with pytest.raises(NotTraceableError, match=r"TwoInputs.forward takes more than one input \(y beside"):
        stages_of(TwoInputs())
    with pytest.raises(NotTraceableError, match=r"PairOut.forward returns tuple, not one tensor"):
        stages_of(PairOut())
    model = OptionalMask()
    assert stages_of(model) == [model.a]  # the default (None) is kept, its check dropped


def test_a_shape_is_never_a_stage_boundary() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(12, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            return self.b(h.view(h.size(0), -1))

    stages = stages_of(Flat())
    assert all(isinstance(s, (nn.Linear, fx.GraphModule)) for s in stages)
    x = torch.randn(2, 3, 4)
    assert run_chain(stages, x).shape == (2, 2)


class OpaqueStages(nn.Module):
    """A Sequential seen as its children (the chain before tracing): the encoder one opaque stage."""

    def __init__(self, model: nn.Sequential) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def stages(self) -> list[nn.Module]:
        return list(self.model)


def test_an_encoder_in_sequential_plans_at_every_factor_and_tracing_lets_it_recompute() -> None:
    # A user's encoder-in-Sequential at its batch: keep-all's peak is 8,301,496 bytes of tensors plus the float32
    # loss the step returns and its seed gradient (loss_held_bytes), 8 more.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    model = nn.Sequential(nn.Embedding(1000, 64), nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(64 * 32, 10))
    x, y = torch.randint(0, 1000, (8, 32)), torch.randint(0, 10, (8,))
    opaque = profile(OpaqueStages(model), x, y, measure_time=False)
    traced = profile(model, x, y, measure_time=False)
    assert (opaque.length, traced.length) == (5, 20)
    for factor in (1.05, 1.5, 2.0, 3.0):  # a grid's rounding must not refuse keep-all at any factor
        assert plan(opaque, recompute=factor).predicted_peak_bytes == 8_301_504  # nothing to drop
    # 0.42 of it; 3,479,232 without the generator states of its seven recomputed dropout stages
    assert plan(traced, recompute=1.5).predicted_peak_bytes == 3_511_232


class Reused(nn.Module):
    """The same two layers applied twice: four stages share parameters (NOTE [ Shared parameters ])."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = torch.relu(self.b(torch.relu(self.a(x))))
        return self.head(x)


def test_a_module_called_twice_is_counted_once_and_trains_as_plain_autograd() -> None:
    torch.manual_seed(0)
    model, x, y = Reused(), torch.randn(2048, 64), torch.randint(0, 10, (2048,))
    chain = profile(model, x, y, measure_time=False)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert chain.weights_bytes == chain.gradients_bytes == weights  # not twice a and b
    checks = [check_step(model, x, y, budget, chain) for budget in three_budgets(chain)]
    for check in checks:
        assert check.worst_grad_error <= 1e-6 and check_tracks(check), check
    assert checks[0].forward_advances > 0
