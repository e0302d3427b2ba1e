"""Shared fixtures: compose configs the way `run.py` does, run `run.py` as users do."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Metrics that measure time: they differ between otherwise identical runs.
TIMING = {"time/epoch_s", "samples_per_s", "time/compress_s"}
# Small and fast: narrow ResNet-18 on 128 digits, tested on 64 (of 360: evaluation would cost as
# much as training), no W&B. The optimizer pinned (SGD 0.1, no warm-up), as the tests'
# expectations were written: the defaults (conf/optimizer/sgd.yaml) are a first run's, and may
# change.
TINY = ["model.width=8", "dataset.subset=128", "dataset.test_subset=64", "trainer.batch_size=32",
        "logger=none", "trainer.progress=false", "trainer.device=cpu", "optimizer.lr=0.1",
        "optimizer.schedule.warmup_epochs=0"]


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    """``compose_cfg(*overrides)``: the config `run.py` would see."""

    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=False)

    return _compose


def with_value(cfg: DictConfig, field: str, value: Any) -> DictConfig:
    """A copy of ``cfg`` with ``field`` (dotted, added if absent) set to ``value``: what the same
    override would compose, without a compose (about 0.4 s here)."""
    out = copy.deepcopy(cfg)
    OmegaConf.update(out, field, value, force_add=True, merge=False)
    return out


def run_cli(args: list[str], nproc: int = 1, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `run.py` (under torchrun when ``nproc`` > 1) from the repository root."""
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run(cmd + ["run.py", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def run_make(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``make ARGS`` from the repository root as a user would type it.

    Under ``make test`` the environment carries the outer make's ``MAKELEVEL`` and ``MAKEFLAGS``,
    which turn a nested make's output into "Entering directory" noise; they are dropped here.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "-o", ".venv/.installed", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    """The run succeeded; otherwise show the end of its output."""
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"


def read_rows(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def same_rows(a: list[dict], b: list[dict]) -> None:
    """Two runs' metric rows are equal, epoch by epoch, but for the timings."""
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        assert {k: v for k, v in row_a.items() if k not in TIMING} == \
               {k: v for k, v in row_b.items() if k not in TIMING}


def same_weights(a: Path, b: Path) -> None:
    """The final model weights in two run directories' checkpoints are bit for bit equal."""
    wa = torch.load(a / "checkpoint.pt", weights_only=True)["model"]
    wb = torch.load(b / "checkpoint.pt", weights_only=True)["model"]
    for key, value in wa.items():
        assert torch.equal(value, wb[key]), key


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress", action="store_true",
                     help="also run the tests marked stress (`make stress`)")
    parser.addoption("--slurm", action="store_true",
                     help="also run the tests marked slurm (`make test-slurm`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where no CUDA device is present, and those marked ``stress`` or
    ``slurm`` without ``--stress`` or ``--slurm``."""
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA device")
    if not config.getoption("--stress"):
        skips["stress"] = pytest.mark.skip(reason="runs with --stress (make stress)")
    if not config.getoption("--slurm"):
        skips["slurm"] = pytest.mark.skip(reason="runs with --slurm (make slurm-up test-slurm)")
    for item in items:
        for marker, skip in skips.items():
            # The marker itself: `marker in item.keywords` also matches a folder of that name
            # above the test (a checkout in .../gpu/ skipped the whole suite).
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


# ---- analysis: real run records of tiny runs, trained once per session ----------------------
@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """After a test that drew figures (pyplot keeps them open), close them."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], Path]) -> Path:
    """``make(folder)``'s path, made once per pytest run (read-only to its readers: copy it to
    change it). Under pytest-xdist (make test) the first worker to ask makes it in the workers'
    shared temporary folder while the others wait on a lock, then all read it; a ``make`` that
    fails leaves it to the next to ask."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent
    made = shared / f"{name}.made"  # holds the path, once made
    with FileLock(str(shared / f"{name}.lock")):
        if not made.exists():
            made.write_text(str(make(tmp_path_factory.mktemp(name))))
    return Path(made.read_text())


@pytest.fixture(scope="session")
def analysis_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs dir of :mod:`tests.analysis_fixture`, trained once per pytest run
    (:func:`made_once`)."""
    from tests.analysis_fixture import train_fixture_runs

    return made_once(tmp_path_factory, "analysis", train_fixture_runs)
