"""AlexNet (Krizhevsky et al., 2012) for 224x224 ImageNet inputs, torchvision's single-tower layout.

Used for the ImageNet experiments of AdaComp (Chen et al., AAAI 2018). Built from
``torchvision.models.alexnet`` with random initialisation (no pretrained weights): five
convolutions (64, 192, 384, 256, 256 channels), adaptive 6x6 average pooling, and a
dropout-4096-4096-classes head; 61,100,840 parameters for 1000 classes.
"""

from __future__ import annotations

from torch import nn
from torchvision import models as tvm

from core.errors import check_number
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 224, 224)}


@register("alexnet")
def alexnet(num_classes: int = 1000, dropout: float = 0.5, in_channels: int = 3) -> nn.Module:
    """torchvision AlexNet, randomly initialised; ``in_channels`` replaces the first convolution."""
    check_io(num_classes, in_channels)
    check_number(dropout, "model.dropout", 0, 1, high_open=True)
    model = tvm.alexnet(weights=None, num_classes=num_classes, dropout=dropout)
    if in_channels != 3:
        first = model.features[0]
        assert isinstance(first, nn.Conv2d)
        model.features[0] = nn.Conv2d(in_channels, first.out_channels, first.kernel_size,
                                      stride=first.stride, padding=first.padding)
    return model
