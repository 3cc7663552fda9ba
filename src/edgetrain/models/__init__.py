"""The model zoo: ResNets, MobileNetV2 and a BERT-shaped encoder, each also a chain of stages; and
models written with no thought of edgetrain (MobileNetV3-Small, EfficientNet-B0, DenseNet-121, a
U-Net, YOLOv8, a GPT-2-style decoder in ``edge_vision.py`` and ``edge_dense.py``), traced into stages.

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

from .call import Inputs
from .edge_dense import gpt_decoder, unet, yolov8
from .edge_vision import densenet121, efficientnet_b0, mobilenet_v3_small
from .mobilenet import mobilenet_v2
from .registry import MODELS, ModelSpec, check_input, get_model_spec
from .resnet import resnet18, resnet18_cifar, resnet34, resnet50, resnet101, resnet152
from .traced import NotTraceableError, traced_stages
from .transformer import transformer_encoder, transformer_encoder_small

__all__ = [
    "resnet18", "resnet18_cifar", "resnet34", "resnet50", "resnet101", "resnet152", "mobilenet_v2",
    "transformer_encoder", "transformer_encoder_small", "mobilenet_v3_small", "efficientnet_b0", "densenet121",
    "unet", "yolov8", "gpt_decoder", "stages_of", "traced_stages", "NotTraceableError",
    "MODELS", "ModelSpec", "get_model_spec", "check_input",
]


def stages_of(model: nn.Module, sample: Inputs | None = None) -> list[nn.Module]:
    """The chain of stages of ``model``, for planners and the executor.

    Args:
        model: a model with a ``stages()`` method (every model of this package, or a user's
            override), an ``nn.Sequential`` (its children are the stages, nested ``nn.Sequential``
            and ``nn.TransformerEncoder`` children opened), or any other model that torch.fx can
            trace: it is cut where one tensor passes (NOTE [ Traced stages ] in ``models/traced.py``).
        sample: an input batch: with it, a model torch.fx cannot trace is captured by ``torch.export`` on
            that batch's shapes (NOTE [ Exported stages ] in ``models/traced.py``).

    Returns:
        Modules whose sequential composition equals ``model(x)``, sharing its parameters.

    Raises:
        NotTraceableError: (a ``TypeError``) for a model that cannot be traced, naming the construct.

    Example:
        >>> import torch
        >>> seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> [type(s).__name__ for s in stages_of(seq)]
        ['Linear', 'ReLU']
    """
    stages = getattr(model, "stages", None)
    # a method; a submodule named ``stages`` (timm's ConvNeXt and MobileViT keep their blocks in one) is not it
    if callable(stages) and not isinstance(stages, nn.Module):
        result = list(stages())
        if not result or not all(isinstance(s, nn.Module) for s in result):
            raise TypeError(f"{type(model).__name__}.stages() must return a non-empty list of nn.Module")
        return result
    if isinstance(model, nn.Sequential) and len(model):
        return [stage for child in model for stage in _sequential_child_stages(child)]
    return traced_stages(model, sample)


def _sequential_child_stages(child: nn.Module) -> list[nn.Module]:
    """A child of a user's ``nn.Sequential`` is a stage as written (a user module stays whole: tracing
    would bake in its Python control flow), except torch's containers, which are opened."""
    if isinstance(child, nn.Sequential) and len(child):
        return stages_of(child)
    if isinstance(child, nn.TransformerEncoder):  # traced as a submodule: the tracer opens it into its layers
        return traced_stages(nn.Sequential(child))
    return [child]
