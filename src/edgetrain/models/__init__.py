"""The model zoo: ResNets, MobileNetV2 and a BERT-shaped encoder, each also a chain of stages.

LinearResNet, a cost model built from the estimator, lives in ``profile/linear_resnet.py``.

NOTE [ Model stages ]
Checkpointing planners see a model as a chain ``x_{i+1} = stage_i(x_i)`` (NOTE [ The chain
memory model ] in ``chain.py``). Every model here has ``stages() -> list[nn.Module]`` whose
composition in order is exactly ``forward`` (same ops, same order, so results are bitwise
equal, and with the same RNG state dropout draws the same masks). Stages hold the model's own
submodules, never copies: the optimizer, ``state_dict`` and ``.train()``/``.eval()`` of the model
all act on them. Stages that have no module of their own in the model (a ResNet stem and head,
the MobileNetV2 head) are thin view modules created on each ``stages()`` call; they are not
registered in the model, so its ``state_dict`` keys stay torchvision's.

Stage counts: ResNet-18/34/50/101/152 have 10/18/18/35/52 (stem + blocks + head), MobileNetV2 20,
the encoder ``num_layers + 2``.
"""

from __future__ import annotations

from torch import nn

from .mobilenet import mobilenet_v2
from .registry import MODELS, ModelSpec, check_input, get_model_spec
from .resnet import resnet18, resnet18_cifar, resnet34, resnet50, resnet101, resnet152
from .transformer import transformer_encoder, transformer_encoder_small

__all__ = [
    "resnet18", "resnet18_cifar", "resnet34", "resnet50", "resnet101", "resnet152", "mobilenet_v2",
    "transformer_encoder", "transformer_encoder_small", "stages_of",
    "MODELS", "ModelSpec", "get_model_spec", "check_input",
]


def stages_of(model: nn.Module) -> list[nn.Module]:
    """The chain of stages of ``model``, for planners and the executor.

    Args:
        model: a model with a ``stages()`` method (every model of this package), or an
            ``nn.Sequential`` whose children are the stages.

    Returns:
        Modules whose sequential composition equals ``model(x)``, sharing its parameters.

    Raises:
        TypeError: for any other model, saying how to make it chain-able.

    Example:
        >>> import torch
        >>> seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> [type(s).__name__ for s in stages_of(seq)]
        ['Linear', 'ReLU']
    """
    stages = getattr(model, "stages", None)
    if callable(stages):
        result = list(stages())
        if not result or not all(isinstance(s, nn.Module) for s in result):
            raise TypeError(f"{type(model).__name__}.stages() must return a non-empty list of nn.Module")
        return result
    if isinstance(model, nn.Sequential):
        return list(model.children())
    raise TypeError(
        f"{type(model).__name__} is not chain-able: give it a method stages() -> list[nn.Module] whose "
        "sequential composition equals forward(), or wrap it as an nn.Sequential of stages"
    )
