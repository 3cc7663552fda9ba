"""Profiles kept on disk: a second profile of the same model reads the first, anything the measurement depends on
is a new key (NOTE [ What a cached profile is keyed by ] in ``profiling/cache.py``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import edgetrain.profiling.profiler as profiler
from edgetrain import Checkpointed, profile
from edgetrain.core.chain import Chain
from edgetrain.profiling.cache import PROFILE_CACHE_ENV, default_profile_cache, profile_cache_folder


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class EditedNet(Net):
    """The same modules, another forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models actually measured (a cache hit measures nothing)."""
    names: list[str] = []
    original = profiler._measured_chain

    def counting(model: nn.Module, *args: object, **kwargs: object) -> Chain:
        names.append(type(model).__name__)
        return original(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(profiler, "_measured_chain", counting)
    return names


def test_a_second_profile_of_the_same_model_is_read_back_equal(tmp_path: Path, measured: list[str]) -> None:
    x = torch.randn(4, 8)
    first = profile(Net(), x, cache=tmp_path)
    second = profile(Net(), torch.randn(4, 8), cache=tmp_path)   # other weights and values: the same measurement
    assert measured == ["Net"]
    assert second == first
    assert len(list(tmp_path.glob("*.json"))) == 1


@pytest.mark.parametrize("change", ["shape", "forward", "frozen", "mode", "optimizer", "loss"])
def test_what_the_measurement_depends_on_is_a_new_key(tmp_path: Path, measured: list[str], change: str) -> None:
    x = torch.randn(4, 8)
    profile(Net(), x, cache=tmp_path)
    model: nn.Module = EditedNet() if change == "forward" else Net()
    if change == "frozen":
        model.a.weight.requires_grad_(False)
    if change == "mode":
        model.eval()
    options: dict[str, object] = {"optimizer": "adam"} if change == "optimizer" else {}
    if change == "loss":
        options["loss_fn"] = lambda out, y: nn.functional.cross_entropy(out, y, label_smoothing=0.1)
    profile(model, torch.randn(8, 8) if change == "shape" else x, cache=tmp_path, **options)  # type: ignore[arg-type]
    assert len(measured) == 2, change
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_torn_cache_file_is_profiled_again(tmp_path: Path, measured: list[str],
                                             caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(4, 8)
    first = profile(Net(), x, cache=tmp_path, measure_time=False)
    (kept,) = tmp_path.glob("*.json")
    kept.write_text(kept.read_text()[:40])
    with caplog.at_level(logging.WARNING):
        again = profile(Net(), x, cache=tmp_path, measure_time=False)
    assert measured == ["Net", "Net"] and "does not read as a chain" in caplog.text
    assert again == first
    assert Chain.from_dict(json.loads(kept.read_text())) == again   # and it is kept again, whole


def test_a_second_checkpointed_reads_the_profile(tmp_path: Path, measured: list[str]) -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    first = Checkpointed(model, sample=x, target=y, memory=1 << 30, profile_cache=tmp_path)
    second = Checkpointed(model, sample=x, target=y, memory=1 << 30, profile_cache=tmp_path)
    assert measured == ["Net"] and second.chain == first.chain
    Checkpointed(model, sample=x, target=y, memory=1 << 30, profile_cache=False)
    assert measured == ["Net", "Net"]


def test_the_default_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PROFILE_CACHE_ENV, "off")
    assert default_profile_cache() is None and profile_cache_folder(True) is None
    monkeypatch.setenv(PROFILE_CACHE_ENV, str(tmp_path))
    assert default_profile_cache() == tmp_path == profile_cache_folder(True)
    monkeypatch.delenv(PROFILE_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_profile_cache() == tmp_path / "edgetrain" / "profiles"
    assert profile_cache_folder(False) is None and profile_cache_folder(tmp_path / "p") == tmp_path / "p"


class Blocks(nn.Module):
    """Four identical residual blocks between two different layers: traced into stages by torch.fx."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1),
                                                  nn.Linear(64, 32)) for _ in range(4))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


@pytest.mark.parametrize(("name", "repeated"), [("blocks", 3), ("transformer_small", 1)])
def test_repeated_stages_are_measured_once_at_the_costs_measuring_them_gives(name: str, repeated: int,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE [ Repeated stages measured once ]: the chain equals the one that measures every stage
    from edgetrain.models import get_model_spec

    torch.manual_seed(0)
    if name == "blocks":
        model, x = Blocks(), torch.randn(16, 8)
    else:
        spec = get_model_spec(name)
        model, x = spec.build(), spec.example_input(2, 32)
    measured_stages: list[str] = []
    original = profiler._profile_stage

    def counting(module: nn.Module, *args: object, **kwargs: object) -> object:
        measured_stages.append(str(kwargs["name"]))
        return original(module, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(profiler, "_profile_stage", counting)
    reused = profile(model, x, measure_time=False)
    once = len(measured_stages)
    monkeypatch.setattr(profiler, "REUSE_REPEATED_STAGES", False)
    assert profile(model, x, measure_time=False) == reused
    assert len(measured_stages) - once == reused.length and once == reused.length - repeated
