"""SE-ResNet-18 for 32x32 inputs (Hu et al., 2018), pre-activation CIFAR variant.

The layout of kuangliu/pytorch-cifar's ``SENet18``, used for the Accordion experiments (Agarwal et
al., MLSys 2021): a 3x3 stride-1 stem (conv, BN, ReLU), four stages of two pre-activation blocks
(64, 128, 256, 512 channels) and a linear layer after global average pooling. Each block is
BN-ReLU-conv3x3-BN-ReLU-conv3x3; a squeeze-and-excitation gate (global average pool, 1x1 conv down
by ``reduction``, ReLU, 1x1 conv up, sigmoid) rescales the residual branch's channels before the
shortcut is added. The shortcut is the identity, or a bias-free 1x1 convolution of the
pre-activated input when the shape changes. 11,260,354 parameters for 10 classes at ``width=64``
(``width`` scales every stage; tiny-scale runs use a narrow network).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from core.errors import check_int
from models import check_io, register
from models.resnet18 import ResNet18

INPUT = {"kind": "image", "shape": (3, 32, 32)}


class SqueezeExcite(nn.Module):
    """Channel gate: ``x * sigmoid(W2 relu(W1 mean_hw(x)))``."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)  # >= 1 channel in narrow (tiny-scale) networks
        self.down = nn.Conv2d(channels, hidden, 1)
        self.up = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.adaptive_avg_pool2d(x, 1)
        w = torch.sigmoid(self.up(F.relu(self.down(w))))
        return x * w


class PreActSEBlock(nn.Module):
    """Pre-activation basic block whose residual branch is gated by squeeze-excitation."""

    def __init__(self, in_planes: int, planes: int, stride: int, reduction: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.se = SqueezeExcite(planes, reduction)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        return self.se(out) + skip


@register("senet18")
def senet18(num_classes: int = 10, reduction: int = 16, in_channels: int = 3, width: int = 64
            ) -> nn.Module:
    """Pre-activation SE-ResNet-18, CIFAR variant (SE reduction ``reduction``)."""
    check_io(num_classes, in_channels)
    check_int(width, "model.width", 1)
    check_int(reduction, "model.reduction", 1)  # a squeeze keeps >= 1 channel (SqueezeExcite)
    block = partial(PreActSEBlock, reduction=reduction)
    return ResNet18(num_classes=num_classes, width=width, in_channels=in_channels, block=block)
