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

from core.errors import check_int, check_int_list, check_number
from data import DataBundle, check_classes, register


def _check(cfg: Any) -> None:
    for field in ("train_size", "test_size"):
        check_int(cfg[field], f"dataset.{field}", 1)
    check_classes(cfg.num_classes)
    check_int_list(cfg.input_shape, "dataset.input_shape", 3)  # [channels, height, width]
    check_number(cfg.noise, "dataset.noise", 0)


@register("synthetic", check=_check, fixed={"task": "classification"})
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
