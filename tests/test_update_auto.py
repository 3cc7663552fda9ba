"""The ``auto`` update scheme: probes per candidate that leave the model as it was, measured and cached, the pick
among the candidates that fit a budget, and ``train --update auto`` (NOTE [ Contribution analysis ])."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from edgetrain.models import get_model_spec, resnet18_cifar
from edgetrain.models.update import UpdateSchemeError, apply_update, parse_update
from edgetrain.planners.choose import least_step_bytes
from edgetrain.profiling import profile
from edgetrain.train.contribution import Probe, ProbeData, choose_update, default_candidates, pick, probe_schemes
from tests.test_cli import run


def build() -> nn.Module:
    """Nine stages: conv, norm, relu twice, then pool, flatten and the head; the same weights at every call."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                         nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def data() -> ProbeData:
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 16, 16, generator=gen), torch.arange(4)) for _ in range(3)]
    return ProbeData(batches[:2], batches[2:])


def test_auto_parses_and_is_refused_where_there_is_no_data_to_choose_from() -> None:
    assert parse_update("auto").text == "auto"
    model = resnet18_cifar(num_classes=10)
    with pytest.raises(UpdateSchemeError, match="only `edgetrain train` takes it"):
        apply_update(model, "auto")


def test_bias_among_patterns_adds_the_bias_set() -> None:
    model = resnet18_cifar(num_classes=10)
    biases = set(apply_update(copy.deepcopy(model), "bias"))
    both = set(apply_update(model, "bias,fc"))
    assert both == biases | {"fc.weight", "fc.bias"}


def test_default_candidates_halve_down_from_the_stage_count() -> None:
    assert default_candidates(resnet18_cifar(num_classes=10)) == ["all", "bias", "last:1", "last:2", "last:4", "last:8"]
    assert default_candidates(build()) == ["all", "bias", "last:1", "last:2", "last:4", "last:8"]   # 9 stages


def test_probes_measure_each_candidate_from_the_same_start_and_cache_what_they_measured(one_thread: None,
                                                                                      tmp_path: Path) -> None:
    cache = tmp_path / "probes.json"
    probes = probe_schemes(build, data(), ["all", "last:1"], steps=2, lr=0.05, cache=cache)
    assert [p.scheme for p in probes] == ["all", "last:1"] and not any(p.cached for p in probes)
    frozen = build()
    apply_update(frozen, "last:1")
    assert probes[1].least_step_bytes == least_step_bytes(profile(frozen, *data().train[0], measure_time=False))
    assert probes[0].accuracy_before == probes[1].accuracy_before   # one start for every candidate: the gains compare
    assert probes[0].loss_before == probes[1].loss_before
    assert probes[1].trained_bytes == 4 * (16 * 10 + 10)
    # the probe is the scheme's own training: two steps of SGD with momentum, cosine from 0.05, on the train batches
    reference = build()
    apply_update(reference, "last:1")
    optimizer = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    for k, (x, y) in enumerate(data().train):
        optimizer.param_groups[0]["lr"] = 0.05 * (1 + math.cos(math.pi * k / 2)) / 2
        optimizer.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    with torch.no_grad():   # scored on the held-out batch's own statistics (no dropout here to switch off)
        x, y = data().held_out[0]
        logits = reference(x)
    assert probes[1].loss_after == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-6)
    assert probes[1].accuracy_after == float((logits.argmax(1) == y).float().mean())
    again = probe_schemes(build, data(), ["all", "last:1"], steps=2, lr=0.05, cache=cache)
    assert all(p.cached for p in again)
    assert [(p.gain, p.least_step_bytes) for p in again] == [(p.gain, p.least_step_bytes) for p in probes]
    other = probe_schemes(build, data(), ["last:1"], steps=3, lr=0.05, cache=cache)   # another setting: probed
    assert not other[0].cached


def test_a_probe_under_a_budget_runs_planned_steps_with_plain_autograds_result(one_thread: None) -> None:
    plain = probe_schemes(build, data(), ["all", "last:1"], steps=2, lr=0.05)
    least = {p.scheme: p.least_step_bytes for p in plain}
    assert least["last:1"] < least["all"]
    # a budget between the two least steps: all is not probed, last:1 runs by a schedule within the budget
    budgeted = probe_schemes(build, data(), ["all", "last:1"], budget=least["last:1"], steps=2, lr=0.05)
    assert not budgeted[0].probed and budgeted[0].least_step_bytes == least["all"]
    assert budgeted[1].probed and budgeted[1].loss_after == plain[1].loss_after
    with pytest.raises(ValueError, match="all was not probed"):
        _ = budgeted[0].gain


def _probe(scheme: str, least: int, accuracy: float, loss: float = 1.0) -> Probe:
    return Probe(scheme, least, 0, 0.25, accuracy, 2.0, loss, 1.0, cached=False)


def test_the_pick_is_the_largest_gain_that_fits_ties_to_the_smaller_step() -> None:
    probes = [_probe("all", 100, 0.9), _probe("bias", 60, 0.5), _probe("last:2", 30, 0.5), _probe("last:1", 10, 0.3),
              _probe("last:4", 40, 0.5, loss=1.5)]
    assert pick(probes, None, 8).scheme == "all"
    assert pick(probes, 99, 8).scheme == "last:2"   # bias gains as much for twice the step; last:4 loses more loss
    assert pick(probes, 29, 8).scheme == "last:1"
    line = pick(probes, 99, 8).explain()
    assert line.startswith("--update auto: last:2 (expected gain +25.0 points of held-out accuracy") and \
        "4 of 5 candidates fit" in line
    assert "\n" not in line
    with pytest.raises(UpdateSchemeError, match="no candidate fits 9 B; the least is last:1 at 10 B"):
        pick(probes, 9, 8)


def test_choose_update_fits_the_budget(one_thread: None) -> None:
    probes = probe_schemes(build, data(), ["all", "last:1"], steps=1)
    budget = min(p.least_step_bytes for p in probes)
    choice = choose_update(build, data(), budget, ["all", "last:1"], steps=1)
    assert choice.scheme == "last:1" and choice.chosen.least_step_bytes <= budget


@pytest.mark.parametrize("command", [("memory", "-m", "resnet18", "-b", "2"), ("plan", "-m", "resnet18", "-b", "2",
                                                                           "--recompute", "1.5")])
def test_auto_without_data_is_one_line_and_exit_2(command: tuple[str, ...]) -> None:
    code, out, err = run(*command, "--update", "auto")
    assert code == 2 and out == "" and err.count("\n") == 1 and "only `edgetrain train` takes it" in err


def test_train_auto_prints_its_choice_and_trains_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGETRAIN_DATA", str(tmp_path / "data"))
    code, out, err = run("train", "--model", "resnet18", "--batch", "4", "--image", "32", "--samples", "40",
                         "--epochs", "1", "--update", "auto", "--step-memory", "70MiB",
                         "--run-dir", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["update"] in default_candidates(get_model_spec("resnet18").build(10)) and summary["update"] != "auto"
    assert f"--update auto: {summary['update']} (expected gain" in " ".join(out.split())
    assert summary["predicted_peak_bytes"] <= 70 * 2**20
    assert (tmp_path / "data" / "update-probes.json").exists()
