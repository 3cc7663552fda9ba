"""MobileNetV3-Small, EfficientNet-B0 and DenseNet-121, written the plain PyTorch way, with no ``stages()``.

These models were not shaped for edgetrain: each is an ordinary ``nn.Module`` whose forward
holds skip connections, squeeze-excite gates, concatenations and stochastic depth, and
:func:`~edgetrain.models.stages_of` traces it (NOTE [ Traced stages ] in ``traced.py``). The
layer layouts follow the papers as torchvision builds them, so the parameter counts at 1000
classes are torchvision's published ones (``num_params`` of its weights): MobileNetV3-Small
2,542,856, EfficientNet-B0 5,288,548, DenseNet-121 7,978,856 (``tests/test_edge_models.py``).

* Howard et al., "Searching for MobileNetV3", ICCV 2019 (Table 2, Small).
* Tan and Le, "EfficientNet: Rethinking Model Scaling for CNNs", ICML 2019 (Table 1, B0).
* Huang et al., "Densely Connected Convolutional Networks", CVPR 2017 (Table 1, 121 layers, k = 32).
"""

from __future__ import annotations

import torch
from torch import nn

from .mobilenet import make_divisible

__all__ = ["mobilenet_v3_small", "efficientnet_b0", "densenet121", "MobileNetV3", "EfficientNet", "DenseNet",
           "V3_SMALL_BLOCKS", "B0_STAGES"]


def _conv_bn(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1,
             activation: type[nn.Module] | None = None) -> nn.Sequential:
    """Conv (no bias) + BatchNorm (+ activation), padded to keep the size at stride 1."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.01)]
    if activation is not None:
        layers.append(activation())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel gate: global average, 1x1 conv down, activation, 1x1 conv up, gate, scale."""

    def __init__(self, channels: int, squeezed: int, activation: type[nn.Module], gate: type[nn.Module]) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)
        self.activation, self.gate = activation(), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.gate(self.fc2(self.activation(self.fc1(x.mean((2, 3), keepdim=True)))))
        return x * scale


class StochasticDepth(nn.Module):
    """Drop a residual branch per sample with probability ``p`` in training (EfficientNet's "row" mode)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        survival = 1.0 - self.p
        noise = torch.empty((x.shape[0], 1, 1, 1), dtype=x.dtype, device=x.device).bernoulli_(survival)
        return x * noise.div_(survival)


class MobileBlock(nn.Module):
    """Inverted residual: expand (1x1), depthwise, squeeze-excite, project (1x1, linear), residual."""

    def __init__(self, in_channels: int, kernel_size: int, expanded: int, out_channels: int, stride: int,
                 activation: type[nn.Module], se: SqueezeExcite | None, drop: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != in_channels:
            layers.append(_conv_bn(in_channels, expanded, 1, activation=activation))
        layers.append(_conv_bn(expanded, expanded, kernel_size, stride, groups=expanded, activation=activation))
        if se is not None:
            layers.append(se)
        layers.append(_conv_bn(expanded, out_channels, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels
        self.drop = StochasticDepth(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + self.drop(out) if self.residual else out


# (kernel, expanded, out, squeeze-excite, hard-swish, stride) per block, Table 2 of MobileNetV3 (Small).
V3_SMALL_BLOCKS = ((3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
             (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
             (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
             (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1))


class MobileNetV3(nn.Module):
    """``blocks`` (rows of ``V3_SMALL_BLOCKS``) may be cut short for a quick test of the same layers."""

    def __init__(self, num_classes: int = 1000,
                 blocks: tuple[tuple[int, int, int, bool, bool, int], ...] = V3_SMALL_BLOCKS) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 16, 3, 2, activation=nn.Hardswish)]
        channels = 16
        for kernel, expanded, out, use_se, hard_swish, stride in blocks:
            activation = nn.Hardswish if hard_swish else nn.ReLU
            se = SqueezeExcite(expanded, make_divisible(expanded // 4), nn.ReLU, nn.Hardsigmoid) if use_se else None
            layers.append(MobileBlock(channels, kernel, expanded, out, stride, activation, se))
            channels = out
        layers.append(_conv_bn(channels, 6 * channels, 1, activation=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(6 * channels, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


def mobilenet_v3_small(num_classes: int = 1000) -> MobileNetV3:
    """MobileNetV3-Small (2,542,856 parameters at 1000 classes, as torchvision's)."""
    return MobileNetV3(num_classes)


# (expansion, kernel, stride, in, out, repeats) per stage, Table 1 of EfficientNet (B0).
B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
       (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


class EfficientNet(nn.Module):
    """MBConv stages with squeeze-excite (a quarter of each block's input channels) and stochastic depth.

    ``stages`` (rows of ``B0_STAGES``) may be cut short for a quick test of the same layers.
    """

    def __init__(self, num_classes: int = 1000, stochastic_depth: float = 0.2,
                 stages: tuple[tuple[int, int, int, int, int, int], ...] = B0_STAGES) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, activation=nn.SiLU)]
        total, index = sum(stage[-1] for stage in stages), 0
        for expansion, kernel, stride, in_channels, out_channels, repeats in stages:
            for repeat in range(repeats):
                channels = in_channels if repeat == 0 else out_channels
                expanded = make_divisible(channels * expansion)
                se = SqueezeExcite(expanded, max(1, channels // 4), nn.SiLU, nn.Sigmoid)
                layers.append(MobileBlock(channels, kernel, expanded, out_channels, stride if repeat == 0 else 1,
                                          nn.SiLU, se, drop=stochastic_depth * index / total))
                index += 1
        last = stages[-1][4]
        layers.append(_conv_bn(last, 4 * last, 1, activation=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(4 * last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


def efficientnet_b0(num_classes: int = 1000) -> EfficientNet:
    """EfficientNet-B0 (5,288,548 parameters at 1000 classes, as torchvision's)."""
    return EfficientNet(num_classes)


class DenseLayer(nn.Module):
    """BN-ReLU-conv 1x1 (4k channels), BN-ReLU-conv 3x3 (k channels) over every earlier feature map."""

    def __init__(self, in_channels: int, growth: int, bottleneck: int = 4) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(in_channels), nn.ReLU()
        self.conv1 = nn.Conv2d(in_channels, bottleneck * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bottleneck * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class DenseBlock(nn.Module):
    def __init__(self, layers: int, in_channels: int, growth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(in_channels + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32, init_features: int = 64,
                 num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, init_features, 7, 2, 3, bias=False), nn.BatchNorm2d(init_features),
                                   nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        channels = init_features
        for i, count in enumerate(blocks):
            layers.append(DenseBlock(count, channels, growth))
            channels += count * growth
            if i < len(blocks) - 1:   # transition: BN-ReLU-conv 1x1 halving the channels, 2x2 average pool
                layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels // 2, 1, bias=False),
                           nn.AvgPool2d(2)]
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


def densenet121(num_classes: int = 1000) -> DenseNet:
    """DenseNet-121 (7,978,856 parameters at 1000 classes, as torchvision's)."""
    return DenseNet(num_classes=num_classes)
