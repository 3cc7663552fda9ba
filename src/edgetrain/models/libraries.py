"""Models of the libraries people use, named on the command line: ``torchvision:NAME``, ``timm:NAME``, ``hf:CLASS``.

NOTE [ Library models by name ]
``--model torchvision:resnet18`` builds ``torchvision.models.get_model("resnet18", weights=None)``, ``timm:NAME``
``timm.create_model(NAME, pretrained=False)``, and ``hf:CLASS`` a Hugging Face transformers class (an image
classifier: ``hf:ViTForImageClassification``) from its config, the config's fields given by ``--model-arg``
(``--model-arg image_size=64``). Each is called with the data's class count (``num_classes``, ``num_labels`` for
transformers). Nothing is downloaded: the weights are the library's initialisation, or a local state dict given as
``--model-arg weights=PATH`` (saved by ``torch.save(model.state_dict(), PATH)``); ``pretrained=True`` is refused. A
transformers model returns a ``ModelOutput``; from the command line it trains on its logits. The name, with its
arguments, is recorded as any factory's is (NOTE [ A model by its factory ] in ``factory.py``), so a plan file says
how to build the model again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import EdgetrainError

__all__ = ["LIBRARIES", "Logits", "build_library_model", "library_builder"]

LIBRARIES = ("torchvision", "timm", "hf")
_PACKAGES = {"torchvision": "torchvision", "timm": "timm", "hf": "transformers"}


class Logits(nn.Module):
    """A transformers model that returns its ``ModelOutput``'s logits, as a classifier trained from the CLI does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def library_builder(library: str, name: str) -> Callable[..., nn.Module]:
    """The function that builds ``library``'s model ``name`` from keyword arguments (``num_classes`` among them).

    Raises:
        EdgetrainError: the library is not installed, or has no model of that name.
    """
    package = _PACKAGES[library]
    try:
        module = importlib.import_module(package)
    except Exception as exc:  # noqa: BLE001 - a library that fails to import (torchvision beside another torch)
        raise EdgetrainError(f"--model {library}:{name}: {package} does not import here ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); install it beside this torch, "
                             "or name a model of the zoo") from None
    if library == "torchvision":
        known = module.models.list_models()
        if name not in known:
            raise EdgetrainError(f"--model torchvision:{name}: torchvision has no model {name!r} "
                                 f"(it has: {', '.join(sorted(known)[:12])}, ...)")
        return lambda **args: module.models.get_model(name, weights=None, **args)
    if library == "timm":
        if not module.is_model(name):
            raise EdgetrainError(f"--model timm:{name}: timm has no model {name!r} (`timm.list_models()` lists them)")
        return lambda **args: module.create_model(name, pretrained=False, **args)
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, module.PreTrainedModel)):
        raise EdgetrainError(f"--model hf:{name}: transformers has no model class {name!r} (an image classifier such "
                             "as ViTForImageClassification)")
    return lambda **args: _transformers_model(cls, args)


def _transformers_model(cls: Any, args: dict[str, Any]) -> nn.Module:
    """``cls`` built from its config with ``args`` as the config's fields, the class count as ``num_labels``."""
    fields = dict(args)
    if "num_classes" in fields:
        fields["num_labels"] = fields.pop("num_classes")
    return Logits(cls(cls.config_class(**fields)))


def build_library_model(library: str, name: str, /, **args: Any) -> nn.Module:
    """``library``'s model ``name`` built with ``args``, its weights from ``args["weights"]`` where given.

    Raises:
        EdgetrainError: ``pretrained=True`` (nothing is downloaded), a missing weights file, or weights that do not
            fit the model.
    """
    weights = args.pop("weights", None)
    if args.get("pretrained"):
        raise EdgetrainError(f"--model {library}:{name}: nothing is downloaded; give a local state dict as "
                             "--model-arg weights=PATH (saved by torch.save(model.state_dict(), PATH))")
    model = library_builder(library, name)(**args)
    if weights is None:
        return model
    path = Path(str(weights)).expanduser()
    if not path.is_file():
        raise EdgetrainError(f"--model {library}:{name}: no weights file {str(path)!r}; save a state dict there with "
                             "torch.save(model.state_dict(), PATH) on a machine that has the weights")
    target = model.model if isinstance(model, Logits) else model
    try:
        target.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (RuntimeError, ValueError, OSError) as exc:
        raise EdgetrainError(f"--model {library}:{name}: the weights in {str(path)!r} do not fit the model: "
                             f"{str(exc).splitlines()[0]}") from None
    return model
