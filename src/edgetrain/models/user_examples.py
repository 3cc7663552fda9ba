"""Three models written as a user would, with no thought of edgetrain.

They are what ``stages_of`` must take as they are: a skip connection that concatenates two
tensors, a ``TransformerEncoder`` inside an ``nn.Sequential``, and a plain ``nn.Sequential`` CNN.
Tests train them small; the ``any_model`` benchmark trains them larger (:mod:`edgetrain.models.cases`).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SkipCat", "encoder_in_sequential", "sequential_cnn"]


class SkipCat(nn.Module):
    """``h = relu(a(x)); g = relu(b(h)); head(mean(relu(c(cat([h, g])))))`` on 3-channel images, 10 classes."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, channels, 3, padding=1), nn.Conv2d(channels, channels, 3, padding=1)
        self.c, self.head = nn.Conv2d(2 * channels, channels, 3, padding=1), nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        g = torch.relu(self.b(h))
        return self.head(torch.relu(self.c(torch.cat([h, g], 1))).mean((2, 3)))


def encoder_in_sequential(width: int = 32, layers: int = 2, vocab: int = 100, tokens: int = 8) -> nn.Sequential:
    """``Sequential(Embedding, TransformerEncoder, Flatten, Linear)`` over ``tokens`` tokens, 10 classes."""
    layer = nn.TransformerEncoderLayer(width, 4, 2 * width, batch_first=True)
    return nn.Sequential(nn.Embedding(vocab, width), nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                         nn.Flatten(), nn.Linear(width * tokens, 10))


def sequential_cnn(channels: int = 8, image: int = 16) -> nn.Sequential:
    """Conv-BN-ReLU-pool, conv-ReLU, a linear head: 3-channel ``image``-pixel inputs, 10 classes."""
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(2 * channels * (image // 2) ** 2, 10))
