"""Update schemes: what each trains, the frozen start folded into the first stage that trains, gradients equal to
plain autograd's on the frozen model, no gradient and no optimizer state for frozen parameters, peaks as predicted,
and the command line's refusals before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from edgetrain.core.optim import make_optimizer
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate
from edgetrain.models import resnet18_cifar, stages_of
from edgetrain.models.stages import FrozenPrefix, training_stages
from edgetrain.models.update import UpdateSchemeError, apply_update, parse_update
from edgetrain.profiling import chain_for, profile
from edgetrain.runtime import Checkpointed, check_step, three_budgets
from tests.steps import check_tracks
from tests.test_cli import run


def small() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return resnet18_cifar(num_classes=10), torch.randn(4, 3, 32, 32), torch.arange(4)


@pytest.mark.parametrize("text, canonical", [("all", "all"), (" bias ", "bias"), ("last:3", "last:3"),
                                             ("layer4, fc", "layer4,fc")])
def test_schemes_parse_to_one_spelling(text: str, canonical: str) -> None:
    assert parse_update(text).text == canonical


@pytest.mark.parametrize("text", ["", "last:0", "last:-1", "last:x", "layer4,,fc"])
def test_malformed_schemes_are_refused(text: str) -> None:
    with pytest.raises(UpdateSchemeError):
        parse_update(text)


def test_each_scheme_trains_exactly_what_it_names() -> None:
    model, _, _ = small()
    names = dict(model.named_parameters())
    # ResNet-18's convolutions have no bias: its 20 BatchNorms' weight and bias, and the head's bias
    bias = apply_update(model, "bias")
    assert len(bias) == 41 and "fc.bias" in bias and "fc.weight" not in bias and "conv1.weight" not in bias
    assert all(names[n].requires_grad == (n in bias) for n in names)
    last = apply_update(model, "last:2")   # layer4's second block and the head
    assert set(last) == {n for n in names if n.startswith(("layer4.1.", "fc."))}
    patterns = apply_update(model, "layer4,fc.weight")
    assert set(patterns) == {n for n in names if n.startswith("layer4.")} | {"fc.weight"}
    assert apply_update(model, "all") == list(names)


def test_a_scheme_that_names_nothing_is_refused_naming_it() -> None:
    model, _, _ = small()
    with pytest.raises(UpdateSchemeError, match="'layer9' matches no parameter of ResNet"):
        apply_update(model, "layer4,layer9")
    with pytest.raises(UpdateSchemeError, match=r"last:99: ResNet has 12 stages \(11 with parameters\)"):
        apply_update(model, "last:99")
    parameterless = nn.Sequential(nn.Flatten(), nn.ReLU())
    with pytest.raises(UpdateSchemeError, match="no parameter of Sequential would train"):
        apply_update(parameterless, "bias")


def test_the_frozen_start_folds_into_the_first_stage_that_trains() -> None:
    model, x, y = small()
    plain = len(stages_of(model)) + 1
    apply_update(model, "last:3")
    stages = training_stages(model)
    assert len(stages) == 4 and isinstance(stages[0], FrozenPrefix) and stages[0].frozen == plain - 4
    chain = profile(model, x, y, measure_time=False)
    apply_update(model, "all")
    full = profile(model, x, y, measure_time=False)
    # the fold records what its last stage (layer4's first block) saves, with an input that needs no gradient: no
    # more than that block saves in full training, where its input needs one, with that input (which a stage's
    # saved bytes leave out, and which is inside the fold); nothing of the 9 frozen stages
    assert chain.stages[0].out_bytes == full.stages[9].out_bytes and full.stages[9].input_saved
    block, its_input = full.stages[9].saved_bytes, full.stages[8].out_bytes
    assert chain.stages[0].out_bytes <= chain.stages[0].saved_bytes <= block + its_input
    assert sum(s.saved_bytes for s in full.stages[:9]) > 10 * full.stages[9].saved_bytes
    apply_update(model, "all")
    assert len(training_stages(model)) == plain


@pytest.mark.parametrize("scheme", ["bias", "last:3", "layer3,fc"])
def test_a_scheme_trains_as_plain_autograd_on_the_frozen_model_within_the_predicted_peak(scheme: str) -> None:
    model, x, y = small()
    apply_update(model, scheme)
    chain = profile(model, x, y, measure_time=False)
    for budget in three_budgets(chain):
        check = check_step(model, x, y, budget, chain)   # frozen parameters: no gradient in either step
        assert check.worst_grad_error <= 1e-6 and check.predicted_peak_bytes <= budget
        assert check_tracks(check), check


def test_frozen_parameters_get_no_gradient_and_no_optimizer_state() -> None:
    model, x, y = small()
    apply_update(model, "bias")
    wrapped = Checkpointed(model, sample=x, target=y, memory=three_budgets(
        profile(model, x, y, measure_time=False))[0], measure_time=False)
    optimizer = make_optimizer("sgd", model.parameters())
    for _ in range(2):
        nn.functional.cross_entropy(wrapped(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    for param in model.parameters():
        assert (param.grad is not None) == param.requires_grad
        assert (param in optimizer.state) == param.requires_grad
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 41


def test_checkpointed_applies_the_scheme_it_is_given() -> None:
    model, x, y = small()
    wrapped = Checkpointed(model, sample=x, target=y, recompute=1.0, measure_time=False, update="last:2")
    assert [n for n, p in model.named_parameters() if p.requires_grad] == apply_update(resnet18_cifar(10), "last:2")
    assert wrapped.chain.length == 3


def test_freezing_the_start_cuts_the_plain_step_and_the_optimizer_state() -> None:
    full, partial = chain_for("mobilenet_v2", 8, 128), chain_for("mobilenet_v2", 8, 128, update="last:2")
    assert partial.meta["update"] == "last:2" and full.meta["update"] == "all"
    assert partial.optimizer_state_bytes == partial.gradients_bytes < full.gradients_bytes / 2  # the 1000-way head
    plain_full = simulate(full, keep_all(full.length)).peak_bytes
    plain_partial = simulate(partial, keep_all(partial.length)).peak_bytes
    assert plain_full > 4.5 * plain_partial   # 240 MiB against 50 MiB (632 against 104 at 224 px)


@pytest.mark.parametrize("command", [("memory", "-m", "resnet18", "-b", "2"), ("plan", "-m", "resnet18", "-b", "2",
                                                                           "--recompute", "1.5")])
@pytest.mark.parametrize("update, message", [("last:0", "last:K takes a whole number"),
                                             ("layer9", "'layer9' matches no parameter of ResNet")])
def test_a_bad_scheme_is_one_line_and_exit_2(command: tuple[str, ...], update: str, message: str) -> None:
    code, out, err = run(*command, "--update", update)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_train_refuses_a_bad_scheme_before_any_work(tmp_path: Path) -> None:
    code, _, err = run("train", "--update", "layer9", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "'layer9' matches no parameter" in err
    assert not (tmp_path / "run").exists()


def test_a_plan_records_its_scheme_and_a_run_of_another_scheme_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    common = ("--model", "resnet18", "--batch", "4", "--image", "32")
    assert run("plan", *common, "--classes", "10", "--recompute", "1.2", "--update", "last:3", "-o", str(plan))[0] == 0
    assert json.loads(plan.read_text())["plan"]["update"] == "last:3"
    code, _, err = run("train", *common, "--samples", "40", "--plan", str(plan), "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "update: 'last:3' (plan) -> 'all' (run)" in err
    assert not (tmp_path / "r").exists()


def test_a_resume_with_another_scheme_is_refused_naming_it(tmp_path: Path) -> None:
    common = ("train", "--model", "resnet18", "--batch", "4", "--image", "32", "--samples", "40", "--epochs", "1",
              "--run-dir", str(tmp_path / "r"))
    assert run(*common, "--update", "last:2")[0] == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["config"]["update"] == "last:2"
    code, _, err = run(*common, "--update", "bias", "--resume")
    assert code == 2 and 'update: "last:2" -> "bias"' in err
