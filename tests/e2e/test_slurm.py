"""Sweeps on a real Slurm (make slurm-up: one node, slurmctld, slurmd, slurmdbd): launcher=
slurm_local submits each run as one Slurm job of 2 tasks through sbatch, and Slurm itself
signals, requeues and cancels. `make test-slurm` (skipped otherwise, with one line).

Slurm holds a requeued job for about 2 minutes (``Reason=BeginTime``, its own delay); the tests
release such a job at once (``scontrol update JobId=<id> StartTime=now``, :func:`released`),
which changes when it starts again, not how."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from analysis.wandb_runs import read_wandb_file, wandb_files
from jobs import runs
from tests.e2e.test_sweep_launch import (
    finish,
    run_dirs,
    same_run,
    summary,
    sweep,
    two_rank_runs_completed,
)


def slurm_problem() -> str | None:
    """Why no Slurm can take the tests' jobs here (None: one answers, with accounting)."""
    for cmd in (["sinfo", "-h", "-o", "%t"], ["sacct", "-n", "-X", "-o", "JobID"]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            return f"{cmd[0]}: {exc}"
        if done.returncode != 0:
            return f"{cmd[0]}: {done.stderr.strip()}"
    return None


PROBLEM = slurm_problem()
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None,
                                 reason=f"no Slurm answers (make slurm-up): {PROBLEM}")]

# Runs of 2 tasks: 2 epochs of 32 steps (1024 examples, global batch 32) each.
SLURM = ["launcher=slurm_local", "dataset.train_size=1024", "trainer.epochs=2"]
STEPS = 32


def slurm(*args: str) -> str:
    """Run a Slurm command; its output."""
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
    text = slurm("scontrol", "show", "job", "-o", job_id)
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def job_ids(root: Path) -> list[str]:
    """The Slurm job ids of the sweep's runs: submitit's folders with task logs (``<id>`` for a
    single job, ``<array>_<index>`` for the jobs of an array)."""
    folders = (root / "table1" / "tiny" / ".submitit").glob("*")
    return sorted(p.name for p in folders if any(p.glob("*_log.out")))


def task_log(root: Path, job_id: str, what: str = "err", task: int = 0) -> str:
    """A task's log, whitespace collapsed."""
    path = root / "table1" / "tiny" / ".submitit" / job_id / f"{job_id}_{task}_log.{what}"
    return " ".join(path.read_text().split()) if path.exists() else ""


def running_job(root: Path, proc: subprocess.Popen[str], deadline_s: float = 300) -> str:
    """The id of the sweep's job that Slurm runs now (one at a time on the 2-CPU node)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        running = slurm("squeue", "-h", "--array", "-t", "RUNNING", "-o", "%i").split()
        if running and running[0] in job_ids(root):
            return running[0]
        assert proc.poll() is None, proc.stdout.read()[-5000:]
        time.sleep(0.2)
    raise AssertionError("no job of the sweep runs")


def wait_for(path: Path, proc: subprocess.Popen[str], deadline_s: float = 300) -> None:
    """Until ``path`` exists (the sweep still running)."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.1)


def started_job(root: Path, proc: subprocess.Popen[str]) -> str:
    """The id of the sweep's running job once both its tasks have started (submitit's line in
    each task's log: from then on they hold a signal instead of dying of it)."""
    job_id = running_job(root, proc)
    deadline = time.monotonic() + 120
    while not all("Starting with JobEnvironment" in task_log(root, job_id, "out", task)
                  for task in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-5000:]
        time.sleep(0.02)
    return job_id


@contextlib.contextmanager
def released(time_limit_min: int | None = None) -> Iterator[None]:
    """While the block runs, start every job that Slurm holds after a requeue, 3 s on (not at
    once: a requeued job started before the node has let go of the attempt before is killed,
    "Killing non-startable batch JobId=...: Job credential revoked", and ends FAILED), with its
    time limit set to ``time_limit_min`` minutes where given."""
    limit = [] if time_limit_min is None else [f"TimeLimit={time_limit_min}"]
    stop = threading.Event()

    def release() -> None:
        while not stop.wait(0.5):
            held = slurm("squeue", "-h", "--array", "-t", "PENDING", "-o", "%i|%r|%S").split()
            for job_id, reason, begin in (line.split("|") for line in held):
                if reason != "BeginTime" or not begin[:1].isdigit():
                    continue
                if datetime.fromisoformat(begin) - datetime.now() > timedelta(seconds=4):
                    # Slurm's hold after a requeue, not ours (that one is 3 s on already)
                    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+3",
                                    *limit], capture_output=True, check=False)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def same_as_straight(straight: Path, run_dir: Path) -> None:
    """The run completed in sync and ended bit for bit as the run that never stopped: every
    epoch's metrics and the whole final checkpoint (test_sweep_launch's ``same_run``)."""
    done = summary(run_dir)
    assert done["status"] == "completed" and done["params_in_sync"], done
    same_run(straight, run_dir)


def wandb_run(run_dir: Path) -> dict[str, str]:
    """The group and job type of the run's offline W&B run."""
    (path,) = wandb_files(run_dir)
    record = next(r.run for r in read_wandb_file(path) if r.WhichOneof("record_type") == "run")
    return {"group": record.run_group, "job_type": record.job_type}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, str]:
    """A 2-run sweep of 2-task Slurm jobs that nothing stops (its runs root, output)."""
    root = tmp_path_factory.mktemp("straight")
    proc = sweep([f"runs_root={root}", *SLURM, "method=rank2,rank1", "logger=wandb",
                  "logger.mode=offline"])
    return root, finish(proc)


def test_a_sweep_of_two_rank_slurm_jobs_completes(straight):
    root, out = straight
    assert "2 runs: 0 complete, 0 to resume, 0 failed to rerun, 2 to start" in out
    assert "sweep table1: 2 of 2 runs finished" in out
    two_rank_runs_completed(root, ("rank2", "rank1"), 2)
    for method in ("rank2", "rank1"):  # W&B grouped as local sweeps are
        assert wandb_run(run_dirs(root)[method]) == {"group": "table1", "job_type": method}
    ids = job_ids(root)
    assert len(ids) == 2 and ids[0].split("_")[0] == ids[1].split("_")[0]  # one job array
    states = slurm("sacct", "-n", "-X", "-P", "-o", "JobID,State,NNodes,NTasks", "-j",
                   ids[0].split("_")[0]).split()
    assert sorted(states) == [f"{i}|COMPLETED|1|" for i in ids], states
    for job_id in ids:  # 2 tasks each, found by submitit's Slurm environment
        for task in (0, 1):
            assert f"global_rank={task}(2)" in task_log(root, job_id, "out", task)


def test_a_time_limit_requeues_the_job_which_resumes_bit_exactly(tmp_path):
    # A 4-minute limit and submitit's signal 170 s before it: Slurm sends it at its check of time
    # limits (every 30 s) once it is due within 30 s, 40 to 70 s into an attempt (never in a
    # task's first instants, which would kill it: the sweep refuses a delay that could,
    # test_config.py). An idle machine can finish the whole run before that (a quiet run here
    # took 56 s, and no signal came), so once the first attempt's tasks have started (they hold
    # a signal from then on) its limit is cut to 3 minutes, which makes the signal due at once:
    # Slurm sends it at its next check, within 30 s, while the run still has more than an epoch
    # to go. Each requeued attempt gets its 4 minutes back before it starts. The ranks check for
    # the signal every 96 steps (of 128 an epoch), so they stop at step 96 of an epoch,
    # checkpoint, rank 0 requeues the job through submitit, and the requeued job resumes there
    # (on a loaded machine a later attempt may be stopped the same way). The run that never
    # stopped: the same job without the limit.
    args = [*SLURM, "dataset.train_size=4096", "trainer.epochs=3", "method=rank2"]
    straight = tmp_path / "straight"
    finish(sweep([f"runs_root={straight}", *args]), timeout=900)
    limit_min = 4
    proc = sweep([f"runs_root={tmp_path}", *args, "trainer.preempt_check_every=96",
                  f"hydra.launcher.timeout_min={limit_min}", "hydra.launcher.signal_delay_s=170"])
    with released(time_limit_min=limit_min):
        slurm("scontrol", "update", f"JobId={started_job(tmp_path, proc)}",
              f"TimeLimit={limit_min - 1}")
        finish(proc, timeout=1800)
    (job_id,) = job_ids(tmp_path)
    restarts = int(job_info(job_id)["Restarts"])
    err, out = task_log(tmp_path, job_id), task_log(tmp_path, job_id, "out")
    # run.py's line for each stop (a traceback that quotes the exception is not one)
    stops = re.findall(r"preempted: SIGUSR2 at epoch (\d+), step (\d+); the run resumes", err)
    assert restarts >= 1 and len(stops) == restarts, (restarts, err[-3000:])
    assert "Logging error" not in err + out, err[-3000:]  # a handler's log line amid a write
    assert {step for _, step in stops} == {"96"}, stops  # mid-epoch, at a check
    assert len(re.findall(r"submitit WARNING \([^)]*\) - Caught signal SIGUSR2 on \S+: this job "
                          r"is timed-out", out)) == restarts
    assert out.count("Starting with JobEnvironment") == restarts + 1
    assert "User defined signal" not in err + out
    same_as_straight(run_dirs(straight)["rank2"], run_dirs(tmp_path)["rank2"])


def test_a_signal_while_the_job_starts_is_held_and_requeues_it(tmp_path, straight):
    # Slurm's warning reaches the tasks as soon as submitit starts in both, before it has loaded
    # the job (which imports torch): not fatal, not a requeue of rank 0 alone. The ranks stop
    # together at their first check (after step 1), rank 0 requeues the job. (Both: on a loaded
    # machine task 1 may start seconds after task 0, and a signal before its interpreter runs
    # kills it, which no process can hold: a .ci/run trial here did, signalled on task 0's line.)
    proc = sweep([f"runs_root={tmp_path}", *SLURM, "method=rank2"])
    job_id = started_job(tmp_path, proc)
    slurm("scancel", "--signal=USR2", job_id)
    with released():
        finish(proc, timeout=600)
    assert int(job_info(job_id)["Restarts"]) == 1
    err, out = task_log(tmp_path, job_id), task_log(tmp_path, job_id, "out")
    assert "preempted: SIGUSR2 at epoch 0, step 1;" in err, err[-3000:]
    assert out.count("Starting with JobEnvironment") == 2 and "User defined signal" not in err
    same_as_straight(run_dirs(straight[0])["rank2"], run_dirs(tmp_path)["rank2"])


@pytest.mark.parametrize(("command", "stopped_by"), [
    (["scontrol", "requeue"], "SIGTERM"),          # an administrator's (or a preemption's) requeue
    (["scancel", "--signal=USR1"], "SIGUSR1"),     # a warning signal, as --signal=USR1@<s>
])
def test_a_requeued_or_warned_job_checkpoints_and_resumes_bit_exactly(tmp_path, straight,
                                                                      command, stopped_by):
    proc = sweep([f"runs_root={tmp_path}", *SLURM, "method=rank2"])
    run_dir = run_dirs(tmp_path)["rank2"]
    job_id = running_job(tmp_path, proc)
    wait_for(run_dir / "checkpoint.pt", proc)
    slurm(*command, job_id)
    with released():
        finish(proc, timeout=600)
    assert int(job_info(job_id)["Restarts"]) == 1
    err = task_log(tmp_path, job_id)
    stop = re.search(rf"preempted: {stopped_by} at epoch (\d+), step (\d+)", err)
    assert stop and int(stop[1]) == 1, err[-3000:]  # at a step boundary, after the checkpoint
    same_as_straight(run_dirs(straight[0])["rank2"], run_dir)


def test_a_cancelled_job_fails_its_run_the_sweep_goes_on_and_a_relaunch_finishes_it(tmp_path,
                                                                                   straight):
    # scancel: SIGTERM to the tasks; they stop at a step boundary with a checkpoint (the run is
    # resumable); Slurm does not requeue. The sweep runs its other job, ends with one line
    # naming the run and exit status 1. A relaunch resumes it (and only it), and then, with
    # every run complete, submits nothing. (A failed run's rerun is the sweeper's, whatever the
    # launcher: tests/e2e/test_sweep_launch.py.)
    args = [f"runs_root={tmp_path}", *SLURM, "method=rank2,rank1"]
    dirs = run_dirs(tmp_path)
    proc = sweep(args)
    job_id = running_job(tmp_path, proc)
    wait_for(dirs["rank2"] / "checkpoint.pt", proc)
    slurm("scancel", job_id)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-5000:]
    status = summary(dirs["rank2"])["status"]
    assert re.fullmatch(r"preempted: SIGTERM at epoch 1, step \d+", status), status
    assert [line for line in out.splitlines() if line.startswith("sweep table1: ")] == [
        f"sweep table1: 1 of 2 runs finished, 1 failed: cifar10/resnet18/rank2/ours/seed0 "
        f"({status})"], out[-3000:]
    assert job_info(job_id)["JobState"] == "CANCELLED" and "Traceback" not in out
    assert summary(dirs["rank1"])["status"] == "completed"
    submitted = job_ids(tmp_path)
    out = finish(sweep(args))
    assert "2 runs: 1 complete, 1 to resume, 0 failed to rerun, 0 to start" in out
    assert len(job_ids(tmp_path)) == len(submitted) + 1  # rank2's job alone
    for method in ("rank2", "rank1"):
        same_as_straight(run_dirs(straight[0])[method], dirs[method])
    submitted = job_ids(tmp_path)
    out = finish(sweep(args))
    assert "2 runs: 2 complete, 0 to resume, 0 failed to rerun, 0 to start" in out
    assert job_ids(tmp_path) == submitted  # nothing submitted


@pytest.mark.parametrize("accounting", [True, False])
def test_a_job_killed_without_a_result_never_hangs_the_sweep(tmp_path, accounting):
    # SIGKILL to both tasks (as the OOM killer would): no result, no summary. With or
    # without accounting (a `sacct` first in PATH that fails as Slurm's own does when there is
    # none), the sweep sees the job end, records the run and exits with status 1.
    env = dict(os.environ)
    if not accounting:
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "sacct").write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2"
                                    "\nexit 1\n")
        (fake / "sacct").chmod(0o755)
        env["PATH"] = f"{fake}:{env['PATH']}"
    run_dir = run_dirs(tmp_path)["rank2"]
    proc = sweep([f"runs_root={tmp_path}", *SLURM, "method=rank2"], env=env)
    job_id = running_job(tmp_path, proc)
    wait_for(run_dir / "checkpoint.pt", proc)
    tasks = slurm("scontrol", "listpids", f"{job_id}.0").splitlines()[1:]  # the job step's
    assert len(tasks) == 2, tasks
    for line in tasks:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-5000:]
    status = summary(run_dir)["status"]
    state = job_info(job_id)["JobState"]
    assert status.startswith(f"{runs.LOST_JOB} (no result from Slurm job {job_id}: {state}"), \
        status
    assert f"1 failed: cifar10/resnet18/rank2/ours/seed0 ({status})" in out
    assert "Bypassing sacct error" not in out and "Traceback" not in out
    if not accounting:
        assert subprocess.run(["sacct"], env=env, capture_output=True).returncode == 1
