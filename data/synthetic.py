"""Generated images with learnable class structure (embedded; no files needed).

Each class c has ``modes`` fixed random templates T_{c,1..modes} (drawn from ``seed``); an
example of class c is one of its templates, picked at random, cyclically shifted by up to
``shift`` pixels in each direction, plus ``noise`` * N(0, I). A template is standard normal noise
at ``smooth`` x ``smooth`` pixels, upsampled (bilinear) to the image size and rescaled to unit
variance; ``smooth: null`` draws it at full resolution. Labels cycle through the classes, so
every class is equally frequent; ``label_noise`` replaces that fraction of the *training* labels
by a uniformly drawn class (the test labels stay clean).

With the defaults (one full-resolution template per class, no shift) the classes are separable by
template matching, a linear problem a CNN learns in a few epochs. Several smooth templates per
class, shifts and label noise make a task that a small CNN learns only gradually, the regime in
which how well gradients are communicated shows in the accuracy (the tiny-scale sweeps use it;
see conf/recipe/).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from core.errors import check_int, check_int_list, check_number
from data import DataBundle, check_classes, register


def _check(cfg: Any) -> None:
    for field in ("train_size", "test_size"):
        check_int(cfg[field], f"dataset.{field}", 1)
    check_classes(cfg.num_classes)
    shape = check_int_list(cfg.input_shape, "dataset.input_shape", 3)  # [channels, height, width]
    check_number(cfg.noise, "dataset.noise", 0)
    check_int(cfg.get("modes", 1), "dataset.modes", 1)
    check_int(cfg.get("shift", 0), "dataset.shift", 0)
    if cfg.get("smooth") is not None:
        check_int(cfg.smooth, "dataset.smooth", 1, min(shape[1:]))  # at most the image size
    check_number(cfg.get("label_noise", 0.0), "dataset.label_noise", 0, 1)


def _templates(gen: torch.Generator, count: int, shape: tuple[int, ...], smooth: int | None
               ) -> torch.Tensor:
    """``count`` unit-variance templates of ``shape``, smooth at ``smooth`` x ``smooth``."""
    if smooth is None:
        return torch.randn((count, *shape), generator=gen)
    coarse = torch.randn((count, shape[0], smooth, smooth), generator=gen)
    fine = F.interpolate(coarse, size=tuple(shape[1:]), mode="bilinear", align_corners=False)
    return fine / fine.flatten(1).std(dim=1).view(-1, 1, 1, 1)


@register("synthetic", check=_check, fixed={"task": "classification"})
def build(cfg: Any) -> DataBundle:
    """Train/test :class:`TensorDataset` of shifted class templates plus Gaussian noise."""
    gen = torch.Generator().manual_seed(int(cfg.seed))
    num_classes, shape = int(cfg.num_classes), tuple(cfg.input_shape)
    modes, shift = int(cfg.get("modes", 1)), int(cfg.get("shift", 0))
    smooth = cfg.get("smooth")
    templates = _templates(gen, num_classes * modes, shape, None if smooth is None else int(smooth))

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(n) % num_classes
        mode = torch.randint(modes, (n,), generator=gen) if modes > 1 else 0
        x = templates[labels * modes + mode]
        if shift:
            offsets = torch.randint(-shift, shift + 1, (n, 2), generator=gen).tolist()
            x = torch.stack([img.roll((dy, dx), dims=(1, 2)) for img, (dy, dx) in
                             zip(x, offsets, strict=True)])
        return x + torch.randn((n, *shape), generator=gen) * float(cfg.noise), labels

    x, y = draw(int(cfg.train_size))
    if float(cfg.get("label_noise", 0.0)) > 0:
        noisy = torch.rand(len(y), generator=gen) < float(cfg.label_noise)
        y = torch.where(noisy, torch.randint(num_classes, (len(y),), generator=gen), y)
    return DataBundle("classification", num_classes, TensorDataset(x, y),
                      TensorDataset(*draw(int(cfg.test_size))))
