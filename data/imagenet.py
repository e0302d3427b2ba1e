"""ImageNet (ILSVRC 2012) as two class-folder trees, read with torchvision's ImageFolder.

``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG``: the official validation images
come in one flat folder and must first be sorted into the same class folders as train (e.g. with
the widely used ``valprep.sh``). Both trees must have the same class folders, which are numbered
in sorted order (ImageFolder's rule), and their count must equal ``num_classes`` (1000 for the
full set), so a partial copy fails before training. Training augmentation is the standard
RandomResizedCrop(224) plus horizontal flip; evaluation is Resize(256) plus CenterCrop(224); both
normalize with the usual ImageNet mean and std. A file that does not decode is a
:class:`ConfigError` naming it, raised when that image is loaded (ImageFolder loads lazily).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PIL import Image
from torchvision import datasets, transforms

from core.errors import ConfigError
from data import DataBundle, check_classes, one_line, register, root_dir

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_HOW = ("expected ImageNet as class folders <root>/train/<class>/*.JPEG and "
        "<root>/val/<class>/*.JPEG (get ILSVRC2012 from https://image-net.org/download and sort "
        "the val images into class folders, e.g. with valprep.sh)")


def _classes(folder: Path) -> list[str]:
    """Sorted names of the class sub-folders of ``folder`` (ConfigError if none or no folder)."""
    if not folder.is_dir():
        raise ConfigError(f"dataset.root: {folder} not found; {_HOW}")
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if e.is_dir())
    if not names:
        raise ConfigError(f"dataset.root: {folder} has no class sub-folders; {_HOW}")
    return names


def _check(cfg: Any) -> None:
    check_classes(cfg.get("num_classes"), optional=True)
    root = root_dir(cfg)
    train, val = _classes(root / "train"), _classes(root / "val")
    if train != val:
        only = sorted(set(train) ^ set(val))
        raise ConfigError(f"dataset.root: {root}/train and {root}/val have different class folders "
                          f"(e.g. {only[0]!r} is in only one); {_HOW}")
    if cfg.get("num_classes") is not None and int(cfg.num_classes) != len(train):
        raise ConfigError(f"dataset.num_classes: {cfg.num_classes} but {root}/train has "
                          f"{len(train)} class folders; use the full dataset or set "
                          f"dataset.num_classes={len(train)}")


def load_image(path: str) -> Image.Image:
    """The RGB image at ``path``; a :class:`ConfigError` naming it if it does not decode."""
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:  # PIL.UnidentifiedImageError is an OSError
        raise ConfigError(
            f"{path}: cannot decode image ({one_line(exc)}); the file is corrupt"
        ) from exc


def _folder(path: Path, transform: transforms.Compose) -> datasets.ImageFolder:
    try:
        return datasets.ImageFolder(str(path), transform=transform, loader=load_image)
    except OSError as exc:  # e.g. FileNotFoundError: a class folder without any image
        raise ConfigError(f"dataset.root: cannot read {path}: {one_line(exc)}; {_HOW}") from exc


@register("imagenet", check=_check, fixed={"task": "classification", "input_shape": [3, 224, 224]})
def build(cfg: Any) -> DataBundle:
    """Train/val :class:`~torchvision.datasets.ImageFolder` with the standard transforms."""
    root = Path(cfg.root)
    normalize = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    train = _folder(root / "train", transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), *normalize]))
    val = _folder(root / "val", transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), *normalize]))
    return DataBundle("classification", len(train.classes), train, val)
