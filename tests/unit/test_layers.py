"""The folders form layers that import one way: a folder imports only folders of lower layers.

``core`` (errors, LR schedule, run record, process groups) is the base; ``models``, ``data`` and
``compression`` build on it alone; ``schedulers`` drive compressors; ``jobs`` (sweep plans,
run directories, signals, faults) builds on data and models; ``training`` wires all of them
together for ``run.py``; ``analysis``, ``benchmarks``, ``hydra_plugins`` (the sweeper
and launcher) and ``tools`` (docs and config tooling) sit on top. Tests may import
anything.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

LAYER = {"core": 0, "models": 1, "data": 1, "compression": 1, "schedulers": 2, "jobs": 2,
         "training": 3,
         "run": 4, "analysis": 4, "benchmarks": 4, "hydra_plugins": 4, "tools": 4}


def project_imports(path) -> set[str]:
    """Top-level project folders that the module at ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in LAYER)
    return found


def modules() -> list:
    paths = [ROOT / "run.py"]
    for folder in LAYER:
        if (ROOT / folder).is_dir():
            paths += sorted((ROOT / folder).rglob("*.py"))
    return paths


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path) -> None:
    own = path.relative_to(ROOT).parts[0].removesuffix(".py")
    upward = {name for name in project_imports(path)
              if name != own and LAYER[name] >= LAYER[own]}
    assert not upward, f"{path.relative_to(ROOT)} ({own}, layer {LAYER[own]}) imports " \
                       f"{sorted(upward)} of the same or a higher layer"
