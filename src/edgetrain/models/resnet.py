"""ResNet-18/34/50/101/152 with torchvision's layout, written here so edgetrain needs no torchvision.

The layout (attribute names, ResNet v1.5 with the stride on the 3x3 conv of a bottleneck,
1x1-conv + BN shortcuts, Kaiming fan-out init) matches ``torchvision.models.resnet`` so that
parameter counts, memory profiles and state-dict keys are the ones people compare against
(He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

For checkpointing planners the network is also a chain (see NOTE [ Model stages ] in
``models/__init__.py``): stem, every residual block, head.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet18_cifar", "resnet34", "resnet50", "resnet101",
           "resnet152"]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (the following BN has one)."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution without bias, for channel changes and strided shortcuts."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided: v1.5), 1x1 expand by 4, with a residual shortcut (ResNet-50+).

    The stride sits on the 3x3 conv rather than the first 1x1 as in the original paper; this is
    torchvision's "v1.5" variant, slightly more accurate and the one whose sizes people quote.
    """

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_channels, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class _Head(nn.Module):
    """Stage view of the head: global average pool, flatten, the model's own fc."""

    def __init__(self, avgpool: nn.Module, fc: nn.Module) -> None:
        super().__init__()
        self.avgpool, self.fc = avgpool, fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet(nn.Module):
    """An ImageNet ResNet; ``block`` and ``layers`` select the depth.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: number of blocks in each of the four stages.
        num_classes: size of the final fully connected layer.
        zero_init_residual: start each block's last BN at zero so every block begins as the
            identity (Goyal et al., 2017); off by default, as in torchvision.
        cifar_stem: the stem of the common CIFAR ResNets (a 3x3 stride-1 convolution and no
            max-pool, e.g. github.com/kuangliu/pytorch-cifar) instead of ImageNet's 7x7 stride-2
            convolution and 3x3 stride-2 max-pool: 32-px images keep 32x32 maps in the first stage.
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 num_classes: int = 1000, zero_init_residual: bool = False, cifar_stem: bool = False) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self._in_channels = 64
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool: nn.Module = nn.Identity() if cifar_stem else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self._init_weights(zero_init_residual)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        """One resolution stage; only its first block changes stride or width, via a 1x1 shortcut."""
        downsample: nn.Module | None = None
        out_channels = planes * block.expansion
        if stride != 1 or self._in_channels != out_channels:
            downsample = nn.Sequential(_conv1x1(self._in_channels, out_channels, stride),
                                       nn.BatchNorm2d(out_channels))
        modules: list[nn.Module] = [block(self._in_channels, planes, stride, downsample)]
        self._in_channels = out_channels
        modules.extend(block(self._in_channels, planes) for _ in range(1, blocks))
        return nn.Sequential(*modules)

    def _init_weights(self, zero_init_residual: bool) -> None:
        """Kaiming fan-out for convs (keeps activation variance through ReLU), unit BN, as torchvision."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)
                elif isinstance(module, BasicBlock):
                    nn.init.zeros_(module.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (N, 3, H, W) -> logits (N, num_classes)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def stages(self) -> list[nn.Module]:
        """The chain ``[conv1, bn1, relu, maxpool, block, ..., block, head]``; in order it equals ``forward``.

        The stem is four stages, not one: its tensors are the network's largest (64 channels at
        half the input's side), and apart a planner may drop ``bn1``'s input while ``relu``
        back-propagates and recompute it from the batch after, so the stem's backward holds
        three of them instead of four (ResNet-18, batch 8, 224 px: least budget 212.0 MiB
        instead of 236.4, keep-all's peak unchanged). The ReLU stage is not in place (a stage's
        input is a leaf of its own graph); its values are the same. The head is a thin view
        built on each call; every stage holds this model's own modules, so parameters, buffers
        and train/eval mode are shared with the model.
        """
        blocks = [b for layer in (self.layer1, self.layer2, self.layer3, self.layer4) for b in layer]
        pool = [] if isinstance(self.maxpool, nn.Identity) else [self.maxpool]
        return [self.conv1, self.bn1, nn.ReLU(), *pool, *blocks, _Head(self.avgpool, self.fc)]


def resnet18(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18: 11,689,512 parameters at 1000 classes."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, zero_init_residual)


def resnet18_cifar(num_classes: int = 10, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18 with the CIFAR stem (3x3 stride-1 conv, no max-pool): 11,173,962 parameters at 10 classes.

    The count of the common CIFAR-10 ResNet-18 (kuangliu/pytorch-cifar, the variant Mwase et al.,
    AAAI 2024, trained on Raspberry Pi 4s): torchvision's body and shortcuts, a 1,728-parameter stem.
    """
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, zero_init_residual, cifar_stem=True)


def resnet34(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-34: 21,797,672 parameters at 1000 classes."""
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet50(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-50 (v1.5): 25,557,032 parameters at 1000 classes."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, zero_init_residual)


def resnet101(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-101 (v1.5): 44,549,160 parameters at 1000 classes."""
    return ResNet(Bottleneck, [3, 4, 23, 3], num_classes, zero_init_residual)


def resnet152(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-152 (v1.5): 60,192,808 parameters at 1000 classes."""
    return ResNet(Bottleneck, [3, 8, 36, 3], num_classes, zero_init_residual)
