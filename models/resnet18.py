"""ResNet-18 for 32x32 inputs (He et al., 2016), CIFAR variant.

The CIFAR variant used by both papers' CIFAR experiments (kuangliu/pytorch-cifar layout): a 3x3
stride-1 stem without max-pool, four stages of two BasicBlocks (64, 128, 256, 512 channels),
global average pooling and one linear layer. 11,173,962 parameters for 10 classes at ``width=64``.
``width`` scales every stage (tests and tiny-scale runs use a narrow network).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from core.errors import check_int
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 32, 32)}


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with a 3x3 stem for small images.

    ``block(in_planes, planes, stride)`` builds each of the 8 residual blocks (BasicBlock here;
    SE-ResNet-18 passes its pre-activation squeeze-excitation block).
    """

    def __init__(self, num_classes: int = 10, width: int = 64, in_channels: int = 3,
                 block: Callable[[int, int, int], nn.Module] = BasicBlock) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages, in_planes = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            planes = width * 2**i
            stages.append(nn.Sequential(block(in_planes, planes, stride), block(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


@register("resnet18")
def resnet18(num_classes: int = 10, width: int = 64, in_channels: int = 3) -> nn.Module:
    """ResNet-18, CIFAR variant (3x3 stem, no max-pool)."""
    check_io(num_classes, in_channels)
    check_int(width, "model.width", 1)
    return ResNet18(num_classes=num_classes, width=width, in_channels=in_channels)
