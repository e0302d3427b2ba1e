"""GoogLeNet (Inception v1, Szegedy et al., 2015), CIFAR variant for 32x32 inputs.

The layout of kuangliu/pytorch-cifar's ``GoogLeNet``, used for the Accordion experiments (Agarwal
et al., MLSys 2021): a 3x3 stem with 192 channels (conv, BN, ReLU) replaces the ImageNet stem;
inception modules 3a, 3b, max-pool, 4a-4e, max-pool, 5a, 5b; global average pooling and one linear
layer (1024 -> classes); no auxiliary classifiers, no dropout. Every convolution is followed by
BatchNorm and ReLU, and the "5x5" branch is two stacked 3x3 convolutions. 6,166,250 parameters for
10 classes at ``width=64``; ``width`` scales every channel count by ``width / 64`` (tiny-scale runs
use a narrow network).
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import check_int
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 32, 32)}

# (1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool projection) output channels per module.
_INCEPTION: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _conv_bn_relu(in_planes: int, planes: int, kernel_size: int) -> list[nn.Module]:
    return [nn.Conv2d(in_planes, planes, kernel_size, padding=kernel_size // 2),
            nn.BatchNorm2d(planes), nn.ReLU(inplace=True)]


class Inception(nn.Module):
    """Four parallel branches (1x1; 1x1-3x3; 1x1-3x3-3x3; maxpool-1x1) concatenated."""

    def __init__(self, in_planes: int, n1: int, r3: int, n3: int, r5: int, n5: int,
                 pool: int) -> None:
        super().__init__()
        self.b1 = nn.Sequential(*_conv_bn_relu(in_planes, n1, 1))
        self.b2 = nn.Sequential(*_conv_bn_relu(in_planes, r3, 1), *_conv_bn_relu(r3, n3, 3))
        self.b3 = nn.Sequential(*_conv_bn_relu(in_planes, r5, 1), *_conv_bn_relu(r5, n5, 3),
                                *_conv_bn_relu(n5, n5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1),
                                *_conv_bn_relu(in_planes, pool, 1))
        self.out_planes = n1 + n3 + n5 + pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)


class GoogLeNet(nn.Module):
    """Inception v1 without auxiliary heads, for small images."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        planes = max(1, 192 * width // 64)
        self.stem = nn.Sequential(*_conv_bn_relu(in_channels, planes, 3))
        layers: list[nn.Module] = []
        for name, widths in _INCEPTION.items():
            if name in ("4a", "5a"):
                layers.append(nn.MaxPool2d(3, stride=2, padding=1))
            block = Inception(planes, *(max(1, w * width // 64) for w in widths))
            layers.append(block)
            planes = block.out_planes
        self.inceptions = nn.Sequential(*layers)
        self.linear = nn.Linear(planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inceptions(self.stem(x))
        out = nn.functional.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


@register("googlenet")
def googlenet(num_classes: int = 10, in_channels: int = 3, width: int = 64) -> nn.Module:
    """GoogLeNet, CIFAR variant (3x3 192-channel stem, inception 3a-5b, no auxiliary heads)."""
    check_io(num_classes, in_channels)
    check_int(width, "model.width", 1)
    return GoogLeNet(num_classes=num_classes, in_channels=in_channels, width=width)
