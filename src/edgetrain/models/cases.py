"""Named training cases of models no one shaped for edgetrain: a model, a batch and its targets, ready to train.

:func:`model_cases` holds the full-size models at their published sizes (MobileNetV3-Small, EfficientNet-B0,
DenseNet-121, U-Net, YOLOv8n, GPT-2 small) and the three user models of :mod:`edgetrain.models.user_examples`, each
at a tiny batch. :func:`block_model_cases` holds inputs where activations, not weights, set the least feasible
budget, so that recomputation (inside coarse stages too) has memory to win. The benchmarks that check ``Checkpointed``
on real models (``any_model``), time the single-level search (``single_level_search``) and set edgetrain against
``torch.compile`` (``compile_budget``) draw their models from here. Each case builds a fresh model and fresh random
data from the global RNG: seed it first for the same case twice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import EdgetrainError
from .edge_dense import gpt_decoder, unet, yolov8
from .edge_vision import densenet121, efficientnet_b0, mobilenet_v3_small
from .transformer import transformer_encoder
from .user_examples import SkipCat, encoder_in_sequential, sequential_cnn

__all__ = ["Case", "block_model_cases", "case", "model_cases"]

Case = tuple[nn.Module, torch.Tensor, torch.Tensor]
"""A model, an input batch and the batch's targets (class indices)."""


def _images(batch: int, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))


def model_cases() -> dict[str, Callable[[], Case]]:
    """The full-size models at their published sizes and the three user models, each at a tiny batch, by name.

    GPT-2 small (``gpt2``, 124,439,808 parameters) takes one sequence of 32 tokens: its step peaks when every
    gradient exists, above its activations, so its least feasible budget is keep-all's peak.

    Example:
        >>> sorted(model_cases())[:3]
        ['densenet121', 'efficientnet_b0', 'gpt2']
    """
    def encoder() -> Case:
        model = encoder_in_sequential(width=64, layers=4, vocab=1000, tokens=32)
        return model, torch.randint(0, 1000, (8, 32)), torch.randint(0, 10, (8,))

    def gpt2() -> Case:
        tokens = torch.randint(0, 50257, (1, 32))
        return gpt_decoder(), tokens, torch.roll(tokens, -1, 1)

    return {
        "mobilenet_v3_small": lambda: (mobilenet_v3_small(), *_images(4, 64, 1000)),
        "efficientnet_b0": lambda: (efficientnet_b0(), *_images(4, 64, 1000)),
        "densenet121": lambda: (densenet121(), *_images(4, 64, 1000)),
        "unet": lambda: (unet(3, 2), torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))),
        "yolov8n": lambda: (yolov8(), torch.randn(2, 3, 128, 128), torch.randint(0, 144, (2, 336))),
        "gpt2": gpt2,
        "user_skip_cat": lambda: (SkipCat(channels=16), *_images(8, 32, 10)),
        "user_encoder_in_sequential": encoder,
        "user_sequential_cnn": lambda: (sequential_cnn(channels=16, image=32), *_images(8, 32, 10)),
    }


def block_model_cases() -> dict[str, Callable[[], Case]]:
    """Inputs where activations, not weights, set the least budget (recomputing inside a stage frees activations).

    DenseNet-121 at 4 x 128 px, the zoo's encoder and a GPT-style decoder (4 layers of 256) at 256 tokens, a U-Net of
    width 16 at 2 x 128 px, the user's encoder-in-``Sequential`` and YOLOv8n at 2 x 256 px.
    """
    def gpt_small() -> Case:
        tokens = torch.randint(0, 1000, (2, 256))
        return gpt_decoder(vocab=1000, context=256, layers=4, width=256, heads=4), tokens, torch.roll(tokens, -1, 1)

    def zoo_transformer() -> Case:   # the zoo's encoder: stages() gives each nn.TransformerEncoderLayer whole
        model = transformer_encoder(num_layers=4, d_model=256, nhead=4, dim_feedforward=1024, vocab_size=1000,
                                    max_len=256, num_classes=10)
        return model, torch.randint(0, 1000, (4, 256)), torch.randint(0, 10, (4,))

    return {
        "densenet121": lambda: (densenet121(), *_images(4, 128, 1000)),
        "zoo_transformer_4x256": zoo_transformer,
        "unet_w16": lambda: (unet(3, 2, width=16), torch.randn(2, 3, 128, 128), torch.randint(0, 2, (2, 128, 128))),
        "gpt_4x256": gpt_small,
        "user_encoder_in_sequential": model_cases()["user_encoder_in_sequential"],
        "yolov8n": lambda: (yolov8(), torch.randn(2, 3, 256, 256), torch.randint(0, 144, (2, 1344))),
    }


def case(name: str) -> Case:
    """The case ``name`` built: :func:`block_model_cases`' inputs where it has the name, else :func:`model_cases`'.

    Raises:
        EdgetrainError: an unknown name, naming the known ones.
    """
    cases = {**model_cases(), **block_model_cases()}
    if name not in cases:
        raise EdgetrainError(f"unknown model case {name!r}; known: {', '.join(cases)}")
    return cases[name]()
