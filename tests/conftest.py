"""Shared fixtures: compose configs the way `run.py` does, run `run.py` as users do."""

from __future__ import annotations

import atexit
import copy
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
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
            timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `run.py` from the repository root as a user would: ``python run.py ARGS``, or
    ``torchrun --standalone --nproc-per-node NPROC run.py ARGS`` when ``nproc`` > 1.

    Unless ``fresh``, the processes are forked from a warm interpreter that imported torch and
    the suite once (:mod:`tests.forkserver`; the ranks get torchrun's variables and rendezvous
    on a store their parent holds, as under torchrun's agent): the same runs, without about 13
    CPU-seconds of imports a launch. ``fresh``, or an ``env`` that changes a variable read while
    a process starts (:data:`STARTUP_VARIABLES`), starts new processes and the real torchrun.
    """
    base = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    full_env = {**base, **(env or {})}
    server = None if fresh else _forkserver(base, full_env)
    if server is not None and server.lock.acquire(blocking=False):  # busy: another thread's run
        try:
            return server.run(args, nproc, full_env, timeout)
        finally:
            server.lock.release()
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return subprocess.run(cmd + ["run.py", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


# Variables read while the interpreter or a library starts (libgomp's and MKL's thread counts,
# torch's logging, sys.path, the dynamic loader, coverage's start-up hook): a process forked
# after the start keeps the server's.
STARTUP_VARIABLES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "DNNL_",
                     "ONEDNN_", "ATEN_", "TORCH", "CUDA_", "NVIDIA_", "COVERAGE_")


class ForkServer:
    """The client of one :mod:`tests.forkserver` process (one per pytest worker)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forkserver.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                                     env=env, bufsize=0)
        # False where its imports started a thread or CUDA: then every run starts afresh.
        self.ready = bool(self._reply(None)["ready"])
        atexit.register(self.close)

    def close(self) -> None:
        """End the server (it exits when its stdin closes)."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` may be forked from this server."""
        keys = {k for k in (*self.env, *env) if k.startswith(STARTUP_VARIABLES)}
        return self.ready and self.proc.poll() is None and \
            all(self.env.get(k) == env.get(k) for k in keys)

    def run(self, args: list[str], nproc: int, env: dict[str, str], timeout: float
            ) -> subprocess.CompletedProcess[str]:
        """The run's exit status and output, as ``subprocess.run`` gives them."""
        cmd = ["forkserver", f"nproc={nproc}", "run.py", *args]
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": args, "nproc": nproc, "env": env, "cwd": str(ROOT),
                       "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            job = self._reply(None)["pid"]
            try:
                code = self._reply(time.monotonic() + timeout)["returncode"]
            except TimeoutError:
                os.killpg(job, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(),
                                                err.read_text()) from None
            return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())

    def _reply(self, deadline: float | None) -> dict[str, Any]:
        """The server's next JSON line; TimeoutError past ``deadline`` (monotonic)."""
        fd, line = self.proc.stdout.fileno(), b""
        while not line.endswith(b"\n"):
            wait = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1)
            if not chunk:
                raise RuntimeError(f"tests/forkserver.py ended (status {self.proc.wait()})")
            line += chunk
        return json.loads(line)


_SERVER: list[ForkServer] = []  # this pytest process's, started at its first run_cli


def _forkserver(base: dict[str, str], env: dict[str, str]) -> ForkServer | None:
    """This process's fork server (started with ``base``) if it may fork a run with ``env``."""
    if not _SERVER or _SERVER[0].proc.poll() is not None:
        _SERVER[:] = [ForkServer(base)]
    return _SERVER[0] if _SERVER[0].serves(env) else None


def run_options(conf: Path, group: str, options: list[str], common: list[str], out: Path,
                env: dict[str, str] | None = None) -> Path:
    """One run of `run.py` for each option of the config ``group`` written below ``conf`` (the
    runs of ``run.py -m +GROUP=a,b,...``), into ``out/<i>``, each forked by :func:`run_cli`
    instead of started afresh by the sweep's launcher (the sweep tests test that); ``out``."""
    for i, option in enumerate(options):
        assert_ok(run_cli([f"hydra.searchpath=[file://{conf}]", f"+{group}={option}", *common,
                           f"hydra.run.dir={out / str(i)}"], env=env))
    return out


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


# make test hands whole files to its pytest-xdist workers (--dist loadfile) in the order
# collected (--no-loadscope-reorder): the slowest files first (longest-processing-time first),
# so that short files fill the end and neither worker idles while the other finishes a long
# one. Each part's slowest, slowest first, by `make test PYTEST_FLAGS=--durations=0` on the
# 2-core machine (2026-12-07); a file not named keeps its place after these.
SLOWEST_FIRST = (
    "tests/e2e/test_sweep_launch.py", "tests/e2e/test_run.py", "tests/e2e/test_numerics.py",
    "tests/e2e/test_faults_e2e.py", "tests/e2e/test_bench_e2e.py", "tests/e2e/test_smoke_gpu.py",
    "tests/unit/test_resume_matrix.py", "tests/unit/test_sweeps.py",
    "tests/unit/test_config_fuzz.py", "tests/unit/test_bench_portable_step.py",
    "tests/unit/test_scorecard.py", "tests/unit/test_config.py", "tests/unit/test_plan.py",
)


def _slowest_first(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOWEST_FIRST.index(path) if path in SLOWEST_FIRST else len(SLOWEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (:data:`SLOWEST_FIRST`; a stable sort: a file's tests keep
    their order); skip tests marked ``gpu`` where no CUDA device is present, and those marked
    ``stress`` or ``slurm`` without ``--stress`` or ``--slurm``."""
    items.sort(key=_slowest_first)
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
