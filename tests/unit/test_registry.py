"""core.registry: the one registry behind compressors, schedulers, models and datasets."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import compression
import data
import models
import schedulers
from core.errors import ConfigError
from core.registry import Registry

GROUPS = {"compressor": compression.REGISTRY, "scheduler": schedulers.REGISTRY,
          "model": models.REGISTRY, "dataset": data.REGISTRY}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``plugins`` of two modules, each registering into the registry it is handed."""
    root = tmp_path / "plugins"
    root.mkdir()
    (root / "__init__.py").write_text("from core.registry import Registry\n"
                                      "REGISTRY = Registry('widget', 'plugins', "
                                      "{'a': 'first', 'b': 'second', 'c': 'second'})\n")
    (root / "first.py").write_text("from plugins import REGISTRY\n"
                                   "@REGISTRY.register('a')\n"
                                   "class A:\n    def __init__(self, size=1): pass\n")
    (root / "second.py").write_text("from plugins import REGISTRY\n"
                                    "@REGISTRY.register('b', 'c')\n"
                                    "def build(): return 'b'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("plugins", "plugins.first", "plugins.second"):
        sys.modules.pop(name, None)


def test_a_name_imports_only_its_own_module(package):
    from plugins import REGISTRY
    assert REGISTRY.get("a").name == "a"  # a class learns its name
    assert "plugins.first" in sys.modules and "plugins.second" not in sys.modules
    assert REGISTRY.get("c")() == "b" and REGISTRY.get("b") is REGISTRY.get("c")
    assert not hasattr(REGISTRY.get("b"), "name")  # a function is left as it is


def test_an_unknown_name_is_refused_listing_every_choice(package):
    from plugins import REGISTRY
    with pytest.raises(ConfigError) as exc:
        REGISTRY.get("z")
    assert str(exc.value) == "widget.name: unknown widget 'z'; choose one of ['a', 'b', 'c']"
    assert not REGISTRY.exists(["a"]) and not REGISTRY.exists(None)


def test_an_unknown_key_is_refused_naming_the_field(package):
    from plugins import REGISTRY
    REGISTRY.check_keys("a", ["size"])
    with pytest.raises(ConfigError, match=r"^widget\.rank: unknown key for widget 'a'; "
                                          r"expected \['size'\]$"):
        REGISTRY.check_keys("a", ["size", "rank"])
    with pytest.raises(ConfigError, match=r"^widget\.x: unknown key for widget 'b'; "
                                          r"expected none$"):
        REGISTRY.check_keys("b", ["x"])
    with pytest.raises(ConfigError, match=r"^widget\.name: unknown widget 'z'"):
        REGISTRY.check_keys("z", ["x"])  # the name is checked before its keys


@pytest.mark.parametrize("group", GROUPS)
def test_each_name_is_registered_by_the_module_its_group_lists(group):
    registry: Registry = GROUPS[group]
    listed = set(registry.modules)
    assert set(registry.available()) == listed  # nothing registered that the map leaves out
    for name, module in registry.modules.items():
        entry = registry.get(name)
        assert entry.__module__ == f"{registry.package}.{module}", name


def test_asking_for_a_model_or_dataset_imports_no_other_model_or_dataset():
    # why the modules are listed by name: AlexNet's and the file datasets' modules import
    # torchvision, seconds of start-up for a run that does not use them
    code = textwrap.dedent("""
        import sys, models, data, compression, schedulers
        models.REGISTRY.get("resnet18"); data.REGISTRY.get("synthetic")
        compression.REGISTRY.get("topk"); schedulers.REGISTRY.get("accordion")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                        ("models", "data", "compression", "schedulers", "torchvision"))
        print(" ".join(loaded))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=models.__path__[0] + "/..").stdout.split()
    assert "torchvision" not in out
    assert "models.resnet18" in out and "models.alexnet" not in out and "models.vgg19bn" not in out
    assert "data.synthetic" in out and "data.cifar" not in out
