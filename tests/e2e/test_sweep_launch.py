"""Sweeps launched for real: local 2-rank DDP jobs through the ddp launcher (interrupted,
relaunched: skip, resume, rerun), the Slurm code path through submitit's local executor, a job
killed in a sweep under both (tests/e2e/test_slurm.py: the same against a real Slurm), and the
fast tiny path (2 simulated learners per run, two runs at a time) against 2-rank jobs.

One straight sweep of 2-rank torchrun jobs (:func:`ranks_sweep`) is what every interrupted,
killed, requeued or fast-path run must end at, bit for bit: metrics, weights, and (fast path)
the whole checkpoint. The tests share it in this one module (``--dist loadfile`` keeps a
module on one pytest worker), since each 2-rank job costs its processes' start-up."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs import runs
from tests.conftest import ROOT, read_rows, same_rows

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


RANKS = ["hydra.launcher.nproc_per_node=2"]
# A checkpoint's entries that hold no result: its config (trainer.workers tells the launchers
# apart) and the seconds the run took.
NOT_RESULTS = ("config", "elapsed_s")


@pytest.fixture(scope="module")
def ranks_sweep(tmp_path_factory) -> Path:
    """The small tiny Table 1 sweep as 2-rank torchrun jobs, one after another, never stopped:
    its runs root."""
    root = tmp_path_factory.mktemp("ranks")
    finish(sweep([f"runs_root={root}", *RANKS]))
    return root


def same_tensors(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` (nested containers of tensors and plain values) are bit for bit equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same_tensors(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_run(a: Path, b: Path) -> None:
    """Every epoch's metrics but the timings, and the final checkpoint but its config and
    seconds (weights, optimizer, scheduler, every worker's RNG streams and memories)."""
    same_rows(read_rows(a), read_rows(b))
    ca, cb = (torch.load(p / "checkpoint.pt", weights_only=True) for p in (a, b))
    for key in NOT_RESULTS:
        ca.pop(key), cb.pop(key)
    same_tensors(ca, cb)


def test_relaunch_skips_resumes_and_reruns(tmp_path, ranks_sweep):
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
    # each run ends where the straight sweep's ends: rerun, resumed mid-epoch, started
    for method in METHODS:
        same_run(dirs[method], run_dirs(ranks_sweep)[method])
    # 4. Everything is complete: a relaunch starts no run.
    stamps = {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}
    out = finish(sweep(args))
    assert "3 runs: 3 complete, 0 to resume, 0 failed to rerun, 0 to start" in out
    assert stamps == {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}


def test_a_run_directory_of_another_config_stops_the_sweep(ranks_sweep):
    dirs = run_dirs(ranks_sweep)
    stamps = {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}
    proc = sweep([f"runs_root={ranks_sweep}", *RANKS, "method=rank2", "trainer.epochs=2"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-3000:]
    error = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "holds a run of another config (trainer.epochs: 4 there, 2 now)" \
        in error[0] and "Traceback" not in out
    assert stamps == {m: (d / "summary.json").stat().st_mtime_ns for m, d in dirs.items()}


# The Slurm launcher's code path: each job is 2 tasks that find their rank through submitit.
SUBMITIT = ["launcher=submitit_local"]


def two_rank_runs_completed(root: Path, methods: tuple[str, ...], epochs: int) -> None:
    """The sweep's runs of these methods completed on 2 ranks in sync, every epoch recorded."""
    for method in methods:
        path = run_dirs(root)[method]
        assert summary(path)["status"] == "completed" and summary(path)["params_in_sync"]
        assert torch.load(path / "checkpoint.pt", weights_only=True)["world_size"] == 2
        assert len(read_rows(path)) == epochs


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


def test_submitit_requeues_a_preempted_job_that_resumes_bit_exactly(tmp_path, ranks_sweep):
    # Slurm's warning before the time limit reaches the tasks of a submitit job (submitit's own
    # signal, SIGUSR2, as --signal=USR2@<s> sends it; a little apart on each task): the ranks
    # stop at one step boundary, rank 0 takes submitit's requeue (the local executor restarts
    # the tasks, as Slurm requeues the job), and the requeued job resumes mid-epoch
    # (resume=auto) to end as a job that never stopped (the same run as a torchrun job).
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
    same_run(run_dir, run_dirs(ranks_sweep)["rank2"])


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
def test_a_killed_job_fails_its_run_and_the_sweep_goes_on(tmp_path, launcher, ranks_sweep):
    # Issue 23 item 3: SIGKILL every process of the first job after its first epoch (an OOM
    # kill, a lost node). The run is recorded as failed (an interruption: a relaunch resumes it),
    # the sweep runs the next job, and ends with one line naming the run and exit status 1;
    # no traceback (submitit's UncompletedJobError) ends it. Under submitit the second job is
    # Accordion's (levels switching inside a submitit job), and the relaunch completes the
    # killed run.
    dirs = run_dirs(tmp_path)
    second = "accordion_rank2_rank1" if launcher == "submitit_local" else "rank1"
    args = [f"runs_root={tmp_path}", f"method=rank2,{second}", "hydra.sweeper.max_batch_size=1"]
    args += SUBMITIT if launcher == "submitit_local" else RANKS
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
    two_rank_runs_completed(tmp_path, (second,), 4)
    if launcher == "submitit_local":
        assert "2 runs: 0 complete, 0 to resume, 0 failed to rerun, 2 to start" in out
        logs = list((tmp_path / "table1" / "tiny" / ".submitit").rglob("*_log.out"))
        assert len(logs) == 4  # 2 jobs x 2 tasks
        # the relaunch resumes the failed run and completes it ...
        out = finish(sweep(args))
        assert "2 runs: 1 complete, 1 to resume, 0 failed to rerun, 0 to start" in out
        two_rank_runs_completed(tmp_path, ("rank2",), 4)
        # ... bit for bit where the same PowerSGD run that never stopped ends (issue 23: it did
        # not, before DDP's buckets were settled before the first step); and Accordion's
        # submitit job ends where its torchrun job does
        for method in ("rank2", second):
            same_run(dirs[method], run_dirs(ranks_sweep)[method])


# ---- the fast tiny path ----------------------------------------------------------------------
# A sweep's 2-worker runs as 2 simulated learners in one process each, two runs at a time, against
# the same sweep as 2-rank torchrun jobs one after another: the same records and checkpoints bit
# for bit, relaunches across the two ways, a failed job and a preemption.
FAST = ["launcher=simulated", "trainer.workers=2", "hydra.launcher.parallel=2"]


def log_span(run_dir: Path) -> tuple[datetime, datetime]:
    """When the run's log began and ended."""
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]",
                        (run_dir / "run.log").read_text(), re.MULTILINE)
    first, last = (datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in (stamps[0], stamps[-1]))
    return first, last


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (torchrun starts its ranks in sessions of
    their own) at once, as the OOM killer or a lost node would: nothing of the job can write
    how it ended."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():  # /proc/self, /proc/meminfo, ...
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # not a process, or gone
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def test_parallel_learners_sweep_records_what_the_torchrun_sweep_records(tmp_path, ranks_sweep):
    out = finish(sweep([f"runs_root={tmp_path}", *FAST]))
    assert "3 runs: 0 complete, 0 to resume, 0 failed to rerun, 3 to start" in out
    fast, slow = run_dirs(tmp_path), run_dirs(ranks_sweep)
    for method in METHODS:
        done = summary(fast[method])
        assert done["status"] == "completed" and done["provenance"]["launcher"] == "simulated"
        assert done["provenance"]["world_size"] == 2
        same_run(fast[method], slow[method])
    # two at a time: the second run started before the first ended
    assert log_span(fast[METHODS[1]])[0] < log_span(fast[METHODS[0]])[1]
    # The torchrun sweep's runs are complete for the fast path too: nothing starts.
    stamps = {m: (d / "summary.json").stat().st_mtime_ns for m, d in run_dirs(ranks_sweep).items()}
    out = finish(sweep([f"runs_root={ranks_sweep}", *FAST]))
    assert "3 runs: 3 complete, 0 to resume, 0 failed to rerun, 0 to start" in out
    assert stamps == {m: (d / "summary.json").stat().st_mtime_ns
                      for m, d in run_dirs(ranks_sweep).items()}


def test_the_fast_path_resumes_a_killed_torchrun_run_and_a_failed_job_fails_alone(
        tmp_path, ranks_sweep):
    dirs = run_dirs(tmp_path)
    # 1. Kill the torchrun sweep (SIGKILL: no summary, the last epoch-end checkpoint stays)
    #    once its first run has two epochs.
    first = sweep([f"runs_root={tmp_path}", *RANKS, "method=rank2"])
    deadline = time.monotonic() + 600
    while not (dirs["rank2"] / "metrics.jsonl").exists() or len(read_rows(dirs["rank2"])) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()[-5000:]
        time.sleep(0.05)
    kill_tree(first.pid)
    first.communicate(timeout=120)
    assert not (dirs["rank2"] / "summary.json").exists()
    # 2. A run whose checkpoint is corrupt: its job refuses it (exit status 2), the others go on.
    dirs["rank1"].mkdir(parents=True)
    (dirs["rank1"] / "checkpoint.pt").write_bytes(b"not a checkpoint")
    # 3. Relaunch the fast way: resume the killed run, fail the corrupt one, start the third.
    proc = sweep([f"runs_root={tmp_path}", *FAST])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-5000:]
    assert "3 runs: 0 complete, 2 to resume, 0 failed to rerun, 1 to start" in out
    assert "2 of 3 runs finished, 1 failed" in out and "resnet18/rank1/ours/seed0" in out
    assert "resume: " in out and "is not a readable checkpoint" in out
    for method in ("rank2", "accordion_rank2_rank1"):
        assert summary(dirs[method])["status"] == "completed"
        same_run(dirs[method], run_dirs(ranks_sweep)[method])
    launchers = [s["launcher"] for s in summary(dirs["rank2"])["starts"]]
    assert launchers == ["torchrun", "simulated"]


def test_parallel_preempted_runs_resume_to_the_straight_records(tmp_path, ranks_sweep):
    # SIGTERM to the sweep's process group (as a session's end or a scheduler sends it) while
    # two runs train side by side: each stops at a step boundary with a mid-epoch checkpoint;
    # the relaunch resumes them to the records of runs that never stopped.
    dirs = run_dirs(tmp_path)
    both = ["method=rank2,rank1"]
    proc = sweep([f"runs_root={tmp_path}", *FAST, *both], start_new_session=True)
    deadline = time.monotonic() + 600
    while not all((dirs[m] / "checkpoint.pt").exists() for m in ("rank2", "rank1")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    statuses = [summary(dirs[m])["status"] for m in ("rank2", "rank1")]
    assert any(s.startswith("preempted: SIGTERM at epoch ") for s in statuses), statuses
    finish(sweep([f"runs_root={tmp_path}", *FAST, *both]))
    for method in ("rank2", "rank1"):
        assert summary(dirs[method])["status"] == "completed"
        same_run(dirs[method], run_dirs(ranks_sweep)[method])
