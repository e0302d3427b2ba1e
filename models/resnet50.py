"""ResNet-50 (He et al., 2016) for 224x224 ImageNet inputs, torchvision's layout.

Used for the ImageNet experiments of Accordion (Agarwal et al., MLSys 2021) and AdaComp (Chen et
al., AAAI 2018). Built from ``torchvision.models.resnet50`` with random initialisation (no
pretrained weights): 7x7 stride-2 stem with max-pool, stages of (3, 4, 6, 3) bottleneck blocks
(stride on the 3x3 convolution, "v1.5"), global average pooling and one linear layer;
25,557,032 parameters for 1000 classes.
"""

from __future__ import annotations

from torch import nn
from torchvision import models as tvm

from core.errors import check_bool
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 224, 224)}


@register("resnet50")
def resnet50(num_classes: int = 1000, zero_init_residual: bool = False,
             in_channels: int = 3) -> nn.Module:
    """torchvision ResNet-50, randomly initialised; ``in_channels`` replaces the stem conv."""
    check_io(num_classes, in_channels)
    check_bool(zero_init_residual, "model.zero_init_residual")
    model = tvm.resnet50(weights=None, num_classes=num_classes,
                         zero_init_residual=zero_init_residual)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model
