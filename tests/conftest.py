"""Shared fixtures: compose configs the way `run.py` does, run `run.py` as users do."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


# ---- compressors: simulated gradients, AdaComp's reference (test_compression.py and
# test_adacomp_kernel.py) ------------------------------------------------------------
def random_steps(shape: tuple[int, ...], workers: int, steps: int, seed: int = 0
                 ) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=gen) for _ in range(workers)] for _ in range(steps)]


def ref_adacomp(steps: list[list[torch.Tensor]], bin_size: int, soft: bool = True
                ) -> tuple[list[torch.Tensor], list[list[int]], list[torch.Tensor]]:
    """Chen et al. Alg. 2, bin by bin, element by element (float64).

    Returns the mean outputs, the paper's bits per worker per step, and the final residues.
    """
    n = steps[0][0].numel()
    residues = [torch.zeros(n, dtype=torch.float64) for _ in steps[0]]
    outs, bits = [], []
    for grads in steps:
        quantized, step_bits = [], []
        for w, g in enumerate(grads):
            dw = g.double().reshape(-1)
            big_g = residues[w] + dw
            h = big_g + dw
            bins = [range(i, min(i + bin_size, n)) for i in range(0, n, bin_size)]
            g_max = [max(abs(float(big_g[j])) for j in b) for b in bins]
            s = sum(g_max) / len(g_max)
            g_q = torch.zeros(n, dtype=torch.float64)
            for b, gm in zip(bins, g_max, strict=True):
                if soft:
                    chosen = [j for j in b if abs(float(h[j])) >= gm]
                else:
                    chosen = [max(b, key=lambda j: abs(float(big_g[j])))]
                for j in chosen:
                    g_q[j] = math.copysign(s, float(big_g[j])) if big_g[j] != 0 else 0.0
            residues[w] = big_g - g_q
            sent = int((g_q != 0).sum())
            step_bits.append(sent * (8 if bin_size < 64 else 16) + 32)
            quantized.append(g_q)
        outs.append(torch.stack(quantized).mean(0).reshape(grads[0].shape))
        bits.append(step_bits)
    return outs, bits, residues


def assert_outputs(got: list[tuple[torch.Tensor, list[int]]], want: list[torch.Tensor],
                   atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for (out, _), ref in zip(got, want, strict=True):
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=1e-4)


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
    """Inside: ``library`` cannot be built (no compiler); on the way out the list holds the
    warnings ``library`` itself gave (at least one is required; other kernels first built
    inside may warn too, they are left out). Afterwards it is built (or found) anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    library.reset()
    own: list[warnings.WarningMessage] = []
    try:
        with pytest.warns(RuntimeWarning, match="eager torch path") as record:
            yield own
        own += [w for w in record if str(w.message).startswith(f"{library.name}:")]
    finally:
        library.reset()


def kernel_and_eager(library: Library, name: str, steps: list[list[torch.Tensor]],
                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **params: Any
                     ) -> tuple[list[Any], list[Any]]:
    """``compression.simulate(name, steps, **params)`` as it runs here (``library``'s kernel),
    then without a compiler (the eager torch path; ``library`` must warn once): both results."""
    kernel = compression.simulate(name, steps, **params)
    with without_a_compiler(library, tmp_path, monkeypatch) as record:
        eager = compression.simulate(name, steps, **params)
    assert len(record) == 1
    return kernel, eager


# ---- analysis: real run records of tiny runs, trained once per session ----------------------
@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    """After a test that drew figures (pyplot keeps them open), close them."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(scope="session")
def analysis_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs dir of :mod:`tests.analysis_fixture` (read-only: copy it to change it)."""
    from tests.analysis_fixture import train_fixture_runs

    return train_fixture_runs(tmp_path_factory.mktemp("analysis"))
