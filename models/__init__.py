"""Model zoo: one file per network, all built through :func:`build`.

Every model module registers a constructor with :func:`register`; the Hydra configs in
``conf/model/`` name the model and pass its keyword arguments, so ``models.build(**cfg)`` is
the only way the suite creates a network.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.errors import ConfigError, check_int

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}

# Modules that register models, one per model and named after it; imported when that model is
# used (AlexNet and ResNet-50 import torchvision: seconds of start-up for every other run).
_MODULES = (
    "resnet18", "vgg19bn", "senet18", "densenet", "googlenet", "alexnet", "resnet50", "lstm",
    "char_lstm", "mnist_cnn", "cifar10_cnn",
)


def register(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: make ``fn`` available as ``models.build(name, ...)``."""

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = fn
        return fn

    return wrap


def available() -> list[str]:
    """Names accepted by :func:`build`."""
    _load_all()
    return sorted(_REGISTRY)


def exists(name: object) -> bool:
    """Whether ``name`` is a registered model (importing only its module)."""
    _load(name)
    return isinstance(name, str) and name in _REGISTRY


def build(name: str, num_classes: int, **kwargs: object) -> nn.Module:
    """Create model ``name`` for ``num_classes`` outputs (classes, or vocabulary size)."""
    _load(name)
    if name not in _REGISTRY:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name](num_classes=num_classes, **kwargs)


def check(cfg: Any) -> None:
    """Validate the ``model`` config node before anything is built: the name, no unknown keys,
    every value (each model's builder checks its own, raising a ConfigError naming
    ``model.<key>``), by building the model on the meta device (no memory, no compute)."""
    name = cfg.get("name")
    if not exists(name):
        raise ConfigError(f"model.name: unknown model {name!r}; choose one of {available()}")
    kwargs = {k: v for k, v in cfg.items() if k != "name"}
    allowed = list(inspect.signature(_REGISTRY[name]).parameters)
    for key in kwargs:
        if key not in allowed:
            raise ConfigError(f"model.{key}: unknown key for model {name!r}; expected one of "
                              f"{allowed}")
    with torch.device("meta"):
        build(name, **kwargs)


def check_io(num_classes: Any, in_channels: Any = 1) -> None:
    """The keys every model has: ``num_classes`` (or vocabulary size) and ``in_channels``."""
    check_int(num_classes, "model.num_classes", 1)
    check_int(in_channels, "model.in_channels", 1)


def input_kind(name: str) -> dict[str, object]:
    """Expected input of model ``name``: the ``INPUT`` dict of the module that registers it.

    ``{"kind": "image", "shape": (C, H, W)}`` for image models, ``{"kind": "tokens"}`` for
    language models (integer ids ``[batch, seq]``).
    """
    _load(name)
    if name not in _REGISTRY:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {sorted(_REGISTRY)}")
    return dict(sys.modules[_REGISTRY[name].__module__].INPUT)


def _load(name: Any) -> None:
    """Import the module of model ``name`` (all of them for an unknown name: the error lists
    every model)."""
    if name in _MODULES:
        importlib.import_module(f"models.{name}")
    else:
        _load_all()


def _load_all() -> None:
    for module in _MODULES:
        importlib.import_module(f"models.{module}")
