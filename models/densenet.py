"""DenseNet-BC for 32x32 inputs (Huang et al., 2017), CIFAR variant.

The layout of kuangliu/pytorch-cifar's ``densenet_cifar``, used for the Accordion experiments
(Agarwal et al., MLSys 2021): a 3x3 stem with ``2 * growth_rate`` channels, four dense blocks of
(6, 12, 24, 16) bottleneck layers, transitions (BN-ReLU-conv1x1-avgpool2) after the first three
that keep ``compression`` of the channels, then BN-ReLU, global average pooling and a linear layer.
A bottleneck layer is BN-ReLU-conv1x1 (``4 * growth_rate`` channels)-BN-ReLU-conv3x3
(``growth_rate`` channels), concatenated to its input. Convolutions have no bias.
1,000,618 parameters for 10 classes.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from core.errors import check_int, check_int_list, check_number
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 32, 32)}


class Bottleneck(nn.Module):
    """One dense layer: adds ``growth_rate`` new channels to its input."""

    def __init__(self, in_planes: int, growth_rate: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, 4 * growth_rate, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth_rate)
        self.conv2 = nn.Conv2d(4 * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([out, x], dim=1)


class Transition(nn.Module):
    """BN-ReLU-conv1x1 to ``out_planes`` channels, then 2x2 average pooling."""

    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(in_planes)
        self.conv = nn.Conv2d(in_planes, out_planes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNet(nn.Module):
    """DenseNet-BC: dense blocks of bottleneck layers joined by compressing transitions."""

    def __init__(self, num_classes: int = 10, growth_rate: int = 12,
                 blocks: tuple[int, ...] = (6, 12, 24, 16), compression: float = 0.5,
                 in_channels: int = 3) -> None:
        super().__init__()
        planes = 2 * growth_rate
        self.conv1 = nn.Conv2d(in_channels, planes, 3, padding=1, bias=False)
        stages: list[nn.Module] = []
        for i, n_layers in enumerate(blocks):
            layers = []
            for _ in range(n_layers):
                layers.append(Bottleneck(planes, growth_rate))
                planes += growth_rate
            stages.append(nn.Sequential(*layers))
            if i < len(blocks) - 1:
                out_planes = math.floor(planes * compression)
                stages.append(Transition(planes, out_planes))
                planes = out_planes
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(planes)
        self.linear = nn.Linear(planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.features(self.conv1(x))
        out = F.adaptive_avg_pool2d(F.relu(self.bn(out)), 1).flatten(1)
        return self.linear(out)


@register("densenet")
def densenet(num_classes: int = 10, growth_rate: int = 12,
             blocks: tuple[int, ...] | list[int] = (6, 12, 24, 16), compression: float = 0.5,
             in_channels: int = 3) -> nn.Module:
    """DenseNet-BC for CIFAR (growth rate 12, blocks 6-12-24-16, compression 0.5 by default)."""
    check_io(num_classes, in_channels)
    check_int(growth_rate, "model.growth_rate", 1)
    check_int_list(blocks, "model.blocks", 4)
    check_number(compression, "model.compression", 0, 1, low_open=True)
    return DenseNet(num_classes=num_classes, growth_rate=growth_rate, blocks=tuple(blocks),
                    compression=compression, in_channels=in_channels)
