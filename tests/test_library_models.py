"""Models of torchvision, timm and transformers named on the command line (NOTE [ Library models by name ] in
``models/libraries.py``): built without a download, trained, planned from a file, refused in one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from edgetrain.errors import EdgetrainError
from edgetrain.models import get_model_spec
from edgetrain.models.libraries import Logits
from tests.test_factory_models import edgetrain

VIT = ("--model", "hf:ViTForImageClassification", "--model-arg", "image_size=16", "--model-arg", "patch_size=8",
       "--model-arg", "hidden_size=32", "--model-arg", "num_hidden_layers=2", "--model-arg", "num_attention_heads=2",
       "--model-arg", "intermediate_size=64")
VIT_NAME = ("hf:ViTForImageClassification(hidden_size=32, image_size=16, intermediate_size=64, "
            "num_attention_heads=2, num_hidden_layers=2, patch_size=8)")


def _imports(package: str) -> bool:
    """Whether ``package`` imports here (torchvision does only beside the torch it was built for)."""
    if importlib.util.find_spec(package) is None:
        return False
    try:
        importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any failure to import is "not here"
        return False
    return True


def test_a_transformers_class_is_built_from_its_config_with_the_datas_class_count() -> None:
    pytest.importorskip("transformers")
    # Execute
    spec = get_model_spec(VIT_NAME)
    model = spec.build(3)

    # Assert: the class itself, wrapped to give its logits; the config from the arguments; no weights downloaded
    assert isinstance(model, Logits) and type(model.model).__name__ == "ViTForImageClassification"
    config = model.model.config
    assert (config.image_size, config.hidden_size, config.num_labels) == (16, 32, 3)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 3)


def test_a_local_state_dict_gives_the_weights_and_pretrained_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    saved = get_model_spec(VIT_NAME).build(3)
    path = tmp_path / "vit.pt"
    torch.save(saved.model.state_dict(), path)
    name = VIT_NAME[:-1] + f", weights={str(path)!r})"

    # Execute
    torch.manual_seed(1)
    loaded = get_model_spec(name).build(3)

    # Assert: the file's weights, not a fresh initialisation; a missing file and pretrained=True are one line each
    for mine, theirs in zip(loaded.parameters(), saved.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    with pytest.raises(EdgetrainError, match=r"no weights file .*missing\.pt.*torch\.save"):
        get_model_spec(VIT_NAME[:-1] + ", weights='missing.pt')").build(3)
    with pytest.raises(EdgetrainError, match="nothing is downloaded; give a local state dict"):
        get_model_spec(VIT_NAME[:-1] + ", pretrained=True)").build(3)


@pytest.mark.slow
def test_a_transformers_model_trains_plans_from_a_file_and_records_its_name(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    run = (*VIT, "--samples", "48", "--batch", "8", "--image", "16")
    # Execute: a run planned here, a plan made for the model, a run from that plan
    trained = edgetrain(tmp_path, "train", *run, "--epochs", "1", "--run-dir", "run")
    planned = edgetrain(tmp_path, "plan", *VIT, "-b", "8", "--image", "16", "--memory", "4MiB", "-o", "plan.json")
    shipped = edgetrain(tmp_path, "train", *run, "--epochs", "1", "--plan", "plan.json", "--run-dir", "shipped")

    # Assert: each succeeds; the plan file and the runs name the model with its config, and the step held its plan
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    for run_dir in ("run", "shipped"):
        assert json.loads((tmp_path / run_dir / "run.json").read_text())["identity"]["model"] == VIT_NAME
    assert json.loads((tmp_path / "plan.json").read_text())["plan"]["model"] == VIT_NAME
    summary = json.loads((tmp_path / "shipped" / "summary.json").read_text())
    assert summary["measured_peak_bytes"] <= summary["predicted_tracked_peak_bytes"]


@pytest.mark.parametrize(("model", "phrase"), [
    ("hf:NoSuchModel", "transformers has no model class 'NoSuchModel'"),
    ("hf:ViTForImageClassification(image_size=16, nonsense=1)", "its forward does not take one batch"),
])
def test_a_library_model_that_cannot_be_built_is_one_line_before_anything_is_written(tmp_path: Path, model: str,
                                                                                    phrase: str) -> None:
    pytest.importorskip("transformers")
    # Execute
    result = edgetrain(tmp_path, "train", "--model", model, "--samples", "48", "--batch", "8", "--image", "32",
                       "--epochs", "1", "--run-dir", "run")

    # Assert
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert phrase in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("library", ["torchvision", "timm"])
def test_a_library_that_does_not_import_here_is_one_line(tmp_path: Path, library: str) -> None:
    if _imports(library):
        pytest.skip(f"{library} imports here: its models are built in test_a_library_model_is_built_without_weights")
    # Execute
    result = edgetrain(tmp_path, "memory", "--model", f"{library}:resnet18", "--batch", "2", "--image", "32")

    # Assert
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"{library} does not import here" in lines[0] and "install it beside this torch" in lines[0]


@pytest.mark.parametrize(("library", "name"), [("torchvision", "resnet18"), ("timm", "resnet18")])
def test_a_library_model_is_built_without_weights(library: str, name: str) -> None:
    if not _imports(library):
        pytest.skip(f"{library} does not import here")
    model = get_model_spec(f"{library}:{name}").build(7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
