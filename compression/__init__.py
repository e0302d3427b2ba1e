"""Gradient compressors, run inside a DDP communication hook.

One file per compressor (``none``, ``powersgd``, ``topk``, ``adacomp``, ``ef_signsgd``, ``qsgd``,
``terngrad``, ``dgc``, ``randomk``, ``signsgd`` and ``signum``, ``onebit``, ``natural``, ``fp16``
and ``bf16`` in ``cast``); each registers a :class:`~compression.base.Compressor` subclass with
:func:`register`; a class from outside the package joins through a config's ``_target_``
(:func:`build_compressor`). :func:`build`
turns the ``compressor`` config node into a :class:`~compression.hook.HookState`, which `run.py`
registers on the DDP model with ``ddp.register_comm_hook(state, compression.hook.comm_hook)``.
:func:`simulate` runs the same compressor code on simulated workers, without a process group.
A compressor's math is its own file; its error-feedback memory (:mod:`compression.memory`) and
the exchange of messages (:mod:`compression.comm`, :mod:`compression.exchange`) are shared.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.distributed import ProcessGroup

from compression.base import Compressor
from compression.hook import HookState
from compression.simulate import Simulation, simulate
from compression.worker import WorkerState
from core.errors import ConfigError
from core.registry import Registry

__all__ = ["REGISTRY", "Compressor", "HookState", "Simulation", "WorkerState", "adopt",
           "available", "build", "build_compressor", "create", "register", "simulate",
           "with_levels"]

# Compressor name -> the module that registers it (imported when the name is asked for).
REGISTRY: Registry[type[Compressor]] = Registry("compressor", "compression", {
    "none": "none", "powersgd": "powersgd", "topk": "topk", "adacomp": "adacomp",
    "ef_signsgd": "ef_signsgd", "qsgd": "qsgd", "terngrad": "terngrad", "dgc": "dgc",
    "randomk": "randomk", "signsgd": "signsgd", "signum": "signsgd", "onebit": "onebit",
    "natural": "natural", "fp16": "cast", "bf16": "cast"})
TARGET = "_target_"  # a compressor class from outside the package (see build_compressor)


def register(name: str) -> Callable[[type[Compressor]], type[Compressor]]:
    """Class decorator: make a compressor available as ``compressor=name``."""
    return REGISTRY.register(name)


def available() -> list[str]:
    """Names accepted by :func:`create`."""
    return REGISTRY.available()


def with_levels() -> list[str]:
    """Compressors that have levels for Accordion to switch (``accordion_levels``)."""
    return [name for name in available() if REGISTRY.entries[name].accordion_levels is not None]


def create(name: str, **params: Any) -> Compressor:
    """Instantiate compressor ``name``; bad parameters raise a ConfigError naming the field."""
    REGISTRY.check_keys(name, params)
    return REGISTRY.get(name)(**params)


def build_compressor(cfg: Any) -> Compressor:
    """The compressor of the ``compressor`` config node (validates its parameters).

    A node with ``_target_: package.module.Class`` (a :class:`Compressor` subclass from outside
    this package) imports that class and registers it as ``name`` first, so that a config file
    of the user's own is all ``compressor=<file>`` needs.
    """
    if TARGET in cfg:
        adopt(cfg[TARGET], cfg.get("name"))
    return create(cfg.name, **{k: v for k, v in cfg.items() if k not in ("name", TARGET)})


def adopt(target: Any, name: Any) -> None:
    """Import the compressor class ``target`` (``package.module.Class``) and register it as
    ``name``; a ConfigError naming ``compressor._target_`` or ``compressor.name`` if it cannot
    be (not importable, not a Compressor, or the name taken by another class)."""
    module, _, attr = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"compressor._target_: cannot import {target!r} ({exc}); expected "
                          f"package.module.Class, importable from the PYTHONPATH") from None
    if not (isinstance(cls, type) and issubclass(cls, Compressor)):
        raise ConfigError(f"compressor._target_: {target!r} is not a subclass of "
                          f"compression.Compressor")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"compressor.name: expected the name to register {target!r} under, "
                          f"got {name!r}")
    available()  # the package's own compressors first: a plugin cannot take their names
    taken = REGISTRY.entries.get(name, cls)
    if taken is not cls:
        raise ConfigError(f"compressor.name: {name!r} is taken by {taken.__module__}."
                          f"{taken.__qualname__}; choose another name")
    register(name)(cls)


def build(cfg: Any, named_parameters: Iterable[tuple[str, nn.Parameter]],
          group: ProcessGroup | None = None, **kwargs: Any) -> HookState:
    """Hook state for the ``compressor`` config node over the model's parameters (``kwargs``:
    :class:`HookState`'s ``comm`` and ``track_norms``)."""
    return HookState(build_compressor(cfg), named_parameters, group, **kwargs)
