"""Datasets: one file per dataset, all built through :func:`build`.

A dataset module registers a builder with :func:`register`. The builder takes the
``dataset`` config node and returns a :class:`DataBundle`. An optional checker, registered
with ``register(name, check=...)``, validates paths and values without loading anything, so
that bad input fails before any process group starts; ``fixed`` declares the keys that describe
the data (its task, its images' shape, its classes) and cannot be changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.data import Dataset, Subset

from core.errors import ConfigError, check_bool, check_int, check_str
from core.registry import Registry

Task = Literal["classification", "language_model"]


@dataclass
class DataBundle:
    """What a dataset gives the trainer.

    For ``task="classification"``, ``train``/``test`` are map-style datasets of
    ``(input, label)``; for ``task="language_model"`` they are 1-D ``LongTensor`` token streams
    that the trainer batchifies. ``num_classes`` is the number of classes or the vocabulary size.
    """

    task: Task
    num_classes: int
    train: Dataset | torch.Tensor
    test: Dataset | torch.Tensor


Builder = Callable[[Any], DataBundle]
Checker = Callable[[Any], None]
# Dataset name -> the module that registers it, imported only when that dataset is used (the
# file-based ones import torchvision: seconds of start-up for every run that does not need it).
REGISTRY: Registry[Builder] = Registry("dataset", "data", {
    "digits": "digits", "synthetic": "synthetic", "cifar10": "cifar", "cifar100": "cifar",
    "mnist": "mnist", "imagenet": "imagenet", "wikitext2": "wikitext2",
    "shakespeare": "shakespeare", "synthetic_text": "synthetic_text",
})
_CHECKERS: dict[str, Checker] = {}
_FIXED: dict[str, dict[str, Any]] = {}


def register(*names: str, check: Checker | None = None, fixed: dict[str, Any] | None = None
             ) -> Callable[[Builder], Builder]:
    """Decorator: make ``fn`` the builder of dataset(s) ``names``; ``fixed``: keys whose value
    is that of the data (e.g. ``{"task": "classification", "input_shape": [3, 32, 32]}``)."""

    def wrap(fn: Builder) -> Builder:
        REGISTRY.register(*names)(fn)
        for name in names:
            _FIXED[name] = dict(fixed or {})
            if check is not None:
                _CHECKERS[name] = check
        return fn

    return wrap


def available() -> list[str]:
    """Names accepted by :func:`build`."""
    return REGISTRY.available()


def check(cfg: Any) -> None:
    """Validate the ``dataset`` config (values and files) without loading data."""
    REGISTRY.get(cfg.name)  # an unknown name: refused, naming dataset.name
    for field in ("subset", "test_subset"):
        if cfg.get(field) is not None:
            check_int(cfg.get(field), f"dataset.{field}", 1)
    check_str(cfg.get("root"), "dataset.root", optional=True)
    if "download" in cfg:
        check_bool(cfg.download, "dataset.download")
    if "seed" in cfg:
        check_int(cfg.seed, "dataset.seed", 0, 2**63 - 1)  # torch.Generator's range
    if "bptt" in cfg:
        check_int(cfg.bptt, "dataset.bptt", 1)
    for key, value in _FIXED[cfg.name].items():
        if _plain(cfg.get(key)) != value:
            raise ConfigError(f"dataset.{key}: {cfg.name} is {value!r} (this key describes the "
                              f"data and cannot be changed), got {cfg.get(key)!r}")
    if cfg.name in _CHECKERS:
        _CHECKERS[cfg.name](cfg)


def root_dir(cfg: Any) -> Path:
    """``dataset.root`` as a path; a dataset read from files refuses null (the default)."""
    if cfg.get("root") is None:
        raise ConfigError(f"dataset.root: {cfg.name} is read from files; set it to the folder "
                          f"that holds them (null is for the embedded datasets)")
    return Path(cfg.root)


def check_classes(value: Any, optional: bool = False) -> int | None:
    """``dataset.num_classes``: an integer >= 1 (or null where the files give it)."""
    if value is None and optional:
        return None
    return check_int(value, "dataset.num_classes", 1)


def _plain(value: Any) -> Any:
    """A config value as plain Python (a list node as a list), for comparison."""
    return list(value) if type(value).__name__ == "ListConfig" else value


def build(cfg: Any) -> DataBundle:
    """Load dataset ``cfg.name`` and apply ``cfg.subset`` and ``cfg.test_subset`` (the first N
    training and test examples)."""
    check(cfg)
    bundle = REGISTRY.get(cfg.name)(cfg)
    if cfg.get("subset") is not None:
        bundle.train = take_first(bundle.train, cfg.subset, "dataset.subset")
    if cfg.get("test_subset") is not None:
        bundle.test = take_first(bundle.test, cfg.test_subset, "dataset.test_subset", "test")
    return bundle


def take_first(data: Dataset | torch.Tensor, n: int, field: str, split: str = "training"
               ) -> Dataset | torch.Tensor:
    """The first ``n`` examples of the ``split`` set (tokens, for a token stream)."""
    size = len(data)  # type: ignore[arg-type]
    if n > size:
        raise ConfigError(f"{field}: {n} is larger than the {split} set ({size} examples)")
    if isinstance(data, torch.Tensor):
        return data[:n]
    return Subset(data, range(n))


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``exc``'s message on one line, at most ``limit`` characters (for ConfigError messages)."""
    return " ".join(str(exc).split())[:limit]


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path``; a :class:`ConfigError` naming it if unreadable or not text."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); the file is corrupt"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if not text.strip():
        raise ConfigError(f"{path}: the file is empty; expected text")
    if "\x00" in text:
        raise ConfigError(f"{path}: contains NUL bytes; expected plain text (the file is corrupt)")
    return text


def check_vocabulary(cfg: Any, size: int, source: Path) -> int:
    """``size``, after checking it against ``cfg.num_classes`` when that is set (not null)."""
    expected = cfg.get("num_classes")
    if expected is not None and int(expected) != size:
        raise ConfigError(
            f"dataset.num_classes: {expected} but {source} gives a vocabulary of {size}; "
            f"use the standard files or set dataset.num_classes={size} (or null)"
        )
    return size
