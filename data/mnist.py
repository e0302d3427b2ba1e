"""MNIST from the four official idx files, in torchvision's layout.

``root/MNIST/raw/`` must hold ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each either as is or gzipped
(``.gz``, as distributed); ``download: true`` lets torchvision fetch them (needs internet). The
files are parsed here (torchvision reads only the uncompressed ones, and reports a damaged file
as a bare traceback): magic numbers 2051 (images, ``N x 28 x 28`` uint8) and 2049 (labels, ``N``
uint8 in 0..9), big-endian dimensions. Images come as 1x28x28 float tensors normalized with the
usual mean 0.1307 and std 0.3081; there is no augmentation (as in AdaComp's MNIST runs).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError
from data import DataBundle, one_line, register, root_dir

MEAN, STD = 0.1307, 0.3081
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


class MnistImages(Dataset):
    """``(1x28x28 normalized float image, int label)`` pairs, kept as uint8 until indexed."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = (self.images[index].unsqueeze(0).float() / 255.0 - MEAN) / STD
        return image, int(self.labels[index])


def _raw(cfg: Any) -> Path:
    return root_dir(cfg) / "MNIST" / "raw"


def _find(raw: Path, name: str) -> Path | None:
    """``raw/name``, else ``raw/name.gz``, else None."""
    for path in (raw / name, raw / f"{name}.gz"):
        if path.is_file():
            return path
    return None


def _check(cfg: Any) -> None:
    if not cfg.get("download"):
        _check_files(_raw(cfg))


def _check_files(raw: Path) -> None:
    for name in _FILES["train"] + _FILES["test"]:
        if _find(raw, name) is None:
            raise ConfigError(
                f"dataset.root: {raw / name} (or {name}.gz) not found; expected the four MNIST "
                f"idx files under {raw}/ (torchvision layout; get them from "
                f"https://yann.lecun.com/exdb/mnist/ or a mirror, or set dataset.download=true)"
            )


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The array in idx file ``path`` (gzipped if it ends in .gz), whose magic must be ``magic``."""
    try:
        blob = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ConfigError(f"{path}: cannot read ({one_line(exc)}); the file is corrupt") from exc
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(blob) < header or struct.unpack(">i", blob[:4])[0] != magic:
        found = struct.unpack(">i", blob[:4])[0] if len(blob) >= 4 else None
        raise ConfigError(f"{path}: not an idx file with magic number {magic} (found {found}); "
                          f"the file is corrupt or not MNIST")
    dims = struct.unpack(f">{ndim}i", blob[4:header])
    size = int(np.prod(dims))
    if len(blob) - header != size:
        raise ConfigError(f"{path}: header says {size} bytes of data for shape {list(dims)}, "
                          f"file has {len(blob) - header}; the file is truncated or corrupt")
    return np.frombuffer(blob, dtype=np.uint8, offset=header).reshape(dims)


def _split(raw: Path, split: str) -> MnistImages:
    image_name, label_name = _FILES[split]
    image_path, label_path = _find(raw, image_name), _find(raw, label_name)
    assert image_path is not None and label_path is not None  # _check ran
    images = read_idx(image_path, _IMAGES_MAGIC)
    labels = read_idx(label_path, _LABELS_MAGIC)
    if images.shape[1:] != (28, 28):
        raise ConfigError(f"{image_path}: expected 28x28 images, got {list(images.shape[1:])}")
    if len(images) != len(labels):
        raise ConfigError(f"{label_path}: {len(labels)} labels for {len(images)} images in "
                          f"{image_path}; one of the files is truncated or they do not match")
    if len(labels) and labels.max() > 9:
        raise ConfigError(f"{label_path}: label {labels.max()} outside 0..9; the file is corrupt")
    return MnistImages(torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64)))


@register("mnist", check=_check, fixed={"task": "classification", "num_classes": 10,
                                        "input_shape": [1, 28, 28]})
def build(cfg: Any) -> DataBundle:
    """Train (60,000) and test (10,000) :class:`MnistImages`."""
    if cfg.get("download"):
        from torchvision import datasets

        try:
            for train in (True, False):
                datasets.MNIST(cfg.root, train=train, download=True)
        except (RuntimeError, OSError) as exc:
            raise ConfigError(f"dataset.download: cannot fetch MNIST into {_raw(cfg)}: "
                              f"{one_line(exc)}") from exc
    raw = _raw(cfg)
    _check_files(raw)
    return DataBundle("classification", 10, _split(raw, "train"), _split(raw, "test"))
