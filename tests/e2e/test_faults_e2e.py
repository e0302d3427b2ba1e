"""Faults under real processes: a rank killed or stopped mid-epoch under torchrun, every
collective of the loop against a stopped peer, a full disk (a small tmpfs), W&B's server down,
a NaN gradient on one rank. Nothing is mocked: signals, sockets, file
systems and torch.distributed are the real ones.

The cases that repeat one of these for every compressor are marked ``stress``: `make stress`
runs them (pytest --stress), `make test` runs one compressor each.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, TINY, assert_ok, made_once, read_rows, run_cli, same_rows
from training import checkpoint

TIMEOUT_S = 10  # trainer.dist_timeout_s of these runs
# Each rank waits up to 5 s for the others' posts (jobs.faults.WAIT_S), then Python and
# torch take a few seconds to exit on a loaded 2-core machine.
MARGIN_S = 12
PRESETS = ["topk_authors", "powersgd_authors"]


def compressors() -> list[str]:
    import compression

    return compression.available() + PRESETS


def stress_unless(first: str) -> list:
    """Every compressor; all but ``first`` marked ``stress`` (run by `make stress` only)."""
    return [c if c == first else pytest.param(c, marks=pytest.mark.stress)
            for c in compressors()]


def fault_args(compressor: str, run_dir: Path, epochs: int = 4) -> list[str]:
    """A short 2-rank run (8 steps an epoch); Accordion switching levels every epoch where the
    compressor has levels."""
    import compression

    sched = (["scheduler=accordion", "scheduler.interval=1"]
             if compressor.split("_")[0] in compression.with_levels() else [])
    return [*TINY, "dataset.subset=256", f"compressor={compressor}", *sched,
            f"trainer.epochs={epochs}", f"trainer.dist_timeout_s={TIMEOUT_S}",
            f"hydra.run.dir={run_dir}"]


# ---- torchrun jobs we can reach into ------------------------------------------------------------
def launch(args: list[str], log: Path, watched: bool = False) -> subprocess.Popen:
    """torchrun with 2 workers. Unless ``watched``, the agent does not look at them for 10
    minutes: a worker that ends must end the job by itself (torchrun would otherwise stop the
    other one); watched, it reports their exit statuses as usual."""
    monitor = [] if watched else ["--monitor-interval=600"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           *monitor, "run.py", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def workers(agent: subprocess.Popen, deadline_s: float = 120) -> dict[int, int]:
    """The agent's worker processes by rank (read from /proc: children and their RANK)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        ranks = {}
        for pid in map(int, children):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):  # a short-lived child, gone since
                continue
            rank = [e for e in env if e.startswith(b"RANK=")]
            if rank:
                ranks[int(rank[0][5:])] = pid
        if len(ranks) == 2:
            return ranks
        time.sleep(0.1)
    raise AssertionError("torchrun did not start 2 workers")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (or is stopped): not gone, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, limit_s: float) -> float:
    """Seconds until ``pid`` ends (at most ``limit_s``, then inf)."""
    start = time.monotonic()
    while alive(pid):
        if time.monotonic() - start > limit_s:
            return math.inf
        time.sleep(0.05)
    return time.monotonic() - start


def wait_for(path: Path, agent: subprocess.Popen, log: Path, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert agent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def end(agent: subprocess.Popen, ranks: dict[int, int]) -> None:
    """Stop the agent and whatever is left of its workers (torchrun starts each in a session
    of its own: a stopped one would outlive the agent)."""
    for pid in ranks.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(timeout=60)


def straight_run(compressor: str, folder: Path) -> Path:
    """``fault_args``' run that nothing stops, in ``folder``: its directory."""
    assert_ok(run_cli(fault_args(compressor, folder / "straight"), nproc=2))
    return folder / "straight"


def seeded_fault(compressor: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, Path, random.Random, int]:
    """The run that never fails (``straight``, run to the end once per pytest run and shared:
    read-only), the directory of the one that will (``faulty``), and a freshly seeded RNG for the
    fault's timing (the seed goes in every assertion message: a failure can be replayed)."""
    straight = made_once(tmp_path_factory, f"straight_{compressor}",
                         lambda folder: straight_run(compressor, folder))
    seed = random.randrange(2**32)
    return straight, tmp_path / "faulty", random.Random(seed), seed


@contextlib.contextmanager
def past_first_checkpoint(compressor: str, run_dir: Path, log: Path, watched: bool = False
                          ) -> Iterator[tuple[subprocess.Popen, dict[int, int]]]:
    """A 2-rank job of ``fault_args`` once its first checkpoint exists: (agent, pid by rank).
    Whatever is left of it is killed on the way out."""
    agent = launch(fault_args(compressor, run_dir), log, watched)
    ranks: dict[int, int] = {}
    try:
        ranks = workers(agent)
        wait_for(run_dir / "checkpoint.pt", agent, log)
        yield agent, ranks
    finally:
        end(agent, ranks)


def error_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("error: ")]


# ---- 1. a rank dies mid-epoch ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("compressor", stress_unless("topk"))
def test_killed_rank_ends_the_job_and_the_run_resumes_bit_exactly(tmp_path, tmp_path_factory,
                                                                  compressor):
    straight, faulty, rng, seed = seeded_fault(compressor, tmp_path, tmp_path_factory)
    victim, delay = rng.randrange(2), rng.uniform(0.0, 1.5)  # mid-epoch 1 or 2, either rank
    note = f"seed {seed}: SIGKILL to rank {victim} {delay:.2f} s after the first checkpoint"
    log = tmp_path / "faulty.log"
    with past_first_checkpoint(compressor, faulty, log) as (_, ranks):
        time.sleep(delay)
        assert not (faulty / "summary.json").exists(), note  # killed while still training
        os.kill(ranks[victim], signal.SIGKILL)
        waited = wait_gone(ranks[1 - victim], TIMEOUT_S + MARGIN_S)
    assert waited <= TIMEOUT_S + MARGIN_S, f"{note}: the survivor hangs"
    summary = json.loads((faulty / "summary.json").read_text())
    assert summary["status"].startswith(f"failed: lost rank {victim} "), (note, summary)
    (line,) = error_lines(log)
    assert line.startswith(f"error: lost rank {victim} ") and "resume=true" in line, note
    assert "Traceback" not in log.read_text(), note
    # The last checkpoint is whole (its CRCs pass) and the record covers it.
    epoch = checkpoint.check_resumable(faulty, _config(faulty), 2)
    assert 1 <= epoch <= len(read_rows(faulty)) <= epoch + 1, note
    assert_ok(run_cli([*fault_args(compressor, faulty), "resume=true"], nproc=2))
    same_rows(read_rows(straight), read_rows(faulty))
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(faulty / "checkpoint.pt", weights_only=True)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), (note, key)
    assert json.loads((faulty / "summary.json").read_text())["params_in_sync"] is True


def _config(run_dir: Path):
    from omegaconf import OmegaConf

    return OmegaConf.load(run_dir / ".hydra" / "config.yaml")


@pytest.mark.slow
def test_stopped_rank_ends_the_job_within_the_timeout(tmp_path):
    # gloo notices a closed socket at once, but a stopped peer only through the timeout.
    log = tmp_path / "job.log"
    agent = launch(fault_args("powersgd", tmp_path / "run", epochs=20), log)
    ranks: dict[int, int] = {}
    try:
        ranks = workers(agent)
        wait_for(tmp_path / "run" / "checkpoint.pt", agent, log)
        time.sleep(random.uniform(0.0, 1.0))
        os.kill(ranks[1], signal.SIGSTOP)
        waited = wait_gone(ranks[0], TIMEOUT_S + MARGIN_S)
        assert alive(ranks[1])  # stopped, not gone: only the timeout could end rank 0
    finally:
        end(agent, ranks)
    assert TIMEOUT_S - 1 <= waited <= TIMEOUT_S + MARGIN_S, waited
    status = json.loads((tmp_path / "run" / "summary.json").read_text())["status"]
    assert status.startswith("failed: lost rank 1 "), status
    assert "timed out" in status.lower() or "timeout" in status.lower(), status
    (line,) = error_lines(log)
    assert line.startswith("error: lost rank 1 "), line


def _collectives_main(rank: int, port: int, queue) -> None:
    """Each collective the training loop uses, on rank 0, while rank 1 is stopped."""
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import compression
    import run
    import schedulers
    from compression.hook import comm_hook
    from core import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env = distributed.DistEnv(rank, 2, rank, "torchrun")
    distributed.init(env, torch.device("cpu"), 2.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 3))
    ddp, plain = DDP(model), DDP(nn.Linear(3, 2))  # with buffers (BatchNorm's), without
    state = compression.build(OmegaConf.create({"name": "topk", "ratio": 0.5}),
                              plain.module.named_parameters())
    plain.register_comm_hook(state, comm_hook)
    sched = schedulers.build(OmegaConf.create({"name": "static"}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = OmegaConf.create({"seed": 0})
    x = torch.randn(2, 3, 8, 8)
    ddp(x).sum().backward()  # every collective once while both ranks are up
    plain(torch.randn(2, 3)).sum().backward()
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    time.sleep(0.5)
    calls = {
        "DDP forward (buffer broadcast)": lambda: ddp(x),
        "DDP backward (the hook's all-gather)": lambda: plain(torch.randn(2, 3)).sum().backward(),
        "all_reduce (train loss, evaluation)": lambda: dist.all_reduce(torch.ones(2)),
        "broadcast (BatchNorm buffers)": lambda: run._sync_buffers(model),
        "broadcast_object_list (run dir)": lambda: run._from_rank0("x"),
        "all_gather_object (epoch end)": lambda: run._end_of_epoch(state, env),
        "all_gather_object + barrier (checkpoint)": lambda: checkpoint.save(
            Path(os.environ["CKPT"]), cfg, 1, 0.0, model, opt, state, sched),
        "all_gather_object (params in sync)": lambda: run._params_in_sync(model),
        "barrier": dist.barrier,
    }
    for name, call in calls.items():
        start = time.monotonic()
        try:
            call()
            outcome = "returned"
        except RuntimeError as exc:
            outcome = type(exc).__name__
        queue.put((name, outcome, time.monotonic() - start))
    queue.put(None)


@pytest.mark.slow
def test_every_collective_of_the_loop_ends_on_a_stopped_peer(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("CKPT", str(tmp_path / "checkpoint.pt"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_collectives_main, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = []
        while (item := queue.get(timeout=240)) is not None:
            results.append(item)
    finally:
        for p in procs:
            p.kill()
            p.join(timeout=30)
    assert len(results) == 9, results
    for name, outcome, waited in results:
        assert outcome == "RuntimeError" and waited < 2.0 + 3.0, (name, outcome, waited)


# ---- 3. corrupt and partial files -------------------------------------------------------------
def _mount_tmpfs(path: Path, size: str, remount: bool = False) -> None:
    options = f"{'remount,' if remount else ''}size={size}"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


@pytest.mark.slow
def test_full_disk_is_one_line_and_loses_no_epoch(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_tmpfs(disk, "64m")
    try:
        run_dir = disk / "run"
        args = [*TINY, f"hydra.run.dir={run_dir}"]
        assert_ok(run_cli([*args, "trainer.epochs=1"]))
        size = (run_dir / "checkpoint.pt").stat().st_size
        # Room for one checkpoint and half of another: the next save fills the disk.
        _mount_tmpfs(disk, f"{(size + size // 2) // 1024 + 64}k", remount=True)
        proc = run_cli([*args, "trainer.epochs=3", "resume=true"])
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert line.startswith(f"error: RecordError: [Errno 28] cannot write "
                               f"{run_dir / 'checkpoint.pt'}: No space left on device; "), line
        assert "resume=true" in line
        assert not list(run_dir.glob(".*.tmp"))  # the partial checkpoint is gone
        assert checkpoint.check_resumable(run_dir, _config(run_dir), 1) == 1  # epoch 0, whole
        rows = read_rows(run_dir)
        assert [r["epoch"] for r in rows] == [0, 1]  # epoch 1's row, then its save failed
        status = json.loads((run_dir / "summary.json").read_text())["status"]
        assert status.startswith("failed: RecordError: [Errno 28]")
        _mount_tmpfs(disk, "64m", remount=True)  # space freed: the run goes on
        assert_ok(run_cli([*args, "trainer.epochs=3", "resume=true"]))
        done = read_rows(run_dir)
        assert [r["epoch"] for r in done] == [0, 1, 2] and done[0] == rows[0]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# ---- 4. W&B outages -----------------------------------------------------------------------------
def _silent_server() -> tuple[socket.socket, int]:
    """A loopback port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def _refusing_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _online(port: int) -> dict[str, str]:
    # A well-formed but made-up key: W&B only ever talks to the loopback port.
    return {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
            "WANDB_API_KEY": "0" * 40}


@pytest.mark.slow
def test_wandb_server_that_never_answers_costs_the_timeout_only(tmp_path):
    server, port = _silent_server()
    try:
        start = time.monotonic()
        proc = run_cli([*TINY, "trainer.epochs=2", "logger=wandb", "logger.mode=online",
                        "logger.init_timeout_s=3", "logger.finish_timeout_s=3",
                        f"hydra.run.dir={tmp_path}"], env=_online(port), timeout=300)
        took = time.monotonic() - start
    finally:
        server.close()
    assert_ok(proc)
    # W&B's defaults (90 s to start, then its error report to the same server) take far longer.
    assert took < 60, took
    assert proc.stderr.count("W&B failed to start (") == 1 and "Traceback" not in proc.stderr
    assert "continuing with the local run record only" in proc.stderr
    assert [r["epoch"] for r in read_rows(tmp_path)] == [0, 1]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_wandb_server_that_refuses_is_one_warning(tmp_path, monkeypatch):
    import warnings

    from omegaconf import OmegaConf

    from training.wandb_logger import WandbLogger

    for key, value in _online(_refusing_port()).items():
        monkeypatch.setenv(key, value)
    cfg = OmegaConf.create({"mode": "online", "project": "p", "init_timeout_s": 3,
                            "finish_timeout_s": 3})
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger = WandbLogger(cfg, {"seed": 0}, tmp_path)
        logger.log({"train/loss": 1.0}, step=0)
        logger.finish()
    assert time.monotonic() - start < 40
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "connection refused" in messages[0], messages
    assert logger.run is None


# ---- 7. a NaN or inf gradient on one rank ------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("compressor", stress_unless("adacomp"))
def test_nonfinite_gradient_on_one_rank_stops_every_rank_as_diverged(tmp_path, compressor):
    # 4 steps an epoch (128 examples, batch 32 over 2 ranks): backward 6 is epoch 1, step 2.
    args = [*fault_args(compressor, tmp_path, epochs=4), "dataset.subset=128"]
    proc = run_cli(args, nproc=2, env={"ACCORDION_BENCH_INJECT": "conv1.weight@1:6=inf"})
    assert_ok(proc)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged", summary
    assert summary["reason"].startswith("non-finite gradient in layer conv1.weight on rank 1 at "
                                        "epoch 1, step 2"), summary["reason"]
    assert summary["epochs_completed"] == 2 == len(read_rows(tmp_path))
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1  # saved after epoch 0; epoch 1's poisoned state never was
    tensors = [t for r in ckpt["per_rank"] for layer in r["compressor"]["layers"].values()
               for t in layer["memory"].values()]
    tensors += [t for t in ckpt["model"].values() if t.is_floating_point()]
    assert all(bool(t.isfinite().all()) for t in tensors)

