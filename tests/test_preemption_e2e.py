"""Preemption under real processes: SIGUSR1 (Slurm's warning before the time limit) or SIGTERM
reaches the workers of a 2-rank torchrun job at a random step, at different times on each; the
ranks agree on one step boundary, write a mid-epoch checkpoint and exit with the signal's status;
the relaunched run (``resume=true``, or ``resume=auto`` as a sweep relaunch does) ends with the
same metrics and weights as a run that never stopped. Under submitit's local executor, the
preempted job is requeued by submitit itself and finishes on its own."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import ROOT, assert_ok, read_rows, run_cli
from tests.test_faults_e2e import end, fault_args, same_rows, wait_for, workers
from training import checkpoint

pytestmark = pytest.mark.slow
STEPS = 8  # steps per epoch of fault_args' runs


def compressors_and_signals() -> list:
    """PowerSGD (warm-start Q, error feedback), Top-K and AdaComp (residues) under SIGUSR1;
    Top-K under SIGTERM, relaunched as a sweep would (``resume=auto``)."""
    return [("powersgd", "SIGUSR1", "true"), ("topk", "SIGTERM", "auto"),
            ("adacomp", "SIGUSR1", "true")]


def _launch(args: list[str], log: Path) -> subprocess.Popen:
    """torchrun with 2 workers, watching them as usual (it reports their exit statuses)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "run.py", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def same_weights(a: Path, b: Path) -> None:
    wa = torch.load(a / "checkpoint.pt", weights_only=False)["model"]
    wb = torch.load(b / "checkpoint.pt", weights_only=False)["model"]
    for key, value in wa.items():
        assert torch.equal(value, wb[key]), key


@pytest.mark.parametrize(("compressor", "name", "resume"), compressors_and_signals())
def test_preempted_job_checkpoints_mid_epoch_and_resumes_bit_exactly(tmp_path, compressor,
                                                                     name, resume):
    signum = signal.Signals[name]
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    assert_ok(run_cli(fault_args(compressor, straight), nproc=2))
    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    delay, skew = rng.uniform(0.0, 1.0), rng.uniform(0.0, 0.3)
    first = rng.randrange(2)
    note = (f"seed {seed}: {name} to rank {first} {delay:.2f} s after the first checkpoint, "
            f"to the other {skew:.2f} s later")
    log = tmp_path / "faulty.log"
    agent = _launch(fault_args(compressor, faulty), log)
    ranks: dict[int, int] = {}
    try:
        ranks = workers(agent)
        wait_for(faulty / "checkpoint.pt", agent, log)
        time.sleep(delay)
        os.kill(ranks[first], signum)
        time.sleep(skew)  # the ranks hear of it at different steps
        with contextlib.suppress(ProcessLookupError):  # gone: the other rank's signal sufficed
            os.kill(ranks[1 - first], signum)
        agent.wait(timeout=120)
    finally:
        end(agent, ranks)
    text = " ".join(log.read_text().split())
    summary = json.loads((faulty / "summary.json").read_text())
    assert summary["status"].startswith(f"preempted: {name} at epoch "), (note, text[-3000:])
    assert f"exitcode: {128 + signum}" in text, note  # both workers, as torchrun reports them
    assert f'File "{ROOT}/run.py"' not in text, note  # no traceback from the run itself
    assert f"{summary['status']}; the run resumes from its last checkpoint with resume=true" \
        in text, note
    # A mid-epoch checkpoint: both ranks stopped after the same step, no partial metrics row.
    ckpt = torch.load(faulty / "checkpoint.pt", weights_only=False)
    epoch, step = ckpt["epoch"], ckpt["step"]
    assert summary["status"].startswith(f"preempted: {name} at epoch {epoch}, step {step}"), note
    assert epoch >= 1 and 1 <= step <= STEPS, note
    assert [r["progress"]["step"] for r in ckpt["per_rank"]] == [step, step], note
    assert len(read_rows(faulty)) == epoch, note
    assert checkpoint.check_resumable(faulty, OmegaConf.load(faulty / ".hydra" / "config.yaml"),
                                      2) == epoch
    # Relaunched, it continues from that step and ends as the run that never stopped.
    assert_ok(run_cli([*fault_args(compressor, faulty), f"resume={resume}"], nproc=2))
    same_rows(read_rows(straight), read_rows(faulty))
    same_weights(straight, faulty)
    final = json.loads((faulty / "summary.json").read_text())
    assert final["status"] == "completed" and final["params_in_sync"] is True, note


def _submitit_sweep(root: Path, **kwargs) -> subprocess.Popen[str]:
    args = ["sweep=table1", "scale=tiny", "model=resnet18", "seed=0", "logger=none",
            "trainer.progress=false", "dataset.train_size=256", "dataset.test_size=64",
            "trainer.epochs=3", "method=rank2", "launcher=submitit_local", f"runs_root={root}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return subprocess.Popen([sys.executable, "run.py", "-m", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def _tasks(root_pid: int) -> dict[int, int]:
    """submitit's task processes under ``root_pid`` by global rank (from /proc)."""
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        todo += map(int, children)
        rank = [e for e in env if e.startswith(b"SUBMITIT_LOCAL_GLOBALID=")]
        if rank:
            found[int(rank[0].split(b"=")[1])] = pid
    return found


def test_submitit_requeues_a_preempted_job_which_resumes_mid_epoch(tmp_path):
    run = Path("table1/tiny/cifar10/resnet18/rank2/ours/seed0")
    straight = _submitit_sweep(tmp_path / "straight")
    out, _ = straight.communicate(timeout=900)
    assert straight.returncode == 0, out[-5000:]
    faulty = _submitit_sweep(tmp_path / "faulty", start_new_session=True)
    run_dir = tmp_path / "faulty" / run
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoint.pt").exists():
            assert faulty.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        tasks = _tasks(faulty.pid)
        assert len(tasks) == 2, tasks
        for pid in tasks.values():
            os.kill(pid, signal.SIGUSR1)
        out, _ = faulty.communicate(timeout=900)
    finally:
        if faulty.poll() is None:
            os.killpg(faulty.pid, signal.SIGKILL)
    assert faulty.returncode == 0, out[-5000:]
    logs = "".join(p.read_text() for p in
                   (tmp_path / "faulty" / "table1" / "tiny" / ".submitit").rglob("*_0_log.*"))
    assert "preempted: SIGUSR1 at epoch " in logs and "Requeued job" in logs, logs[-3000:]
    same_rows(read_rows(tmp_path / "straight" / run), read_rows(run_dir))
    same_weights(tmp_path / "straight" / run, run_dir)
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["status"] == "completed" and final["params_in_sync"] is True
