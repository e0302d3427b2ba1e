"""AdaComp's MNIST-CNN (Chen et al., AAAI 2018): a LeNet-5-like network for 1x28x28 digits.

The Caffe "LeNet" layout: conv 5x5 (20 channels) -> max-pool 2 -> conv 5x5 (50 channels) ->
max-pool 2 -> fully connected 500 -> ReLU -> fully connected to the classes; valid (unpadded)
convolutions, so the feature map is 50x4x4 before the first fully connected layer. A ReLU also
follows each pooling (parameter-free). 431,080 parameters for 10 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import check_int, check_int_list
from models import check_io, register

INPUT = {"kind": "image", "shape": (1, 28, 28)}


class MnistCNN(nn.Module):
    """Two 5x5 convolution + pooling stages and two fully connected layers."""

    def __init__(self, num_classes: int = 10, channels: tuple[int, int] = (20, 50),
                 hidden: int = 500, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
            nn.Conv2d(c1, c2, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        )
        side = ((image_size - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Linear(c2 * side * side, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


@register("mnist_cnn")
def mnist_cnn(num_classes: int = 10, channels: tuple[int, int] | list[int] = (20, 50),
              hidden: int = 500, in_channels: int = 1, image_size: int = 28) -> nn.Module:
    """AdaComp MNIST-CNN (LeNet-like: two 5x5 conv + pool stages, fc ``hidden``, fc classes)."""
    check_io(num_classes, in_channels)
    check_int_list(channels, "model.channels", 2)
    check_int(hidden, "model.hidden", 1)
    check_int(image_size, "model.image_size", 16)  # two 5x5 convs and 2x2 pools leave >= 1x1
    c1, c2 = channels
    return MnistCNN(num_classes=num_classes, channels=(c1, c2), hidden=hidden,
                    in_channels=in_channels, image_size=image_size)
