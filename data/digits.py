"""scikit-learn's handwritten digits as a tiny CIFAR-shaped dataset (embedded; no files needed).

The 1,797 real 8x8 grey-scale digits (UCI ML hand-written digits, shipped inside scikit-learn)
are scaled to [0, 1], upsampled to 32x32 bilinearly and repeated over three channels, so every
CIFAR network runs on them unchanged. The split is fixed: a permutation drawn with seed 0, the
first 1,437 images train and the remaining 360 test.

The file is read where scikit-learn keeps it, without importing scikit-learn (whose import
costs seconds of every run's start-up); the tests check it against ``load_digits``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from data import DataBundle, register

TRAIN_SIZE = 1437


def digits_file() -> Path:
    """``sklearn/datasets/data/digits.csv.gz``: 1,797 rows of 64 pixels (0..16), then the label."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.is_file():
        raise RuntimeError(f"scikit-learn's digits.csv.gz not found (looked for {path}); "
                           f"reinstall scikit-learn (a dependency of accordion-bench)")
    return path


def load() -> tuple[np.ndarray, np.ndarray]:
    """The digits as ``load_digits`` gives them: images (1797 x 8 x 8) and labels (1797,)."""
    table = np.loadtxt(digits_file(), delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


@register("digits", fixed={"task": "classification", "num_classes": 10,
                           "input_shape": [3, 32, 32]})
def build(cfg: Any) -> DataBundle:
    """Train/test :class:`TensorDataset` of 3x32x32 float images and int64 labels."""
    pixels, targets = load()
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(32, 32), mode="bilinear", align_corners=False)
    images = ((images - 0.5) / 0.5).repeat(1, 3, 1, 1)
    labels = torch.tensor(targets, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:TRAIN_SIZE], order[TRAIN_SIZE:]
    return DataBundle(
        task="classification",
        num_classes=10,
        train=TensorDataset(images[train], labels[train]),
        test=TensorDataset(images[test], labels[test]),
    )
