"""CIFAR-10 and CIFAR-100 from torchvision's on-disk format (the python pickle batches).

``root`` must hold ``cifar-10-batches-py/`` (or ``cifar-100-python/``) as extracted from the
official archives; ``download: true`` lets torchvision fetch them (needs internet). Training
augmentation is the standard pad-4 random crop plus horizontal flip; ``rotation`` adds a random
rotation of that many degrees (the Accordion authors use 15 for CIFAR-100).

The batches are read here rather than by torchvision's constructor, which insists on the official
md5 sums (so it rejects any other files, e.g. the tiny ones the tests write) and reports a corrupt
pickle as a bare traceback. Instead every file is checked for what the training needs: a dict with
``data`` (N x 3072 uint8) and N labels in range, and a corrupt or truncated file is a
:class:`ConfigError` that names it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
from torchvision import datasets, transforms
from torchvision.datasets.vision import VisionDataset

from core.errors import ConfigError, check_number
from data import DataBundle, check_classes, one_line, register, root_dir

_MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _unpickle(path: Path) -> Any:
    """The object pickled in ``path`` (latin1, as the official batches need); str dict keys."""
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
    except Exception as exc:  # a corrupt pickle can raise almost anything
        raise ConfigError(
            f"{path}: corrupt or truncated CIFAR file ({type(exc).__name__}: {one_line(exc)}); "
            f"re-extract it from the official archive"
        ) from exc
    if isinstance(entry, dict):  # keys are str in the official (Python 2) files, bytes if re-saved
        entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    return entry


class _CifarFiles(VisionDataset):
    """Reads the pickle batches of a torchvision CIFAR class, without its md5 checks."""

    base_folder: str
    train_list: list[list[str]]
    test_list: list[list[str]]
    meta: dict[str, str]
    num_classes: int

    def __init__(self, root: str, train: bool, transform: Any = None,
                 download: bool = False) -> None:
        # Not super(): next in the MRO is the torchvision class, whose __init__ checks md5s.
        VisionDataset.__init__(self, root, transform=transform)
        self.train = train
        if download:
            self.download()  # type: ignore[attr-defined]  # torchvision's, md5-checked
        folder = Path(root) / self.base_folder
        data, targets = [], []
        for name, _ in self.train_list if train else self.test_list:
            images, labels = self._read_batch(folder / name)
            data.append(images)
            targets.extend(labels)
        self.data = np.concatenate(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
        self.targets = targets
        meta_path = folder / self.meta["filename"]
        meta = _unpickle(meta_path)
        if not isinstance(meta, dict) or len(meta.get(self.meta["key"], ())) != self.num_classes:
            raise ConfigError(f"{meta_path}: expected a dict with {self.num_classes} "
                              f"{self.meta['key']!r}; the file is corrupt")
        self.classes = list(meta[self.meta["key"]])
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def _read_batch(self, path: Path) -> tuple[np.ndarray, list[int]]:
        """Images (N x 3072 uint8) and labels of one batch file, validated."""
        entry = _unpickle(path)
        key = "labels" if isinstance(entry, dict) and "labels" in entry else "fine_labels"
        if not isinstance(entry, dict) or "data" not in entry or key not in entry:
            raise ConfigError(
                f"{path}: expected a dict with 'data' and '{key}'; the file is corrupt"
            )
        images, labels = entry["data"], np.asarray(entry[key])
        if (not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 2
                or images.shape[1] != 3072 or labels.shape != (len(images),)):
            shape = getattr(images, "shape", None)
            raise ConfigError(f"{path}: expected 'data' of uint8 N x 3072 and N labels, got data "
                              f"{shape} and labels {labels.shape}; the file is corrupt")
        if len(labels) and (labels.dtype.kind not in "iu" or labels.min() < 0
                            or labels.max() >= self.num_classes):
            raise ConfigError(f"{path}: labels outside 0..{self.num_classes - 1}; corrupt file")
        return images, labels.tolist()


class _Cifar10(_CifarFiles, datasets.CIFAR10):
    num_classes = 10


class _Cifar100(_CifarFiles, datasets.CIFAR100):
    num_classes = 100


_CLASSES: dict[str, type[_CifarFiles]] = {"cifar10": _Cifar10, "cifar100": _Cifar100}


def _check(cfg: Any) -> None:
    cls = _CLASSES[cfg.name]
    if check_classes(cfg.get("num_classes")) != cls.num_classes:
        raise ConfigError(f"dataset.num_classes: {cfg.name} has {cls.num_classes} classes (this "
                          f"key describes the data and cannot be changed), got {cfg.num_classes}")
    check_number(cfg.get("rotation", 0), "dataset.rotation", 0, 180)
    folder = root_dir(cfg) / cls.base_folder
    if cfg.get("download"):
        return
    files = [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            f"dataset.root: {folder / missing[0]} not found; expected the "
            f"extracted python version of {cfg.name} under {folder}/ (get it from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html or set dataset.download=true)"
        )


@register("cifar10", "cifar100", check=_check,
          fixed={"task": "classification", "input_shape": [3, 32, 32]})
def build(cfg: Any) -> DataBundle:
    """Train/test torchvision CIFAR datasets with the standard augmentation."""
    cls = _CLASSES[cfg.name]
    mean, std = _MEAN_STD[cfg.name]
    normalize = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    augment = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
    if cfg.get("rotation"):
        augment.append(transforms.RandomRotation(float(cfg.rotation)))
    download = bool(cfg.get("download"))
    try:
        train = cls(cfg.root, train=True, download=download,
                    transform=transforms.Compose(augment + normalize))
        test = cls(cfg.root, train=False, download=download,
                   transform=transforms.Compose(normalize))
    except (RuntimeError, OSError) as exc:  # download failures, unreadable files
        raise ConfigError(
            f"dataset.root: cannot read {cfg.name} under {cfg.root}: {one_line(exc)}"
        ) from exc
    return DataBundle("classification", cls.num_classes, train, test)
