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
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.distributed import ProcessGroup

from compression.base import Compressor
from compression.hook import HookState
from compression.simulate import Simulation, simulate
from compression.worker import WorkerState
from core.errors import ConfigError

__all__ = ["Compressor", "HookState", "Simulation", "WorkerState", "adopt", "available",
           "build", "build_compressor", "create", "register", "simulate", "with_levels"]

_REGISTRY: dict[str, type[Compressor]] = {}
_MODULES = ("none", "powersgd", "topk", "adacomp", "ef_signsgd", "qsgd", "terngrad", "dgc",
            "randomk", "signsgd", "onebit", "natural", "cast")
TARGET = "_target_"  # a compressor class from outside the package (see build_compressor)


def register(name: str) -> Callable[[type[Compressor]], type[Compressor]]:
    """Class decorator: make a compressor available as ``compressor=name``."""

    def wrap(cls: type[Compressor]) -> type[Compressor]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available() -> list[str]:
    """Names accepted by :func:`create`."""
    for module in _MODULES:
        importlib.import_module(f"compression.{module}")
    return sorted(_REGISTRY)


def with_levels() -> list[str]:
    """Compressors that have levels for Accordion to switch (``accordion_levels``)."""
    return [name for name in available() if _REGISTRY[name].accordion_levels is not None]


def create(name: str, **params: Any) -> Compressor:
    """Instantiate compressor ``name``; bad parameters raise a ValueError naming the field."""
    if name not in available():
        raise ConfigError(f"compressor.name: unknown compressor {name!r}; choose one of "
                          f"{available()}")
    cls = _REGISTRY[name]
    allowed = [p for p in inspect.signature(cls).parameters if p != "self"]
    for key in params:
        if key not in allowed:
            raise ConfigError(f"compressor.{key}: unknown key for compressor {name!r}; "
                              f"expected {allowed or 'none'}")
    return cls(**params)


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
    taken = _REGISTRY.get(name, cls)
    if taken is not cls:
        raise ConfigError(f"compressor.name: {name!r} is taken by {taken.__module__}."
                          f"{taken.__qualname__}; choose another name")
    register(name)(cls)


def build(cfg: Any, named_parameters: Iterable[tuple[str, nn.Parameter]],
          group: ProcessGroup | None = None, **kwargs: Any) -> HookState:
    """Hook state for the ``compressor`` config node over the model's parameters (``kwargs``:
    :class:`HookState`'s ``comm`` and ``track_norms``)."""
    return HookState(build_compressor(cfg), named_parameters, group, **kwargs)
