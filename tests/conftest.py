"""Shared fixtures: compose configs the way `run.py` does, run `run.py` as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Small and fast: narrow ResNet-18 on 128 digits, no W&B.
# Metrics that measure time: they differ between otherwise identical runs.
TIMING = {"time/epoch_s", "samples_per_s", "time/compress_s"}
TINY = ["model.width=8", "dataset.subset=128", "trainer.batch_size=32", "logger=none",
        "trainer.progress=false", "trainer.device=cpu"]


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    """``compose_cfg(*overrides)``: the config `run.py` would see."""

    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=False)

    return _compose


def run_cli(args: list[str], nproc: int = 1, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `run.py` (under torchrun when ``nproc`` > 1) from the repository root."""
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run(cmd + ["run.py", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    """The run succeeded; otherwise show the end of its output."""
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"


def read_rows(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where no CUDA device is present."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
