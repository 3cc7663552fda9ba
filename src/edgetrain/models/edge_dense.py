"""A U-Net, a YOLOv8-style detector (backbone, neck, head) and a GPT-2-style decoder, with no ``stages()``.

Like ``edge_vision.py``, ordinary modules that :func:`~edgetrain.models.stages_of` traces.
Their skips span most of the network (a U-Net's first level joins its last; the detector's
neck joins three backbone scales), so the traced chain is coarser than a ResNet's.

* Ronneberger et al., "U-Net", MICCAI 2015 (Fig. 1): 23 convolutions, 64 channels doubling
  over four levels; convolutions padded here so sizes need no cropping (same parameters).
  At ``width=64``, 1 input channel and 2 classes: 31,030,658 parameters, the figure's layers
  counted by hand in ``tests/test_edge_models.py`` (the count other ports of the paper report).
* YOLOv8n (Ultralytics, ``yolov8.yaml`` at scale n: depth 0.33, width 0.25): 3,157,200
  parameters at 80 classes, the yaml's published summary. In training the head returns its
  three scales' box and class maps flattened and joined: ``[batch, 64 + classes, anchors]``.
* GPT-2 small (Radford et al. 2019): 12 layers, 768 wide, 12 heads, 50,257 tokens, 1,024
  positions, tied input and output embedding: 124,439,808 parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["unet", "yolov8", "gpt_decoder", "UNet", "YOLOv8", "GPTDecoder"]


# --- U-Net ---------------------------------------------------------------------------------------

def _double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(out_channels, out_channels, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 2, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        widths = [width * 2**level for level in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(in_channels, widths[0])])
        self.down.extend(_double_conv(widths[i], widths[i + 1]) for i in range(depth))
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                for i in reversed(range(depth)))
        self.merge = nn.ModuleList(_double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for level, block in enumerate(self.down):
            x = block(x if level == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            x = merge(torch.cat([skips.pop(), up(x)], 1))
        return self.head(x)


def unet(in_channels: int = 3, num_classes: int = 2, width: int = 64) -> UNet:
    """U-Net of four levels; ``width=16`` is a small edge variant (1/16 of the parameters)."""
    return UNet(in_channels, num_classes, width)


# --- YOLOv8 --------------------------------------------------------------------------------------

class ConvBNSiLU(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, channels: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = ConvBNSiLU(channels, channels, 3), ConvBNSiLU(channels, channels, 3)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.cv2(self.cv1(x))
        return x + out if self.shortcut else out


class C2f(nn.Module):
    """Split in two, chain bottlenecks on one half, join every intermediate map, 1x1 conv."""

    def __init__(self, in_channels: int, out_channels: int, repeats: int, shortcut: bool = False) -> None:
        super().__init__()
        self.hidden = out_channels // 2
        self.cv1 = ConvBNSiLU(in_channels, 2 * self.hidden)
        self.cv2 = ConvBNSiLU((2 + repeats) * self.hidden, out_channels)
        self.m = nn.ModuleList(Bottleneck(self.hidden, shortcut) for _ in range(repeats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max pools joined with their input."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.cv1 = ConvBNSiLU(in_channels, in_channels // 2)
        self.cv2 = ConvBNSiLU(in_channels // 2 * 4, out_channels)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [self.cv1(x)]
        for _ in range(3):
            parts.append(self.pool(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class Detect(nn.Module):
    """Per scale, a box branch (4 x 16 distribution bins) and a class branch; DFL's fixed 1x1 conv."""

    def __init__(self, num_classes: int, channels: tuple[int, ...], reg_max: int = 16) -> None:
        super().__init__()
        box, cls = max(16, channels[0] // 4, 4 * reg_max), max(channels[0], min(num_classes, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, box, 3), ConvBNSiLU(box, box, 3),
                                               nn.Conv2d(box, 4 * reg_max, 1)) for c in channels)
        self.cv3 = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, cls, 3), ConvBNSiLU(cls, cls, 3),
                                               nn.Conv2d(cls, num_classes, 1)) for c in channels)
        self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)  # decodes boxes at inference
        with torch.no_grad():
            self.dfl.weight.copy_(torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        maps = [torch.cat([box(x), cls(x)], 1) for x, box, cls in zip(features, self.cv2, self.cv3, strict=True)]
        return torch.cat([m.flatten(2) for m in maps], 2)


class YOLOv8(nn.Module):
    def __init__(self, num_classes: int = 80, depth: float = 0.33, width: float = 0.25, max_channels: int = 1024):
        super().__init__()

        def ch(channels: int) -> int:
            return math.ceil(min(channels, max_channels) * width / 8) * 8

        def n(repeats: int) -> int:
            return max(round(repeats * depth), 1)

        self.stem = nn.Sequential(ConvBNSiLU(3, ch(64), 3, 2), ConvBNSiLU(ch(64), ch(128), 3, 2),
                                  C2f(ch(128), ch(128), n(3), True), ConvBNSiLU(ch(128), ch(256), 3, 2),
                                  C2f(ch(256), ch(256), n(6), True))                       # P3/8
        self.p4 = nn.Sequential(ConvBNSiLU(ch(256), ch(512), 3, 2), C2f(ch(512), ch(512), n(6), True))
        self.p5 = nn.Sequential(ConvBNSiLU(ch(512), ch(1024), 3, 2), C2f(ch(1024), ch(1024), n(3), True),
                                SPPF(ch(1024), ch(1024)))
        self.top_down4 = C2f(ch(1024) + ch(512), ch(512), n(3))
        self.top_down3 = C2f(ch(512) + ch(256), ch(256), n(3))
        self.down3 = ConvBNSiLU(ch(256), ch(256), 3, 2)
        self.bottom_up4 = C2f(ch(256) + ch(512), ch(512), n(3))
        self.down4 = ConvBNSiLU(ch(512), ch(512), 3, 2)
        self.bottom_up5 = C2f(ch(512) + ch(1024), ch(1024), n(3))
        self.detect = Detect(num_classes, (ch(256), ch(512), ch(1024)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c3 = self.stem(x)
        c4 = self.p4(c3)
        c5 = self.p5(c4)
        t4 = self.top_down4(torch.cat([F.interpolate(c5, scale_factor=2.0), c4], 1))
        p3 = self.top_down3(torch.cat([F.interpolate(t4, scale_factor=2.0), c3], 1))
        p4 = self.bottom_up4(torch.cat([self.down3(p3), t4], 1))
        p5 = self.bottom_up5(torch.cat([self.down4(p4), c5], 1))
        return self.detect([p3, p4, p5])


def yolov8(num_classes: int = 80, scale: str = "n") -> YOLOv8:
    """YOLOv8 backbone (CSP with C2f, SPPF), PAN neck and decoupled head; ``scale`` n or s."""
    depth, width = {"n": (0.33, 0.25), "s": (0.33, 0.50)}[scale]
    return YOLOv8(num_classes, depth, width)


# --- GPT -----------------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.heads, self.dropout = heads, dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.c_attn(x).split(width, 2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, tokens, width)))


class DecoderBlock(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTDecoder(nn.Module):
    """Token and position embeddings, pre-norm causal blocks, final norm, output tied to the token embedding.

    Returns logits ``[batch, vocab, tokens]`` (class dimension second, as ``cross_entropy`` takes them
    against next-token targets ``[batch, tokens]``).
    """

    def __init__(self, vocab: int = 50257, context: int = 1024, layers: int = 12, width: int = 768, heads: int = 12,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(DecoderBlock(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight).transpose(1, 2)


def gpt_decoder(vocab: int = 50257, context: int = 1024, layers: int = 12, width: int = 768,
                heads: int = 12) -> GPTDecoder:
    """A GPT-2-style decoder; the defaults are GPT-2 small (124,439,808 parameters)."""
    return GPTDecoder(vocab, context, layers, width, heads)
