"""Generated images with learnable class structure (embedded; no files needed).

Each class c has a fixed random template T_c (standard normal, one per class, drawn from
``seed``); an example of class c is T_c + noise * N(0, I). With ``noise`` around 1 a CNN learns
the classes in a few epochs, while a constant predictor stays at 1/num_classes accuracy. Labels
cycle through the classes, so every class is equally frequent. Shape and class count are free.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError
from data import DataBundle, register


def _check(cfg: Any) -> None:
    for field in ("train_size", "test_size", "num_classes"):
        if int(cfg[field]) < 1:
            raise ConfigError(f"dataset.{field}: expected an integer >= 1, got {cfg[field]}")
    shape = list(cfg.input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"dataset.input_shape: expected [channels, height, width], got {shape}")
    if float(cfg.noise) < 0:
        raise ConfigError(f"dataset.noise: expected a number >= 0, got {cfg.noise}")


@register("synthetic", check=_check)
def build(cfg: Any) -> DataBundle:
    """Train/test :class:`TensorDataset` of templates plus Gaussian noise."""
    gen = torch.Generator().manual_seed(int(cfg.seed))
    num_classes, shape = int(cfg.num_classes), tuple(cfg.input_shape)
    templates = torch.randn((num_classes, *shape), generator=gen)

    def draw(n: int) -> TensorDataset:
        labels = torch.arange(n) % num_classes
        noise = torch.randn((n, *shape), generator=gen) * float(cfg.noise)
        return TensorDataset(templates[labels] + noise, labels)

    train = draw(int(cfg.train_size))
    return DataBundle("classification", num_classes, train, draw(int(cfg.test_size)))
