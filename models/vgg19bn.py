"""VGG-19 with BatchNorm for 32x32 inputs (Simonyan & Zisserman, 2015; Ioffe & Szegedy, 2015).

Configuration "E" (sixteen 3x3 convolutions in five stages of 64, 128, 256, 512 and 512 channels,
each convolution followed by BatchNorm and ReLU, each stage by a 2x2 max-pool) leaves a 512x1x1
feature map for a 32x32 image. The classifier follows the Accordion authors' code (Agarwal et al.,
MLSys 2021), which used two heads:

* ``classifier="cifar10"``: dropout, 512 -> 512, ReLU, dropout, 512 -> 512, ReLU, 512 -> classes
  (20,565,834 parameters for 10 classes);
* ``classifier="cifar100"``: the same with 4096 hidden units and a dropout before the last layer
  (39,327,652 parameters for 100 classes).

Every dropout drops with probability ``dropout`` (0.5, as in the authors' code; 0 at tiny scale:
conf/size/tiny/vgg19bn.yaml).

Convolutions keep their bias and get He-normal initialisation (fan-out), as in the authors' code.
``width`` scales every convolution and the head by ``width / 64`` (64 = the paper's network;
tiny-scale runs use a narrow one).
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import check_choice, check_int, check_number
from models import check_io, register

INPUT = {"kind": "image", "shape": (3, 32, 32)}

# Channels per convolution; "M" is a 2x2 max-pool (VGG configuration "E").
_CFG_E: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
    512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
)
_HIDDEN = {"cifar10": 512, "cifar100": 4096}


def _scaled(channels: int, width: int) -> int:
    """``channels`` of the paper's network (width 64) at ``width``, at least 1."""
    return max(1, channels * width // 64)


def _features(in_channels: int, width: int) -> nn.Sequential:
    """The convolutional trunk of configuration "E" with BatchNorm after every convolution."""
    layers: list[nn.Module] = []
    channels = in_channels
    for v in _CFG_E:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            assert isinstance(v, int)
            out = _scaled(v, width)
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True)]
            channels = out
    return nn.Sequential(*layers)


class VGG19BN(nn.Module):
    """VGG-19-BN trunk plus a three-layer fully connected head of width ``hidden``."""

    def __init__(self, num_classes: int = 10, hidden: int = 512, in_channels: int = 3,
                 final_dropout: bool = False, width: int = 64, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = _features(in_channels, width)
        hidden = _scaled(hidden, width)
        head: list[nn.Module] = [
            nn.Dropout(dropout), nn.Linear(_scaled(512, width), hidden), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
        ]
        if final_dropout:
            head.append(nn.Dropout(dropout))
        head.append(nn.Linear(hidden, num_classes))
        self.classifier = nn.Sequential(*head)
        for m in self.features.modules():
            if isinstance(m, nn.Conv2d):  # He initialisation, as in the authors' code
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


@register("vgg19bn")
def vgg19bn(num_classes: int = 10, classifier: str = "cifar10", in_channels: int = 3,
            width: int = 64, dropout: float = 0.5) -> nn.Module:
    """VGG-19-BN for CIFAR; ``classifier`` picks the authors' "cifar10" or "cifar100" head."""
    check_io(num_classes, in_channels)
    check_choice(classifier, "model.classifier", tuple(sorted(_HIDDEN)))
    check_int(width, "model.width", 1)
    check_number(dropout, "model.dropout", 0, 1, high_open=True)
    return VGG19BN(num_classes=num_classes, hidden=_HIDDEN[classifier], in_channels=in_channels,
                   final_dropout=classifier == "cifar100", width=width, dropout=dropout)
