"""AdaComp's CIFAR10-CNN (Chen et al., AAAI 2018): a small cuda-convnet style network for 3x32x32.

The cuda-convnet / Caffe "cifar10_full" layout: three 5x5 convolutions with padding 2 (32, 32 and
64 channels), each with a ReLU and a 3x3 stride-2 pooling (max after the first, average after the
other two; Caffe's ceil rounding, 32 -> 16 -> 8 -> 4), then one fully connected layer from the
64x4x4 map to the classes. The parameter-free local response normalisation of the original is
omitted. 89,578 parameters for 10 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import check_int_list
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 32, 32)}


class Cifar10CNN(nn.Module):
    """conv5x5-maxpool-ReLU, conv5x5-ReLU-avgpool, conv5x5-ReLU-avgpool, linear."""

    def __init__(self, num_classes: int = 10, channels: tuple[int, int, int] = (32, 32, 64),
                 in_channels: int = 3) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2),
            nn.MaxPool2d(3, stride=2, ceil_mode=True), nn.ReLU(inplace=True),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True),
            nn.AvgPool2d(3, stride=2, ceil_mode=True),
            nn.Conv2d(c2, c3, 5, padding=2), nn.ReLU(inplace=True),
            nn.AvgPool2d(3, stride=2, ceil_mode=True),
        )
        self.linear = nn.Linear(c3 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x).flatten(1))


@register("cifar10_cnn")
def cifar10_cnn(num_classes: int = 10, channels: tuple[int, int, int] | list[int] = (32, 32, 64),
                in_channels: int = 3) -> nn.Module:
    """AdaComp CIFAR10-CNN (three 5x5 conv layers of 32, 32, 64 channels with pooling, one fc)."""
    check_io(num_classes, in_channels)
    check_int_list(channels, "model.channels", 3)
    c1, c2, c3 = channels
    return Cifar10CNN(num_classes=num_classes, channels=(c1, c2, c3), in_channels=in_channels)
