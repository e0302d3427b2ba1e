"""Dataset loaders: each file-based one reads tiny files written here in the official format.

Configs are the real ``conf/dataset/<name>.yaml`` with ``root`` (and a few sizes) overridden.
"""

from __future__ import annotations

import gzip
import math
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image

import data
from core.errors import ConfigError
from data import synthetic_text
from tests.conftest import ROOT

CONF = Path(__file__).resolve().parents[2] / "conf" / "dataset"
FILE_BASED = ["cifar10", "cifar100", "mnist", "imagenet", "wikitext2", "shakespeare"]


def config(name: str, **overrides: Any) -> DictConfig:
    """``conf/dataset/<name>.yaml`` with ``overrides`` merged in."""
    return OmegaConf.merge(OmegaConf.load(CONF / f"{name}.yaml"), overrides)  # type: ignore[return-value]


def config_error(cfg: DictConfig, *fragments: str, build: bool = True) -> str:
    """Build (or check) ``cfg``, expect a one-line ConfigError containing every fragment."""
    with pytest.raises(ConfigError) as info:
        data.build(cfg) if build else data.check(cfg)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------------------------------------
# registry and yaml files


def test_every_yaml_is_registered_and_documents_the_common_keys() -> None:
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert set(FILE_BASED + ["synthetic_text"]) <= set(names)
    assert set(names) <= set(data.available())
    for name in names:
        cfg = OmegaConf.load(CONF / f"{name}.yaml")
        assert cfg.name == name
        for key in ("name", "root", "subset", "task", "num_classes"):
            assert key in cfg, (name, key)
        if cfg.task == "classification":
            assert len(cfg.input_shape) == 3, name
        else:
            assert cfg.task == "language_model", name


@pytest.mark.parametrize("name", FILE_BASED)
def test_missing_files_name_the_expected_path(tmp_path: Path, name: str) -> None:
    config_error(config(name, root=str(tmp_path)), "dataset.root", str(tmp_path), build=False)


def test_digits_are_scikit_learns() -> None:
    # Read from scikit-learn's file without importing it: the same arrays as load_digits.
    from sklearn.datasets import load_digits

    from data import digits

    images, labels = digits.load()
    reference = load_digits()
    assert np.array_equal(images, reference.images) and np.array_equal(labels, reference.target)


def test_only_the_dataset_and_model_in_use_are_imported() -> None:
    # torchvision (CIFAR, ImageNet, MNIST, AlexNet, ResNet-50) and scikit-learn cost seconds of
    # every run's start-up: a digits / ResNet-18 run checks and builds without them.
    code = ("import sys; from omegaconf import OmegaConf; import data, models; "
            "cfg = OmegaConf.load('conf/dataset/digits.yaml'); data.check(cfg); "
            "models.check(OmegaConf.create({'name': 'resnet18', 'num_classes': 10})); "
            "data.build(cfg); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torchvision', 'sklearn'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"]


@pytest.mark.parametrize("name", FILE_BASED)
def test_a_file_dataset_refuses_a_null_root(name: str) -> None:
    config_error(config(name, root=None), "dataset.root", "read from files", build=False)


# ---------------------------------------------------------------------------------------------
# CIFAR

CIFAR = {
    "cifar10": ("cifar-10-batches-py",
                ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"],
                "test_batch", "batches.meta", "labels", "label_names", 10),
    "cifar100": ("cifar-100-python", ["train"], "test", "meta", "fine_labels",
                 "fine_label_names", 100),
}
CIFAR_MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class Python2Pickler(pickle._Pickler):  # the pure-Python pickler, whose opcodes can be chosen
    """Pickles ``bytes`` as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as cPickle wrote
    the official batches: Python 3 decodes those with ``pickle.load``'s ``encoding``, the raw
    pixels of a numpy array included (which only latin1 maps back byte for byte)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_python2_str(self, obj: bytes) -> None:
        n = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([n]) if n < 256
                   else pickle.BINSTRING + struct.pack("<i", n))
        self.write(obj)
        self.memoize(obj)

    dispatch[bytes] = save_python2_str


def dump_cifar(path: Path, entry: Any, python2: bool = False) -> None:
    with open(path, "wb") as f:
        (Python2Pickler(f, protocol=2) if python2 else pickle.Pickler(f, protocol=2)).dump(entry)


def write_cifar(root: Path, name: str, per_file: int = 4, keys: str = "bytes") -> dict:
    """Pickle batches like the official ones; returns {file: (data, labels)}. ``keys``: "bytes"
    (re-saved by Python 3), "str", or "python2" (bytes keys and pixels as Python 2 str)."""
    folder_name, train_files, test_file, meta_file, label_key, names_key, classes = CIFAR[name]
    folder = root / folder_name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(len(name))
    key = (lambda k: k) if keys == "str" else (lambda k: k.encode())
    text = (lambda s: s.encode()) if keys == "python2" else (lambda s: s)  # Python 2 str
    written = {}
    for file in [*train_files, test_file]:
        images = rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)
        labels = [int(y) for y in rng.integers(0, classes, per_file)]
        dump_cifar(folder / file, {key("batch_label"): text(file), key(label_key): labels,
                                   key("data"): images}, python2=keys == "python2")
        written[file] = (images, labels)
    dump_cifar(folder / meta_file, {key(names_key): [text(f"class{i}") for i in range(classes)]},
               python2=keys == "python2")
    return written


@pytest.mark.parametrize("name,keys", [("cifar10", "bytes"), ("cifar100", "str"),
                                       ("cifar10", "python2"), ("cifar100", "python2")])
def test_cifar_reads_official_pickles(tmp_path: Path, name: str, keys: str) -> None:
    written = write_cifar(tmp_path, name, keys=keys)
    _, train_files, test_file, _, _, _, classes = CIFAR[name]
    bundle = data.build(config(name, root=str(tmp_path)))
    assert bundle.task == "classification" and bundle.num_classes == classes
    assert len(bundle.train) == 4 * len(train_files) and len(bundle.test) == 4
    train_labels = [y for f in train_files for y in written[f][1]]
    assert [bundle.train[i][1] for i in range(len(bundle.train))] == train_labels
    # The test transform is only normalization: pixels must come back in channel-major layout.
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in CIFAR_MEAN_STD[name])
    images, labels = written[test_file]
    for i in range(4):
        x, y = bundle.test[i]
        expected = (torch.from_numpy(images[i].reshape(3, 32, 32)).float() / 255 - mean) / std
        assert y == labels[i]
        torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    # Training images are augmented (crop, flip, rotation for CIFAR-100) but keep their shape.
    x, _ = bundle.train[0]
    assert tuple(x.shape) == tuple(config(name).input_shape) == (3, 32, 32)
    # torchvision's attributes, as its own CIFAR classes set them.
    names = [f"class{i}" for i in range(classes)]
    for dataset, train in ((bundle.train, True), (bundle.test, False)):
        assert dataset.train is train and dataset.root == str(tmp_path)  # type: ignore[union-attr]
        assert dataset.classes == names  # type: ignore[union-attr]
        assert dataset.class_to_idx == {n: i for i, n in enumerate(names)}  # type: ignore[union-attr]
    assert "Split: Train" in repr(bundle.train) and "Split: Test" in repr(bundle.test)


def test_cifar_subset(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar10")
    bundle = data.build(config("cifar10", root=str(tmp_path), subset=3))
    assert len(bundle.train) == 3 and len(bundle.test) == 4
    for bad in (0, -2):
        config_error(config("cifar10", root=str(tmp_path), subset=bad), "dataset.subset")
    config_error(config("cifar10", root=str(tmp_path), subset=21), "dataset.subset", "20")


def test_test_subset_keeps_the_first_test_examples(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar10")
    whole = data.build(config("cifar10", root=str(tmp_path)))
    bundle = data.build(config("cifar10", root=str(tmp_path), test_subset=3))
    assert len(bundle.train) == len(whole.train) and len(bundle.test) == 3
    for i in range(3):
        assert torch.equal(bundle.test[i][0], whole.test[i][0])
    for bad in (0, -2):
        config_error(config("cifar10", root=str(tmp_path), test_subset=bad), "dataset.test_subset")
    config_error(config("cifar10", root=str(tmp_path), test_subset=5), "dataset.test_subset",
                 "test set (4 examples)")
    text = data.build(config("synthetic_text", test_subset=10))  # a token stream: tokens
    assert len(text.test) == 10


def exact_config_error(cfg: DictConfig, expected: str, build: bool = True) -> None:
    assert config_error(cfg, build=build) == expected


def test_cifar_config_values(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar100", keys="str")
    exact_config_error(config("cifar10", num_classes=100), (
        "dataset.num_classes: cifar10 has 10 classes (this key describes the data and cannot be "
        "changed), got 100"), build=False)
    for bad in (-1, 181, 180.5):
        exact_config_error(config("cifar100", root=str(tmp_path), rotation=bad),
                           f"dataset.rotation: expected a number in [0, 180], got {bad}")
    data.check(config("cifar100", root=str(tmp_path), rotation=180))
    no_rotation = config("cifar100", root=str(tmp_path))
    no_rotation.pop("rotation")  # absent: no rotation (0)
    assert len(data.build(no_rotation).train) == 4


def test_cifar_missing_file_names_the_first(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar10")
    folder = tmp_path / "cifar-10-batches-py"
    for name in ("data_batch_2", "test_batch"):
        (folder / name).unlink()
    exact_config_error(config("cifar10", root=str(tmp_path)), (
        f"dataset.root: {folder / 'data_batch_2'} not found; expected the extracted python "
        f"version of cifar10 under {folder}/ (get it from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html or set dataset.download=true)"),
        build=False)


def fake_download(monkeypatch: pytest.MonkeyPatch, error: Exception | None = None) -> list:
    """torchvision's archive fetch replaced by one that writes the tiny batches (or raises
    ``error``); returns the list of its calls, (url, root, filename)."""
    calls = []

    def fetch(url: str, download_root: str, filename: str, md5: str) -> None:
        calls.append((url, download_root, filename))
        if error is not None:
            raise error
        if not (Path(download_root) / "cifar-10-batches-py").exists():
            write_cifar(Path(download_root), "cifar10")

    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive", fetch)
    return calls


def test_cifar_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.datasets import CIFAR10

    from data import cifar

    calls = fake_download(monkeypatch)
    cfg = config("cifar10", root=str(tmp_path), download=True)
    data.check(cfg)  # nothing there yet: download=true skips the file checks
    bundle = data.build(cfg)
    # Each split's dataset fetches (torchvision's md5 check fails on the tiny files).
    assert calls == [(CIFAR10.url, str(tmp_path), CIFAR10.filename)] * 2
    assert len(bundle.train) == 20 and len(bundle.test) == 4
    calls.clear()
    data.build(config("cifar10", root=str(tmp_path)))  # download: false (the yaml's)
    cifar._Cifar10(str(tmp_path), train=True)  # as torchvision's class: no download by default
    assert calls == []


def test_cifar_download_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.error import URLError

    fake_download(monkeypatch, URLError("[Errno -3] Temporary failure in name resolution"))
    exact_config_error(config("cifar10", root=str(tmp_path), download=True), (
        f"dataset.root: cannot read cifar10 under {tmp_path}: <urlopen error [Errno -3] "
        f"Temporary failure in name resolution>"))


def corrupt_cifar_batch(root: Path) -> Path:
    """The tiny CIFAR-10 files, returning the third training batch's path (to damage)."""
    write_cifar(root, "cifar10")
    return root / "cifar-10-batches-py" / "data_batch_3"


def test_cifar_unreadable_batch_names_the_file_and_error(tmp_path: Path) -> None:
    path = corrupt_cifar_batch(tmp_path)
    path.write_bytes(b"this is not a pickle at all" * 10)
    exact_config_error(config("cifar10", root=str(tmp_path)), (
        f"{path}: corrupt or truncated CIFAR file (UnpicklingError: could not find MARK); "
        f"re-extract it from the official archive"))
    path.write_bytes(pickle.dumps({"data": np.zeros((4, 3072), np.uint8)}, protocol=2)[:200])
    exact_config_error(config("cifar10", root=str(tmp_path)), (
        f"{path}: corrupt or truncated CIFAR file (EOFError: Ran out of input); "
        f"re-extract it from the official archive"))


GOOD_IMAGES, GOOD_LABELS = np.zeros((4, 3072), np.uint8), [0, 1, 2, 9]


@pytest.mark.parametrize("entry,problem", [
    (42, "expected a dict with 'data' and 'fine_labels'"),
    ({"labels": GOOD_LABELS}, "expected a dict with 'data' and 'labels'"),
    ({"data": GOOD_IMAGES}, "expected a dict with 'data' and 'fine_labels'"),
    ({"data": GOOD_IMAGES.tolist(), "labels": GOOD_LABELS},
     "expected 'data' of uint8 N x 3072 and N labels, got data None and labels (4,)"),
    ({"data": GOOD_IMAGES.astype(np.int64), "labels": GOOD_LABELS},
     "expected 'data' of uint8 N x 3072 and N labels, got data (4, 3072) and labels (4,)"),
    ({"data": GOOD_IMAGES[:, :, None], "labels": GOOD_LABELS},
     "expected 'data' of uint8 N x 3072 and N labels, got data (4, 3072, 1) and labels (4,)"),
    ({"data": GOOD_IMAGES[:, :1000], "labels": GOOD_LABELS},
     "expected 'data' of uint8 N x 3072 and N labels, got data (4, 1000) and labels (4,)"),
    ({"data": GOOD_IMAGES, "labels": GOOD_LABELS[:3]},
     "expected 'data' of uint8 N x 3072 and N labels, got data (4, 3072) and labels (3,)"),
    ({"data": GOOD_IMAGES, "labels": [0, 1, 2, 10]}, "labels outside 0..9"),
    ({"data": GOOD_IMAGES, "labels": [-1, 0, 1, 2]}, "labels outside 0..9"),
    ({"data": GOOD_IMAGES, "labels": [0.0, 1.0, 2.0, 3.0]}, "labels outside 0..9"),
])
def test_cifar_corrupt_batch_says_what_is_wrong(tmp_path: Path, entry: Any, problem: str) -> None:
    path = corrupt_cifar_batch(tmp_path)
    dump_cifar(path, entry)
    end = "corrupt file" if problem.startswith("labels") else "the file is corrupt"
    exact_config_error(config("cifar10", root=str(tmp_path)), f"{path}: {problem}; {end}")


@pytest.mark.parametrize("meta", [
    {"fine_label_names": [f"c{i}" for i in range(99)]},  # one class short
    {"label_names": [f"c{i}" for i in range(100)]},  # CIFAR-10's key
    [f"c{i}" for i in range(100)],  # not a dict
])
def test_cifar_wrong_meta_names_the_file(tmp_path: Path, meta: Any) -> None:
    write_cifar(tmp_path, "cifar100", keys="str")
    path = tmp_path / "cifar-100-python" / "meta"
    dump_cifar(path, meta)
    exact_config_error(config("cifar100", root=str(tmp_path)),
                       f"{path}: expected a dict with 100 'fine_label_names'; the file is corrupt")


def test_cifar_corrupt_meta_names_the_file(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar100", keys="str")
    path = tmp_path / "cifar-100-python" / "meta"
    path.write_bytes(path.read_bytes()[:-30])
    config_error(config("cifar100", root=str(tmp_path)), str(path))


# ---------------------------------------------------------------------------------------------
# MNIST


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(f">i{array.ndim}i", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_mnist(root: Path, n_train: int = 6, n_test: int = 3) -> dict:
    """The four idx files; train gzipped (as distributed), test plain (as torchvision leaves it)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    written = {}
    for prefix, n, gz in (("train", n_train, True), ("t10k", n_test, False)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        for suffix, array, magic in (("images-idx3-ubyte", images, 2051),
                                     ("labels-idx1-ubyte", labels, 2049)):
            blob = idx_bytes(array, magic)
            name = f"{prefix}-{suffix}"
            if gz:
                (raw / f"{name}.gz").write_bytes(gzip.compress(blob))
            else:
                (raw / name).write_bytes(blob)
        written[prefix] = (images, labels)
    return written


def test_mnist_reads_idx_files(tmp_path: Path) -> None:
    written = write_mnist(tmp_path)
    cfg = config("mnist", root=str(tmp_path))
    bundle = data.build(cfg)
    assert bundle.num_classes == 10 and len(bundle.train) == 6 and len(bundle.test) == 3
    for split, dataset in (("train", bundle.train), ("t10k", bundle.test)):
        images, labels = written[split]
        for i in range(len(dataset)):
            x, y = dataset[i]
            assert tuple(x.shape) == tuple(cfg.input_shape) and x.dtype == torch.float32
            assert y == labels[i]
            expected = (torch.from_numpy(images[i]).float() / 255 - 0.1307) / 0.3081
            torch.testing.assert_close(x[0], expected)
    assert len(data.build(config("mnist", root=str(tmp_path), subset=2)).train) == 2


@pytest.mark.parametrize("damage", ["truncate", "magic", "gzip", "count", "label"])
def test_mnist_corrupt_files_are_named(tmp_path: Path, damage: str) -> None:
    write_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    if damage == "truncate":
        path = raw / "t10k-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "magic":
        path = raw / "t10k-labels-idx1-ubyte"
        path.write_bytes(struct.pack(">i", 2051) + path.read_bytes()[4:])
    elif damage == "gzip":
        path = raw / "train-images-idx3-ubyte.gz"
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "count":
        path = raw / "t10k-labels-idx1-ubyte"
        path.write_bytes(idx_bytes(np.zeros(2, np.uint8), 2049))
    else:
        path = raw / "t10k-labels-idx1-ubyte"
        path.write_bytes(idx_bytes(np.array([1, 2, 10], np.uint8), 2049))
    config_error(config("mnist", root=str(tmp_path)), str(path))


def test_mnist_missing_file_names_layout(tmp_path: Path) -> None:
    write_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    config_error(config("mnist", root=str(tmp_path)),
                 str(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"), "download")


# ---------------------------------------------------------------------------------------------
# ImageNet (ImageFolder)


def write_image_tree(root: Path, classes: list[str], per_class: int = 2) -> None:
    rng = np.random.default_rng(2)
    for split in ("train", "val"):
        for k, cls in enumerate(classes):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (30 + 4 * i, 40, 3), dtype=np.uint8)
                fmt, ext = ("JPEG", "JPEG") if (k + i) % 2 else ("PNG", "png")
                Image.fromarray(pixels).save(folder / f"img{i}.{ext}", format=fmt)


def test_imagenet_image_folder(tmp_path: Path) -> None:
    classes = ["n02", "n01", "n03"]
    write_image_tree(tmp_path, classes)
    cfg = config("imagenet", root=str(tmp_path), num_classes=3)
    bundle = data.build(cfg)
    assert bundle.task == "classification"
    assert bundle.num_classes == 3 and len(bundle.train) == 6 and len(bundle.test) == 6
    assert bundle.train.classes == sorted(classes)  # type: ignore[union-attr]
    assert [y for _, y in bundle.test.samples] == [0, 0, 1, 1, 2, 2]  # type: ignore[union-attr]
    torch.manual_seed(0)
    a, y = bundle.train[0]
    b, _ = bundle.train[0]
    assert y == 0 and tuple(a.shape) == tuple(cfg.input_shape) == (3, 224, 224)
    assert not torch.equal(a, b)  # random crop / flip
    c, _ = bundle.test[5]
    d, _ = bundle.test[5]
    assert tuple(c.shape) == (3, 224, 224) and torch.equal(c, d)  # deterministic evaluation
    subset = data.build(config("imagenet", root=str(tmp_path), num_classes=3, subset=4))
    assert len(subset.train) == 4
    assert data.build(config("imagenet", root=str(tmp_path), num_classes=None)).num_classes == 3


def test_imagenet_class_count_and_layout_errors(tmp_path: Path) -> None:
    write_image_tree(tmp_path, ["a", "b"])
    config_error(config("imagenet", root=str(tmp_path)), "dataset.num_classes", "1000", "2")
    (tmp_path / "val" / "c").mkdir()
    config_error(config("imagenet", root=str(tmp_path), num_classes=2), str(tmp_path / "val"),
                 "'c'")
    (tmp_path / "train" / "c").mkdir()  # a class folder without images
    config_error(config("imagenet", root=str(tmp_path), num_classes=3),
                 f"dataset.root: cannot read {tmp_path / 'train'}: Found no valid file for the "
                 f"classes c. Supported extensions are: .jpg")


@pytest.mark.parametrize("bad", [0, 2.5, "2", True])
def test_imagenet_num_classes_is_a_positive_integer(tmp_path: Path, bad: Any) -> None:
    write_image_tree(tmp_path, ["a", "b"], per_class=1)
    assert config_error(config("imagenet", root=str(tmp_path), num_classes=bad)) == (
        f"dataset.num_classes: expected an integer >= 1, got {bad!r}")


def test_imagenet_folder_without_class_folders(tmp_path: Path) -> None:
    write_image_tree(tmp_path, ["a"], per_class=1)
    (tmp_path / "train" / "a" / "img0.png").unlink()
    (tmp_path / "train" / "a").rmdir()
    (tmp_path / "train" / "stray.JPEG").write_bytes(b"")  # a file is not a class folder
    message = config_error(config("imagenet", root=str(tmp_path), num_classes=1))
    assert message.startswith(f"dataset.root: {tmp_path / 'train'} has no class sub-folders; "
                              f"expected ImageNet as class folders <root>/train/<class>/*.JPEG")


def test_imagenet_missing_val_folder(tmp_path: Path) -> None:
    write_image_tree(tmp_path, ["a"])
    for path in (tmp_path / "val").rglob("*"):
        if path.is_file():
            path.unlink()
    for folder in (tmp_path / "val" / "a", tmp_path / "val"):
        folder.rmdir()
    config_error(config("imagenet", root=str(tmp_path), num_classes=1), str(tmp_path / "val"),
                 "valprep")


def test_imagenet_corrupt_image_names_the_file(tmp_path: Path) -> None:
    write_image_tree(tmp_path, ["a", "b"])
    bundle = data.build(config("imagenet", root=str(tmp_path), num_classes=2))
    path = Path(bundle.train.samples[1][0])  # type: ignore[union-attr]
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(ConfigError, match="cannot decode") as info:
        bundle.train[1]
    assert str(path) in str(info.value)
    garbage = Path(bundle.test.samples[2][0])  # type: ignore[union-attr]
    garbage.write_bytes(b"not an image")
    with pytest.raises(ConfigError) as info:
        bundle.test[2]
    assert str(info.value).startswith(f"{garbage}: cannot decode image (cannot identify image "
                                      f"file <_io.BufferedReader name=")
    assert str(info.value).endswith("); the file is corrupt")


def test_imagenet_images_of_any_mode_load_as_rgb(tmp_path: Path) -> None:
    from data import imagenet

    rng = np.random.default_rng(3)
    gray = rng.integers(0, 256, (30, 40), dtype=np.uint8)
    rgba = rng.integers(0, 256, (30, 40, 4), dtype=np.uint8)
    for split in ("train", "val"):
        folder = tmp_path / split / "a"
        folder.mkdir(parents=True)
        Image.fromarray(gray).save(folder / "gray.png")  # mode L
        Image.fromarray(rgba).save(folder / "rgba.png")  # mode RGBA
        # ILSVRC 2012's training set has a few CMYK JPEGs (and many grayscale ones)
        Image.fromarray(rgba[..., :3]).convert("CMYK").save(folder / "cmyk.JPEG")
    bundle = data.build(config("imagenet", root=str(tmp_path), num_classes=1))
    paths = {Path(p).name: p for p, _ in bundle.test.samples}  # type: ignore[union-attr]
    for name, expected in (("gray.png", np.repeat(gray[..., None], 3, 2)),
                           ("rgba.png", rgba[..., :3])):
        image = imagenet.load_image(paths[name])
        assert image.mode == "RGB" and np.array_equal(np.asarray(image), expected), name
    assert imagenet.load_image(paths["cmyk.JPEG"]).mode == "RGB"
    for dataset in (bundle.train, bundle.test):
        assert all(tuple(dataset[i][0].shape) == (3, 224, 224) for i in range(3))


# ---------------------------------------------------------------------------------------------
# WikiText-2

WIKI = {
    "train": " = Title = \n\n the cat sat \n the dog \n",
    "valid": " the bird sat \n",
    "test": " a cat \n\n",
}


def write_wikitext(root: Path, files: dict[str, str] = WIKI) -> Path:
    folder = root / "wikitext-2"
    folder.mkdir(parents=True)
    for split, text in files.items():
        (folder / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
    return folder


def test_wikitext_word_level_recipe(tmp_path: Path) -> None:
    write_wikitext(tmp_path)
    bundle = data.build(config("wikitext2", root=str(tmp_path), num_classes=None))
    corpus = data.wikitext2.load_corpus(config("wikitext2", root=str(tmp_path)))
    vocab = ["=", "Title", "<eos>", "the", "cat", "sat", "dog", "bird", "a"]
    assert corpus.vocabulary == vocab and bundle.num_classes == len(vocab)
    words = {
        "train": "= Title = <eos> <eos> the cat sat <eos> the dog <eos>",
        "valid": "the bird sat <eos>",
        "test": "a cat <eos> <eos>",
    }
    for split, text in words.items():
        assert corpus.streams[split].tolist() == [vocab.index(w) for w in text.split()], split
    assert bundle.task == "language_model"
    assert bundle.train.dtype == torch.int64 and bundle.train.dim() == 1
    assert torch.equal(bundle.train, corpus.streams["train"])
    assert torch.equal(bundle.test, corpus.streams["test"])
    valid = data.build(config("wikitext2", root=str(tmp_path), num_classes=9, eval_split="valid"))
    assert torch.equal(valid.test, corpus.streams["valid"])
    sub = data.build(config("wikitext2", root=str(tmp_path), num_classes=None, subset=5))
    assert torch.equal(sub.train, corpus.streams["train"][:5])


def test_wikitext_config_errors(tmp_path: Path) -> None:
    folder = write_wikitext(tmp_path)
    # The yaml's 33,278 is the official vocabulary: other files are refused, naming the folder.
    config_error(config("wikitext2", root=str(tmp_path)), "dataset.num_classes", "33278",
                 str(folder))
    config_error(config("wikitext2", root=str(tmp_path), eval_split="dev"), "dataset.eval_split")
    for bad in (0, -1, 100):
        config_error(config("wikitext2", root=str(tmp_path), num_classes=None, subset=bad),
                     "dataset.subset")
    (folder / "wiki.valid.tokens").unlink()
    config_error(config("wikitext2", root=str(tmp_path)), str(folder / "wiki.valid.tokens"),
                 "wikitext-2-v1.zip")


@pytest.mark.parametrize("content", [b"the cat \xff\xfe sat\n", b"", b"  \n\n", b"ab\x00cd\n"])
def test_wikitext_corrupt_file_names_it(tmp_path: Path, content: bytes) -> None:
    folder = write_wikitext(tmp_path)
    (folder / "wiki.test.tokens").write_bytes(content)
    config_error(config("wikitext2", root=str(tmp_path), num_classes=None),
                 str(folder / "wiki.test.tokens"))


# ---------------------------------------------------------------------------------------------
# Shakespeare

SHAKESPEARE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
)


def test_shakespeare_character_streams(tmp_path: Path) -> None:
    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "input.txt").write_text(SHAKESPEARE, encoding="utf-8")
    bundle = data.build(config("shakespeare", root=str(tmp_path), num_classes=None))
    chars = sorted(set(SHAKESPEARE))
    assert bundle.num_classes == len(chars) and bundle.task == "language_model"
    cut = int(len(SHAKESPEARE) * 0.9)
    assert len(bundle.train) == cut and len(bundle.test) == len(SHAKESPEARE) - cut
    assert bundle.train.dtype == torch.int64
    decoded = "".join(chars[i] for i in torch.cat([bundle.train, bundle.test]).tolist())
    assert decoded == SHAKESPEARE
    half = data.build(config("shakespeare", root=str(tmp_path), num_classes=None,
                             test_fraction=0.5, subset=7))
    assert len(half.test) == len(SHAKESPEARE) - len(SHAKESPEARE) // 2
    assert torch.equal(half.train, bundle.train[:7])


def test_shakespeare_errors(tmp_path: Path) -> None:
    path = tmp_path / "shakespeare" / "input.txt"
    path.parent.mkdir()
    path.write_text(SHAKESPEARE, encoding="utf-8")
    config_error(config("shakespeare", root=str(tmp_path)), "dataset.num_classes", "65",
                 str(path))
    for bad in (0, 1, 1.5):
        config_error(config("shakespeare", root=str(tmp_path), test_fraction=bad),
                     "dataset.test_fraction")
    path.write_bytes(SHAKESPEARE.encode()[:20] + b"\xc3")  # cut inside a UTF-8 character
    config_error(config("shakespeare", root=str(tmp_path), num_classes=None), str(path))
    path.write_text("ab", encoding="utf-8")
    config_error(config("shakespeare", root=str(tmp_path), num_classes=None),
                 "dataset.test_fraction", str(path))


# ---------------------------------------------------------------------------------------------
# synthetic_text


def test_synthetic_text_streams() -> None:
    cfg = config("synthetic_text", train_tokens=3000, test_tokens=500)
    bundle = data.build(cfg)
    assert bundle.task == "language_model" and bundle.num_classes == cfg.vocab_size == 50
    assert bundle.train.shape == (3000,) and bundle.test.shape == (500,)
    assert bundle.train.dtype == torch.int64
    assert int(bundle.train.min()) >= 0 and int(bundle.train.max()) < 50
    again = data.build(cfg)
    assert torch.equal(again.train, bundle.train) and torch.equal(again.test, bundle.test)
    assert not torch.equal(bundle.train[:500], bundle.test)
    other = data.build(config("synthetic_text", train_tokens=3000, test_tokens=500, seed=1))
    assert not torch.equal(other.train, bundle.train)
    small = config("synthetic_text", vocab_size=7, train_tokens=100, test_tokens=10, subset=40)
    assert small.num_classes == 7  # follows vocab_size through the interpolation
    assert data.build(small).train.shape == (40,)


def test_synthetic_text_config_errors() -> None:
    base = {"train_tokens": 100, "test_tokens": 10}
    config_error(config("synthetic_text", **base, num_classes=10), "dataset.num_classes")
    config_error(config("synthetic_text", **base, vocab_size=1), "dataset.vocab_size")
    config_error(config("synthetic_text", **base, alpha=0), "dataset.alpha")
    config_error(config("synthetic_text", train_tokens=1, test_tokens=10), "dataset.train_tokens")
    config_error(config("synthetic_text", **base, subset=0), "dataset.subset")


def test_synthetic_text_chain_is_consistent() -> None:
    cfg = config("synthetic_text")
    matrix = synthetic_text.transition_matrix(cfg)
    pi = synthetic_text.stationary_distribution(cfg)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
    np.testing.assert_allclose(pi @ matrix, pi, atol=1e-12)
    assert pi.min() > 0 and math.isclose(pi.sum(), 1.0)
    rate = synthetic_text.entropy_rate(cfg)
    assert 0 < rate < -(pi * np.log(pi)).sum() < math.log(50)  # context helps
    assert math.isclose(synthetic_text.perplexity_floor(cfg), math.exp(rate))
    # Smaller alpha, more predictable chain.
    assert synthetic_text.entropy_rate(config("synthetic_text", alpha=0.02)) < rate
    assert synthetic_text.entropy_rate(config("synthetic_text", alpha=5.0)) > rate


def test_synthetic_text_sample_matches_entropy_rate() -> None:
    """A long sample's per-token entropy is the entropy rate: the perplexity floor is right."""
    # alpha=0.05 makes pi far from uniform: weighting the row entropies uniformly instead of by
    # pi would be off by about 0.1 nats here, five times the tolerance.
    cfg = config("synthetic_text", vocab_size=20, alpha=0.05, train_tokens=300_000,
                 test_tokens=2, seed=3)
    stream = data.build(cfg).train.numpy()
    matrix = synthetic_text.transition_matrix(cfg)
    pi = synthetic_text.stationary_distribution(cfg)
    rate = synthetic_text.entropy_rate(cfg)
    # 1. The loss of the true model on the sample (checks the sampler draws from P).
    nll = -np.log(matrix[stream[:-1], stream[1:]]).mean()
    assert abs(nll - rate) < 0.02, (nll, rate)
    # 2. The plug-in conditional entropy from bigram counts (checks entropy_rate's formula).
    counts = np.zeros((20, 20))
    np.add.at(counts, (stream[:-1], stream[1:]), 1)
    joint = counts / counts.sum()
    conditional = joint / joint.sum(axis=1, keepdims=True)
    nonzero = joint > 0
    plug_in = -(joint[nonzero] * np.log(conditional[nonzero])).sum()
    assert abs(plug_in - rate) < 0.02, (plug_in, rate)
    # 3. Token frequencies are the stationary distribution.
    frequencies = np.bincount(stream, minlength=20) / len(stream)
    assert np.abs(frequencies - pi).max() < 0.01


def test_synthetic_text_streams_start_from_the_stationary_distribution() -> None:
    cfg = config("synthetic_text", vocab_size=5, alpha=0.3, seed=4)
    matrix = synthetic_text.transition_matrix(cfg)
    pi = synthetic_text.stationary_distribution(cfg)
    rng = np.random.default_rng(0)
    firsts = [int(synthetic_text.sample(matrix, pi, 1, rng)[0]) for _ in range(4000)]
    assert np.abs(np.bincount(firsts, minlength=5) / 4000 - pi).max() < 0.04


# ---------------------------------------------------------------------------------------------
# synthetic images (the tiny-scale stand-ins' generator)


def _tensors(cfg: DictConfig) -> tuple[torch.Tensor, ...]:
    bundle = data.build(cfg)
    return (*bundle.train.tensors, *bundle.test.tensors)  # type: ignore[union-attr]


def test_synthetic_defaults_are_one_template_per_class_plus_noise() -> None:
    cfg = config("synthetic", train_size=40, test_size=20, noise=0.0)
    x, y, tx, ty = _tensors(cfg)
    assert x.shape == (40, 3, 32, 32) and tx.shape == (20, 3, 32, 32)
    assert y.tolist() == [i % 10 for i in range(40)] and ty.tolist() == [i % 10 for i in range(20)]
    for c in range(10):  # without noise every example of a class is its one template
        first = x[y == c][0]
        assert torch.equal(first, x[y == c][-1]) and torch.equal(first, tx[ty == c][0])


def test_synthetic_modes_shift_smooth_and_label_noise() -> None:
    base = {"train_size": 400, "test_size": 200, "noise": 0.0, "smooth": 4}
    x, y, _, _ = _tensors(config("synthetic", **base, modes=3))
    per_class = [{tuple(img.flatten()[:5].tolist()) for img in x[y == c]} for c in range(10)]
    assert all(len(s) == 3 for s in per_class)  # each class: exactly its 3 templates
    smooth = x[0, 0]
    assert (smooth[:, 1:] - smooth[:, :-1]).abs().mean() < 0.5 * smooth.abs().mean()
    shifted, ys, _, _ = _tensors(config("synthetic", **base, shift=3))
    first = shifted[ys == 0]
    rolled = {(dy, dx) for dy in range(-6, 7) for dx in range(-6, 7)  # two shifts of <= 3
              if torch.allclose(first[0].roll((dy, dx), dims=(1, 2)), first[1])}
    assert rolled and len({tuple(img.flatten()[:5].tolist()) for img in first}) > 1
    _, noisy, _, clean = _tensors(config("synthetic", **base, label_noise=0.5))
    flipped = (noisy != torch.arange(400) % 10).float().mean().item()
    assert 0.3 < flipped < 0.6 and clean.tolist() == [i % 10 for i in range(200)]


@pytest.mark.parametrize(("key", "value"), [
    ("modes", 0), ("shift", -1), ("smooth", 0), ("smooth", 33), ("label_noise", 1.5),
])
def test_synthetic_bad_values_name_the_field(key: str, value: Any) -> None:
    config_error(config("synthetic", **{key: value}), f"dataset.{key}", build=False)
