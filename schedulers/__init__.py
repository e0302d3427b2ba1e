"""Compression-level schedulers: one file per scheduler, built through :func:`build`.

A scheduler sees each epoch's per-layer gradient norms and learning rates and sets the
compression level of every layer (through the hook state's ``set_levels``) before each epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.registry import Registry
from schedulers.base import Scheduler

# Scheduler name -> the module that registers it (imported when the name is asked for).
REGISTRY: Registry[type[Scheduler]] = Registry("scheduler", "schedulers", {
    name: name for name in ("static", "accordion", "accordion_batch", "accordion_joint", "plan",
                            "accordion_auto", "accordion_batch_auto")})


def register(name: str) -> Callable[[type[Scheduler]], type[Scheduler]]:
    """Class decorator: make a scheduler available as ``scheduler=name``."""
    return REGISTRY.register(name)


def available() -> list[str]:
    """Names accepted by :func:`build`."""
    return REGISTRY.available()


def build(cfg: Any) -> Scheduler:
    """The scheduler of the ``scheduler`` config node; bad values raise a ConfigError."""
    params = {k: v for k, v in cfg.items() if k != "name"}
    REGISTRY.check_keys(cfg.get("name"), params)
    return REGISTRY.get(cfg.get("name"))(**params)
