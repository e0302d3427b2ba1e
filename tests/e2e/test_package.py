"""A non-editable install works: the wheel, installed into a fresh virtual environment and used
from outside the repository, imports every package, builds the C kernels from its installed
sources and composes the Hydra config from its installed ``conf/``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

# What is not the package's source: hidden files (version control, the virtual environment,
# caches, CI), byte code, build output, run records and datasets.
NOT_SOURCE = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "outputs",
                                    "multirun", "wandb", "datasets", "results")

# Run by the installed environment's Python, from a directory outside the repository.
CHECK = """
import importlib, sys, warnings
from pathlib import Path

site = Path(sys.argv[1])
for name in sys.argv[2:]:
    module = importlib.import_module(name)
    assert Path(module.__file__).is_relative_to(site), f"{name} from {module.__file__}"

from compression import _adacomp_kernel, _topk_kernel
from core import native as _native

assert _native.KERNELS.is_relative_to(site), _native.KERNELS
with warnings.catch_warnings():
    warnings.simplefilter("error")  # "could not be built" fails the check
    for kernel in (_adacomp_kernel, _topk_kernel):
        assert kernel.kernel() is not None, kernel.LIBRARY.name
print("checked")
"""


def project_files(source: Path) -> set[Path]:
    """What the wheel must install (relative paths): run.py, the Python files of the packages
    (every top-level folder with Python code, but the tests and the developers' tools/), the C
    kernels' sources, the Hydra
    configs (and every other YAML file of a package), the published reference numbers the analysis
    reads and the benchmarks' data tables."""
    files = {source / "run.py", *(source / "compression" / "kernels").iterdir(),
             *(source / "core" / "kernels").iterdir(),
             *(source / "analysis" / "reference").iterdir(), *(source / "benchmarks").glob("*.csv")}
    for folder in source.iterdir():
        if folder.is_dir() and folder.name not in ("tests", "tools"):
            files.update(folder.rglob("*.py"), folder.rglob("*.yaml"))
    return {path.relative_to(source) for path in files}


def installed_files(site: Path) -> set[Path]:
    """The files an install put into ``site`` (without its metadata and byte code)."""
    return {path.relative_to(site) for path in site.rglob("*")
            if path.is_file() and path.suffix not in (".pth", ".pyc")
            and not path.relative_to(site).parts[0].endswith(".dist-info")}


def module_name(path: Path) -> str:
    """``core/native.py`` -> ``core.native``; a package's ``__init__.py``: its
    name."""
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    # Build the wheel from a copy of the source tree (a build writes into the tree it builds).
    source, wheels, venv, outside = (tmp_path / name for name in
                                     ("source", "wheels", "venv", "outside"))
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    expected = project_files(source)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", wheels, source], cwd=tmp_path)
    [wheel] = wheels.glob("accordion_bench-*.whl")

    # A fresh environment with only the wheel; torch, hydra & co. come from this environment's
    # site-packages, after the new one's (a path in a .pth file, not a site directory: its own
    # .pth files, such as an editable install's, are not run).
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=tmp_path).stdout.strip())
    (site / "shared_dependencies.pth").write_text(
        "\n".join(sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}))
        + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         wheel], cwd=tmp_path)
    assert installed_files(site) == expected

    # Every module imports from the install, and the kernels build from the installed sources.
    outside.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    modules = sorted(module_name(path) for path in expected if path.suffix == ".py")
    assert "checked" in run([python, "-c", CHECK, site, *modules], outside, env).stdout
    assert list((tmp_path / "cache" / "accordion-bench").glob("adacomp_*.so"))

    # The installed run.py composes its config from the installed conf/.
    job = run([python, "-m", "run", "--cfg", "job", "experiment=demo", "compressor=adacomp"],
              outside, env).stdout
    assert "name: adacomp" in job and "fc_bin_size:" in job and "epochs: 3" in job
