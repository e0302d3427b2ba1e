"""Compression-level schedulers: one file per scheduler, built through :func:`build`.

A scheduler sees each epoch's per-layer gradient norms and learning rates and sets the
compression level of every layer (through the hook state's ``set_levels``) before each epoch.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from core.errors import ConfigError
from schedulers.base import Scheduler

_REGISTRY: dict[str, type[Scheduler]] = {}
_MODULES = ("static", "accordion", "accordion_batch", "accordion_joint", "plan", "accordion_auto",
            "accordion_batch_auto")


def register(name: str) -> Callable[[type[Scheduler]], type[Scheduler]]:
    """Class decorator: make a scheduler available as ``scheduler=name``."""

    def wrap(cls: type[Scheduler]) -> type[Scheduler]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available() -> list[str]:
    """Names accepted by :func:`build`."""
    for module in _MODULES:
        importlib.import_module(f"schedulers.{module}")
    return sorted(_REGISTRY)


def build(cfg: Any) -> Scheduler:
    """The scheduler of the ``scheduler`` config node; bad values raise a ConfigError."""
    name = cfg.get("name")
    if name not in available():
        raise ConfigError(f"scheduler.name: unknown scheduler {name!r}; choose one of "
                          f"{available()}")
    params = {k: v for k, v in cfg.items() if k != "name"}
    allowed = list(inspect.signature(_REGISTRY[name]).parameters)  # of a class: no "self"
    for key in params:
        if key not in allowed:
            raise ConfigError(f"scheduler.{key}: unknown key for scheduler {name!r}; expected "
                              f"{allowed or 'none'}")
    return _REGISTRY[name](**params)
