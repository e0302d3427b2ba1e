"""The registry behind each config group that names a plug-in: compressors, schedulers, models,
datasets.

A group's modules register what they build (a class or a function) under a name with
:meth:`Registry.register`; a config names it (``compressor=topk``, ``model=resnet18``). Modules are
imported only when a name of theirs is asked for (AlexNet's and the file datasets' modules
import torchvision: seconds of start-up for every run that does not use them). Every refusal is a
:class:`~core.errors.ConfigError` naming the config field and what is allowed.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from core.errors import ConfigError

T = TypeVar("T", bound=Callable)


class Registry(Generic[T]):
    """Names of one config group (``group``: its field, e.g. ``"compressor"``) and what builds
    each; ``modules`` maps a name to the module of ``package`` that registers it."""

    def __init__(self, group: str, package: str, modules: Mapping[str, str]) -> None:
        self.group = group
        self.package = package
        self.modules = dict(modules)
        self.entries: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: make the class or function available under each of ``names``; a class
        also gets its (first) name as ``cls.name``, which compressors and schedulers report."""

        def wrap(entry: T) -> T:
            if isinstance(entry, type):
                entry.name = names[0]
            for name in names:
                self.entries[name] = entry
            return entry

        return wrap

    def load(self, name: object) -> None:
        """Import the module that registers ``name`` (every module for a name not listed, so
        that a refusal lists every choice)."""
        module = self.modules.get(name) if isinstance(name, str) else None
        for each in [module] if module else dict.fromkeys(self.modules.values()):
            importlib.import_module(f"{self.package}.{each}")

    def available(self) -> list[str]:
        """Every registered name, sorted."""
        self.load(None)
        return sorted(self.entries)

    def exists(self, name: object) -> bool:
        """Whether ``name`` is registered (importing only its module)."""
        self.load(name)
        return isinstance(name, str) and name in self.entries

    def get(self, name: object) -> T:
        """What ``name`` builds; a ConfigError naming ``<group>.name`` and the choices if none."""
        if not self.exists(name):
            raise ConfigError(f"{self.group}.name: unknown {self.group} {name!r}; choose one of "
                              f"{self.available()}")
        return self.entries[name]  # type: ignore[index]

    def check_keys(self, name: object, keys: Iterable[str]) -> None:
        """Refuse a key that ``name``'s builder does not take, naming ``<group>.<key>``."""
        allowed = [p for p in inspect.signature(self.get(name)).parameters if p != "self"]
        for key in keys:
            if key not in allowed:
                raise ConfigError(f"{self.group}.{key}: unknown key for {self.group} {name!r}; "
                                  f"expected {allowed or 'none'}")
