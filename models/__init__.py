"""Model zoo: one file per network, all built through :func:`build`.

Every model module registers a constructor with :func:`register`; the Hydra configs in
``conf/model/`` name the model and pass its keyword arguments, so ``models.build(**cfg)`` is
the only way the suite creates a network.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from core.errors import check_int
from core.registry import Registry

# Model name -> the module that registers it (one per model, named after it), imported when that
# model is used (AlexNet and ResNet-50 import torchvision: seconds of start-up for every other run).
REGISTRY: Registry[Callable[..., nn.Module]] = Registry("model", "models", {
    name: name for name in ("resnet18", "vgg19bn", "senet18", "densenet", "googlenet", "alexnet",
                            "resnet50", "lstm", "char_lstm", "mnist_cnn", "cifar10_cnn")})


def register(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: make ``fn`` available as ``models.build(name, ...)``."""
    return REGISTRY.register(name)


def available() -> list[str]:
    """Names accepted by :func:`build`."""
    return REGISTRY.available()


def exists(name: object) -> bool:
    """Whether ``name`` is a registered model (importing only its module)."""
    return REGISTRY.exists(name)


def build(name: str, num_classes: int, **kwargs: object) -> nn.Module:
    """Create model ``name`` for ``num_classes`` outputs (classes, or vocabulary size)."""
    return REGISTRY.get(name)(num_classes=num_classes, **kwargs)


def check(cfg: Any) -> None:
    """Validate the ``model`` config node before anything is built: the name, no unknown keys,
    every value (each model's builder checks its own, raising a ConfigError naming
    ``model.<key>``), by building the model on the meta device (no memory, no compute)."""
    kwargs = {k: v for k, v in cfg.items() if k != "name"}
    REGISTRY.check_keys(cfg.get("name"), kwargs)
    with torch.device("meta"):
        build(cfg.get("name"), **kwargs)


def check_io(num_classes: Any, in_channels: Any = 1) -> None:
    """The keys every model has: ``num_classes`` (or vocabulary size) and ``in_channels``."""
    check_int(num_classes, "model.num_classes", 1)
    check_int(in_channels, "model.in_channels", 1)


def input_kind(name: str) -> dict[str, object]:
    """Expected input of model ``name``: the ``INPUT`` dict of the module that registers it.

    ``{"kind": "image", "shape": (C, H, W)}`` for image models, ``{"kind": "tokens"}`` for
    language models (integer ids ``[batch, seq]``).
    """
    return dict(sys.modules[REGISTRY.get(name).__module__].INPUT)
