"""Shared fixtures: compose configs the way `run.py` does, run `run.py` as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import compression
from compression._native import Library, compiler

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


# ---- compressors: a C kernel against its eager torch path -----------------------------------
def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (float32 as int32), flat: equal means bit for bit."""
    return t.reshape(-1).view(torch.int32)


SimulatedRun = tuple[list[tuple[torch.Tensor, list[int]]], list[torch.Tensor]]


def simulate_run(name: str, shape: tuple[int, ...], steps: list[list[torch.Tensor]], key: str,
                 **params: object) -> SimulatedRun:
    """Run compressor ``name`` on simulated workers over ``steps``: each step's aggregate and
    bits, and each worker's (settled) ``memory[key]`` at the end."""
    sim = compression.Simulation(name, len(steps[0]), shape, **params)
    outs = [sim.step(grads) for grads in steps]
    return outs, [sim.memory(w)[key] for w in range(len(steps[0]))]


def assert_same_bits(got: SimulatedRun, expected: SimulatedRun) -> None:
    """Two :func:`simulate_run` results agree bit for bit: aggregates, bits and memories."""
    for (out, bits), (out_e, bits_e) in zip(got[0], expected[0], strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e)) and bits == bits_e
    for memory, memory_e in zip(got[1], expected[1], strict=True):
        assert torch.equal(bits_of(memory), bits_of(memory_e))


def require_kernel(library: Library) -> None:
    """Skip where there is no C compiler; where there is one, ``library`` must build."""
    if compiler() is None:
        pytest.skip(f"no C compiler: {library.name} runs its eager path only")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a build failure's warning fails the test
        assert library.get() is not None


@contextmanager
def without_a_compiler(library: Library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> Iterator[list[warnings.WarningMessage]]:
    """Inside: ``library`` cannot be built (no compiler), and the warnings it gives are
    recorded (at least one is required); afterwards it is built (or found) anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    library.reset()
    try:
        with pytest.warns(RuntimeWarning, match="eager torch path") as record:
            yield record
    finally:
        library.reset()


# ---- analysis: real run records of tiny runs, trained once per session ----------------------
@pytest.fixture(scope="session")
def analysis_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs dir of :mod:`tests.analysis_fixture` (read-only: copy it to change it)."""
    from tests.analysis_fixture import train_fixture_runs

    return train_fixture_runs(tmp_path_factory.mktemp("analysis"))
