"""Sweeps launched for real: local 2-rank DDP jobs through the ddp launcher (interrupted,
relaunched: skip, resume, rerun), the Slurm code path through submitit's local executor, and a
job killed in a sweep under both (tests/e2e/test_slurm.py: the same against a real Slurm)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from jobs import runs
from tests.conftest import ROOT, read_rows, same_rows, same_weights

pytestmark = pytest.mark.slow

# Part of the tiny Table 1 with smaller data: ResNet-18's three methods (ours), one seed.
SMALL = ["sweep=table1", "scale=tiny", "model=resnet18", "variant=ours", "seed=0", "logger=none",
         "trainer.progress=false", "dataset.train_size=128", "dataset.test_size=64",
         "trainer.epochs=4"]
METHODS = ("rank2", "rank1", "accordion_rank2_rank1")


def sweep(args: list[str], env: dict[str, str] | None = None, **kwargs
          ) -> subprocess.Popen[str]:
    """``run.py -m`` of :data:`SMALL` and ``args`` (in ``env``, this process's by default)."""
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    return subprocess.Popen([sys.executable, "run.py", "-m", *SMALL, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-5000:]
    return out


def run_dirs(root: Path) -> dict[str, Path]:
    base = root / "table1" / "tiny" / "cifar10" / "resnet18"
    return {m: base / m / "ours" / "seed0" for m in METHODS}


def summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def test_relaunch_skips_resumes_and_reruns(tmp_path):
    dirs = run_dirs(tmp_path)
    args = [f"runs_root={tmp_path}", "hydra.launcher.nproc_per_node=2"]
    # 1. Interrupt the sweep (the whole process group, as Ctrl-C or a killed session would) while
    #    its second run is two epochs in.
    first = sweep(args, start_new_session=True)
    deadline = time.monotonic() + 600
    while not (dirs["rank1"] / "metrics.jsonl").exists() or len(read_rows(dirs["rank1"])) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-5000:]
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGTERM)
    first.communicate(timeout=120)
    assert summary(dirs["rank2"])["status"] == "completed"
    interrupted = read_rows(dirs["rank1"])
    assert 2 <= len(interrupted) < 4
    # torchrun passed the SIGTERM on: the workers stopped together at a step boundary
    assert summary(dirs["rank1"])["status"].startswith("preempted: SIGTERM at epoch ")
    assert not dirs["accordion_rank2_rank1"].exists()
    # 2. A run that crashed: its record says so.
    (dirs["rank2"] / "summary.json").write_text(json.dumps({"status": "failed: RuntimeError: x"}))
    old_rank2 = read_rows(dirs["rank2"])
    # 3. Relaunch: rerun the failed run, resume the interrupted one, start the missing one.
    out = finish(sweep(args))
    assert "3 runs: 0 complete, 1 to resume, 1 failed to rerun, 1 to start" in out
    assert all(summary(d)["status"] == "completed" and summary(d)["params_in_sync"]
               for d in dirs.values())
    resumed = read_rows(dirs["rank1"])
    done = torch.load(dirs["rank1"] / "checkpoint.pt", weights_only=True)
    assert [r["epoch"] for r in resumed] == [0, 1, 2, 3] and done["world_size"] == 2
    # the epochs of the last checkpoint are kept as they were (not trained again); the row after
    # it may have been written just before the kill
    assert resumed[:len(interrupted) - 1] == interrupted[:len(interrupted) - 1]
    assert read_rows(dirs["rank2"] / "failed" / "0") == old_rank2
    assert [r["epoch"] for r in read_rows(dirs["rank2"])] == [0, 1, 2, 3]
    # 4. Everything is complete: a relaunch starts no run.
    stamps = {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}
    out = finish(sweep(args))
    assert "3 runs: 3 complete, 0 to resume, 0 failed to rerun, 0 to start" in out
    assert stamps == {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}


def test_a_run_directory_of_another_config_stops_the_sweep(tmp_path):
    args = [f"runs_root={tmp_path}", "method=rank2", "trainer.epochs=1"]
    finish(sweep(args))
    proc = sweep([*args[:-1], "trainer.epochs=2"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-3000:]
    error = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "holds a run of another config (trainer.epochs: 1 there, 2 now)" \
        in error[0] and "Traceback" not in out


SUBMITIT = ["launcher=submitit_local", "trainer.epochs=6"]


@pytest.fixture(scope="module")
def submitit_sweep(tmp_path_factory) -> tuple[Path, str]:
    """A 2-job sweep of 2-rank runs through submitit's local executor (its runs root, output)."""
    root = tmp_path_factory.mktemp("submitit")
    return root, finish(sweep([f"runs_root={root}", *SUBMITIT,
                               "method=rank2,accordion_rank2_rank1"]))


def two_rank_runs_completed(root: Path, methods: tuple[str, ...], epochs: int) -> None:
    """The sweep's runs of these methods completed on 2 ranks in sync, every epoch recorded."""
    for method in methods:
        path = run_dirs(root)[method]
        assert summary(path)["status"] == "completed" and summary(path)["params_in_sync"]
        assert torch.load(path / "checkpoint.pt", weights_only=True)["world_size"] == 2
        assert len(read_rows(path)) == epochs


def test_submitit_local_sweep_of_two_rank_jobs(submitit_sweep):
    # The Slurm launcher's code path: each job is 2 tasks that find their rank through submitit.
    root, out = submitit_sweep
    assert "2 runs: 0 complete, 0 to resume, 0 failed to rerun, 2 to start" in out
    two_rank_runs_completed(root, ("rank2", "accordion_rank2_rank1"), 6)
    logs = list((root / "table1" / "tiny" / ".submitit").rglob("*_log.out"))
    assert len(logs) == 4  # 2 jobs x 2 tasks


def submitit_tasks(root: Path, proc: subprocess.Popen[str], deadline_s: float = 300
                   ) -> dict[int, int]:
    """The task processes of the submitit job whose folder is under ``root``, by global rank
    (read from /proc: ``SUBMITIT_LOCAL_GLOBALID`` and the job's command in their environment)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        tasks = {}
        for entry in Path("/proc").iterdir():
            try:
                env = dict(e.split(b"=", 1) for e in (entry / "environ").read_bytes().split(b"\0")
                           if b"=" in e) if entry.name.isdigit() else {}
            except OSError:  # gone, or not ours to read
                continue
            if str(root).encode() in env.get(b"SUBMITIT_LOCAL_COMMAND", b"") \
                    and b"SUBMITIT_LOCAL_GLOBALID" in env:
                tasks[int(env[b"SUBMITIT_LOCAL_GLOBALID"])] = int(entry.name)
        if len(tasks) == 2:
            return tasks
        assert proc.poll() is None, proc.stdout.read()[-5000:]
        time.sleep(0.1)
    raise AssertionError("submitit did not start the job's 2 tasks")


def test_submitit_requeues_a_preempted_job_that_resumes_bit_exactly(tmp_path,
                                                                     submitit_sweep):
    # Slurm's warning before the time limit reaches the tasks of a submitit job (submitit's own
    # signal, SIGUSR2, as --signal=USR2@<s> sends it; a little apart on each task): the ranks
    # stop at one step boundary, rank 0 takes submitit's requeue (the local executor restarts
    # the tasks, as Slurm requeues the job), and the requeued job resumes mid-epoch
    # (resume=auto) to end as a job that never stopped.
    straight = run_dirs(submitit_sweep[0])["rank2"]  # the same job, never stopped
    root = tmp_path / "requeued"
    proc = sweep([f"runs_root={root}", *SUBMITIT, "method=rank2"], start_new_session=True)
    run_dir = run_dirs(root)["rank2"]
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoint.pt").exists():  # the first epoch is done
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.05)
    tasks = submitit_tasks(root, proc)
    os.kill(tasks[0], signal.SIGUSR2)
    time.sleep(0.2)
    os.kill(tasks[1], signal.SIGUSR2)
    finish(proc)
    job = root / "table1" / "tiny" / ".submitit"
    (out,), (err,) = job.rglob("*_0_log.out"), job.rglob("*_0_log.err")  # rank 0's task
    out, err = " ".join(out.read_text().split()), " ".join(err.read_text().split())
    stopped = re.search(r"preempted: SIGUSR2 at epoch (\d+), step (\d+)", err)
    assert stopped and int(stopped[1]) >= 1 and int(stopped[2]) >= 1, err[-3000:]  # mid-epoch
    assert "Requeued job" in out and out.count("Starting with JobEnvironment") == 2, out[-3000:]
    done = summary(run_dir)
    assert done["status"] == "completed" and done["params_in_sync"], done
    same_rows(read_rows(straight), read_rows(run_dir))
    same_weights(straight, run_dir)


def job_processes(run_dir: Path) -> list[int]:
    """The processes of a local (ddp launcher) job: torchrun's agent and its workers, whose
    command lines end with ``hydra.run.dir=<run_dir>``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if f"hydra.run.dir={run_dir}".encode() in args:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("launcher", ["local", "submitit_local"])
def test_a_killed_job_fails_its_run_and_the_sweep_goes_on(tmp_path, launcher, submitit_sweep):
    # Issue 23 item 3: SIGKILL every process of the first job after its first epoch (an OOM
    # kill, a lost node). The run is recorded as failed (an interruption: a relaunch resumes it),
    # the sweep runs the next job, and ends with one line naming the run and exit status 1;
    # no traceback (submitit's UncompletedJobError) ends it.
    dirs = run_dirs(tmp_path)
    args = [f"runs_root={tmp_path}", "method=rank2,rank1", "hydra.sweeper.max_batch_size=1"]
    args += SUBMITIT if launcher == "submitit_local" else ["hydra.launcher.nproc_per_node=2"]
    proc = sweep(args)
    deadline = time.monotonic() + 300
    while not (dirs["rank2"] / "checkpoint.pt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.05)
    pids = (list(submitit_tasks(tmp_path, proc).values()) if launcher == "submitit_local"
            else job_processes(dirs["rank2"]))
    assert len(pids) >= 2
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-5000:]
    assert "Traceback" not in out and "UncompletedJobError" not in out, out[-5000:]
    status = summary(dirs["rank2"])["status"]
    assert status.startswith(runs.LOST_JOB), status
    ends = [line for line in out.splitlines() if line.startswith("sweep table1: ")]
    assert ends == [f"sweep table1: 1 of 2 runs finished, 1 failed: "
                    f"cifar10/resnet18/rank2/ours/seed0 ({status})"], out[-3000:]
    assert summary(dirs["rank1"])["status"] == "completed"
    if launcher == "submitit_local":  # the relaunch resumes the failed run and completes it
        out = finish(sweep(args))
        assert "2 runs: 1 complete, 1 to resume, 0 failed to rerun, 0 to start" in out
        done = summary(dirs["rank2"])
        assert done["status"] == "completed" and done["params_in_sync"], done
        assert [r["epoch"] for r in read_rows(dirs["rank2"])] == [0, 1, 2, 3, 4, 5]
        # ... and ends bit for bit where the same PowerSGD run that never stopped ends (issue 23:
        # it did not, before DDP's buckets were settled before the first step)
        straight = run_dirs(submitit_sweep[0])["rank2"]
        same_rows(read_rows(straight), read_rows(dirs["rank2"]))
        same_weights(straight, dirs["rank2"])
