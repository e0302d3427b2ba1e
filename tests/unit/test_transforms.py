"""Augmentation and evaluation transforms as documented, checked on their outputs against
images computed here with PIL / NumPy: CIFAR's pad-4 crop and flip (plus CIFAR-100's rotation),
ImageNet's RandomResizedCrop 224 + flip and Resize 256 + CenterCrop 224, each dataset's
normalization.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import data
from tests.unit.test_data import CIFAR, CIFAR_MEAN_STD, config, write_cifar

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def normalize(pixels: np.ndarray, mean, std) -> torch.Tensor:
    """HWC uint8 -> CHW float, (x / 255 - mean) / std, as ToTensor + Normalize do."""
    x = torch.from_numpy(pixels.astype(np.float32) / 255).permute(2, 0, 1)
    return (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def cifar_candidates(image: np.ndarray, name: str) -> dict[tuple[int, int, bool], torch.Tensor]:
    """Every output of a pad-4 random 32x32 crop and a random horizontal flip of ``image``."""
    padded = np.zeros((40, 40, 3), dtype=np.uint8)
    padded[4:36, 4:36] = image
    out = {}
    for dy in range(9):
        for dx in range(9):
            crop = padded[dy:dy + 32, dx:dx + 32]
            for flip in (False, True):
                out[dy, dx, flip] = normalize(crop[:, ::-1] if flip else crop,
                                              *CIFAR_MEAN_STD[name])
    return out


def match(x: torch.Tensor, candidates: dict) -> tuple | None:
    for key, c in candidates.items():
        if torch.allclose(x, c, rtol=0, atol=1e-5):
            return key
    return None


def cifar_train(tmp_path: Path, name: str, **overrides):
    written = write_cifar(tmp_path, name)
    bundle = data.build(config(name, root=str(tmp_path), **overrides))
    first_file = CIFAR[name][1][0]
    image = written[first_file][0][0].reshape(3, 32, 32).transpose(1, 2, 0)  # HWC
    return bundle, image


def test_cifar10_training_images_are_padded_crops_and_flips(tmp_path):
    bundle, image = cifar_train(tmp_path, "cifar10")
    candidates = cifar_candidates(image, "cifar10")
    torch.manual_seed(0)
    seen = [match(bundle.train[0][0], candidates) for _ in range(60)]
    assert None not in seen  # every sample is one of the crops, flipped or not
    assert {flip for _, _, flip in seen} == {False, True}
    assert len({(dy, dx) for dy, dx, _ in seen}) >= 20  # offsets over the whole 9 x 9 range
    assert {dy for dy, _, _ in seen} >= {0, 8} or {dx for _, dx, _ in seen} >= {0, 8}


def test_cifar100_adds_the_rotation(tmp_path):
    bundle, image = cifar_train(tmp_path, "cifar100")
    candidates = cifar_candidates(image, "cifar100")
    torch.manual_seed(0)
    seen = [match(bundle.train[0][0], candidates) for _ in range(20)]
    assert seen.count(None) >= 15  # rotated: almost never a plain crop
    no_rotation, image = cifar_train(tmp_path / "plain", "cifar100", rotation=0)
    torch.manual_seed(0)
    assert all(match(no_rotation.train[0][0], candidates) is not None for _ in range(10))


def test_cifar_evaluation_is_normalization_only(tmp_path):
    written = write_cifar(tmp_path, "cifar100")
    bundle = data.build(config("cifar100", root=str(tmp_path)))
    image = written["test"][0][1].reshape(3, 32, 32).transpose(1, 2, 0)
    for _ in range(3):
        torch.testing.assert_close(bundle.test[1][0], normalize(image, *CIFAR_MEAN_STD["cifar100"]),
                                   rtol=0, atol=1e-5)


def write_imagenet(root: Path, pixels: dict[str, np.ndarray]) -> None:
    """One class folder ``c`` in train/ and val/, one PNG per entry of ``pixels``."""
    for split in ("train", "val"):
        folder = root / split / "c"
        folder.mkdir(parents=True)
        for name, array in pixels.items():
            Image.fromarray(array).save(folder / f"{name}.png")


def test_imagenet_evaluation_resizes_to_256_and_crops_the_center_224(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)  # H 300, W 400
    write_imagenet(tmp_path, {"a": pixels})
    bundle = data.build(config("imagenet", root=str(tmp_path), num_classes=1))
    # the shorter side to 256 (W 400 -> int(256 * 400 / 300) = 341), then the central 224 x 224
    resized = Image.fromarray(pixels).resize((341, 256), Image.BILINEAR)
    left, top = round((341 - 224) / 2), round((256 - 224) / 2)
    center = np.asarray(resized.crop((left, top, left + 224, top + 224)))
    x, y = bundle.test[0]
    assert y == 0
    torch.testing.assert_close(x, normalize(center, IMAGENET_MEAN, IMAGENET_STD), rtol=0,
                               atol=1e-5)


def test_imagenet_training_crops_resizes_flips_and_normalizes(tmp_path):
    flat = np.full((120, 160, 3), (200, 30, 90), dtype=np.uint8)
    ramp = np.repeat(np.linspace(0, 255, 160, dtype=np.uint8)[None, :, None], 120, 0)
    write_imagenet(tmp_path, {"a_flat": flat, "b_ramp": np.repeat(ramp, 3, 2)})
    bundle = data.build(config("imagenet", root=str(tmp_path), num_classes=1))
    # a flat image stays flat whatever the crop: its normalized color everywhere
    torch.manual_seed(0)
    x, _ = bundle.train[0]
    assert tuple(x.shape) == (3, 224, 224)
    torch.testing.assert_close(x, normalize(flat[:1, :1], IMAGENET_MEAN, IMAGENET_STD)
                               .expand(3, 224, 224), rtol=0, atol=1e-5)
    # a left-to-right ramp: random crops of it, some of them mirrored (bright on the left)
    samples = [bundle.train[1][0] for _ in range(30)]
    mirrored = [bool(s[:, :, :112].mean() > s[:, :, 112:].mean()) for s in samples]
    assert 5 <= sum(mirrored) <= 25
    assert len({round(float(s.mean()), 4) for s in samples}) >= 20  # crops of varied place/size


@pytest.mark.parametrize("name", ["cifar10", "imagenet"])
def test_evaluation_is_deterministic(tmp_path, name):
    if name == "cifar10":
        write_cifar(tmp_path, name)
        bundle = data.build(config(name, root=str(tmp_path)))
    else:
        write_imagenet(tmp_path, {"a": np.random.default_rng(1).integers(0, 256, (50, 70, 3),
                                                                           dtype=np.uint8)})
        bundle = data.build(config(name, root=str(tmp_path), num_classes=1))
    torch.manual_seed(0)
    first = bundle.test[0][0]
    torch.manual_seed(1)
    assert torch.equal(bundle.test[0][0], first)
