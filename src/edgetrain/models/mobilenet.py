"""MobileNetV2 with torchvision's layout, written here so edgetrain needs no torchvision.

Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018. The
module tree (``features[0]`` stem, 17 :class:`InvertedResidual` blocks, ``features[18]`` 1x1
conv to 1280 channels, ``classifier`` = Dropout + Linear) and the init follow torchvision, so
the parameter count (3,504,872 at 1000 classes) and state-dict keys match the reference model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ConvBNReLU6", "InvertedResidual", "MobileNetV2", "mobilenet_v2", "make_divisible"]

# (expansion t, output channels c, repeats n, first stride s) per group, Table 2 of the paper.
_INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a scaled channel count to a multiple of ``divisor`` without losing more than 10%.

    Multiples of 8 keep vectorised kernels efficient; the rule is the reference implementation's,
    which the published parameter counts depend on.
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


class ConvBNReLU6(nn.Sequential):
    """Conv (no bias) + BatchNorm + ReLU6, padded to keep the size at stride 1."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2,
                      groups=groups, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise 3x3, project (1x1, linear); residual when shape is unchanged.

    The projection has no activation: the paper argues ReLU in the narrow bottleneck destroys
    information, hence "linear bottleneck".
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        hidden = round(in_channels * expand_ratio)
        self.stride = stride
        self.use_res_connect = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(in_channels, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class _Head(nn.Module):
    """Stage view of the head: global average pool, flatten, the model's own classifier."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class MobileNetV2(nn.Module):
    """MobileNetV2 for ImageNet-style inputs (any size >= 32 px).

    Args:
        num_classes: size of the final linear layer.
        width_mult: scales every layer's channel count (rounded to multiples of 8); the last
            conv never shrinks below 1280 channels.
        dropout: dropout before the classifier.
    """

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if width_mult <= 0:
            raise ValueError(f"width_mult must be > 0, got {width_mult}")
        in_channels = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNReLU6(3, in_channels, stride=2)]
        for t, c, n, s in _INVERTED_RESIDUAL_SETTING:
            out_channels = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(in_channels, out_channels, s if i == 0 else 1, t))
                in_channels = out_channels
        features.append(ConvBNReLU6(in_channels, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        self._init_weights()

    def _init_weights(self) -> None:
        """Kaiming fan-out convs, unit BN, small-normal classifier: torchvision's choice."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (N, 3, H, W) -> logits (N, num_classes)
        x = self.features(x)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))

    def stages(self) -> list[nn.Module]:
        """The chain ``[features[0], 17 blocks, features[18], head]``; composed, it equals ``forward``.

        Every stage but the head is the model's own submodule; the head is a view built on each
        call around the model's classifier, so parameters and train/eval mode are shared.
        """
        return [*self.features, _Head(self.classifier)]


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetV2:
    """MobileNetV2: 3,504,872 parameters at 1000 classes and width 1.0."""
    return MobileNetV2(num_classes=num_classes, width_mult=width_mult)
