"""The submitit launchers' task start (hydra_plugins/accordion_bench/task.py) on a real submitit
job: a preemption warning that reaches a task while it starts is held for the run, not acted on
by submitit's handler (which would requeue rank 0 alone) or by the signal's default action; one
that comes after the run ended requeues nothing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import submitit

from hydra_plugins.accordion_bench import jobs, task


def _start_late(ready: str, go: str) -> list[int]:
    """A job's function: write its pid to ``ready`` (submitit's handlers are in place by now),
    wait for ``go``, then start as run.py does (:func:`jobs.signals.install`); the signal it
    then holds."""
    from jobs import signals

    Path(ready).write_text(str(os.getpid()))
    while not Path(go).exists():
        time.sleep(0.05)
    signals.install()
    held = signals.requested()
    signals.undefer()
    return [held]


def signalled_job(tmp_path: Path, function: Callable[[str, str], Any], signum: int
                  ) -> submitit.Job:
    """A local submitit job of ``function(ready, go)`` through the suite's task, sent ``signum``
    once it wrote its pid to ``ready``; ``go`` lets it on half a second later (time for a
    handler to act)."""
    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="local",
                                     local_python=jobs.TASK)
    executor.update_parameters(timeout_min=5, tasks_per_node=1)
    ready, go = tmp_path / "ready", tmp_path / "go"
    job = executor.submit(function, str(ready), str(go))
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert not job.done() and time.monotonic() < deadline, job.stderr()
        time.sleep(0.05)
    time.sleep(0.1)  # the pid written
    os.kill(int(ready.read_text()), signum)
    time.sleep(0.5)
    go.touch()
    return job


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGUSR1])
def test_a_signal_while_the_task_starts_is_held_for_the_run(tmp_path, signum):
    job = signalled_job(tmp_path, _start_late, signum)
    assert job.result() == [signum], job.stderr()
    assert "Requeued" not in (job.stdout() or "")


def _end_then_wait(ready: str, go: str) -> str:
    """A job's function: a run that ends by itself (run.py's install, defer, undefer), then
    writes its pid to ``ready`` and waits for ``go`` (a late warning comes meanwhile)."""
    from jobs import signals

    signals.install()
    signals.defer(["SIGUSR1"])
    signals.undefer(ended=True)
    Path(ready).write_text(str(os.getpid()))
    while not Path(go).exists():
        time.sleep(0.05)
    return "done"


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT])
def test_a_late_signal_after_the_run_ended_runs_no_handler(tmp_path, signum):
    # Slurm checks time limits every 30 s or so: the warning for a short attempt can come after
    # the run completed. Submitit's handler would requeue the finished job (a real Slurm test saw
    # it kill a task as the interpreter exited instead: "User defined signal 2"). Its handlers
    # for SIGTERM and SIGCONT log from inside the signal handler ("Bypassing signal"), which
    # prints a logging-error traceback if it lands while the task writes its log; SIGTERM is
    # not among this run's preemption signals (trainer.preempt_signals may leave it out).
    job = signalled_job(tmp_path, _end_then_wait, signum)
    assert job.result() == "done", job.stderr()
    logs = (job.stdout() or "") + (job.stderr() or "")
    assert "Caught signal" not in logs and "Bypassing" not in logs, logs


def test_the_task_refuses_a_command_it_does_not_know(tmp_path):
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pytest.raises(SystemExit, match="usage: python -u -m hydra_plugins.accordion_bench"):
        task.main(["task.py", "-u", "-m", "http.server", str(tmp_path)])
    # Refused before blocking anything: a mask left here would hold the signals of every
    # process this one starts later (tests/ranks/test_preemption.py saw no SIGUSR1).
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask

