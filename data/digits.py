"""scikit-learn's handwritten digits as a tiny CIFAR-shaped dataset (embedded; no files needed).

The 1,797 real 8x8 grey-scale digits (UCI ML hand-written digits, shipped inside scikit-learn)
are scaled to [0, 1], upsampled to 32x32 bilinearly and repeated over three channels, so every
CIFAR network runs on them unchanged. The split is fixed: a permutation drawn with seed 0, the
first 1,437 images train and the remaining 360 test.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from data import DataBundle, register

TRAIN_SIZE = 1437


@register("digits", fixed={"task": "classification", "num_classes": 10,
                           "input_shape": [3, 32, 32]})
def build(cfg: Any) -> DataBundle:
    """Train/test :class:`TensorDataset` of 3x32x32 float images and int64 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
    images = ((images - 0.5) / 0.5).repeat(1, 3, 1, 1)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:TRAIN_SIZE], order[TRAIN_SIZE:]
    return DataBundle(
        task="classification",
        num_classes=10,
        train=TensorDataset(images[train], labels[train]),
        test=TensorDataset(images[test], labels[test]),
    )
