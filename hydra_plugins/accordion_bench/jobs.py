"""``hydra/launcher: accordion_slurm`` and ``accordion_submitit_local`` (``launcher=slurm``,
``slurm_local``, ``submitit_local``): hydra-submitit-launcher's launchers, each job's end its own.

hydra-submitit-launcher collects the jobs' results with ``job.results()``: a job that ended
without one (killed, out of memory, out of requeues, its node lost: its task never wrote
submitit's result file) raises ``UncompletedJobError`` in the sweeping process and ends the whole
sweep with a traceback; and where Slurm keeps no accounting, ``sacct`` never says such a job
ended, so the sweep waits for ever. These launchers submit the same jobs (the same parameters,
one job array, requeued on preemption and at the time limit), but

- every task starts through :mod:`hydra_plugins.accordion_bench.task`, so that a preemption
  warning during start-up is held for the run instead of killing the task;
- a Slurm job is waited for until it leaves Slurm's queue (``squeue``: no accounting needed; a
  requeued job is still in it), a local job until its processes end;
- a job without a result comes back to the sweeper as a failed run, with one line saying how it
  ended (Slurm's last state, the run's last ``error:`` line), like a job whose run failed; the
  sweep goes on with the others (hydra_plugins/accordion_bench/sweeper.py).
"""

# No `from __future__ import annotations`: Hydra loads plugin modules without registering them in
# sys.modules, where dataclasses would look the string annotations up.
import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import (
    BaseQueueConf,
    LocalQueueConf,
    SlurmQueueConf,
)
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

from hydra_plugins.accordion_bench.launcher import job_config, job_return

LOG = logging.getLogger(__name__)
# What each task runs in place of `python` (submitit appends `-u -m submitit.core._submit <dir>`).
TASK = f"{shlex.quote(sys.executable)} -u -m hydra_plugins.accordion_bench.task"
POLL_S = 5.0      # between two looks at Slurm's queue (one squeue for all the jobs)
RESULT_S = 15.0   # a completed job's result file may reach this machine late (shared disks)
# Slurm job states after which the job will not run again (squeue --states=all).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


@dataclass
class SlurmJobsConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.accordion_bench.jobs.SlurmJobsLauncher"


@dataclass
class LocalJobsConf(LocalQueueConf):
    _target_: str = "hydra_plugins.accordion_bench.jobs.LocalJobsLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="accordion_slurm",
                             node=SlurmJobsConf(), provider="accordion-bench")
ConfigStore.instance().store(group="hydra/launcher", name="accordion_submitit_local",
                             node=LocalJobsConf(), provider="accordion-bench")


class _JobsLauncher(BaseSubmititLauncher):
    """Submit every job, wait for all of them, collect each one's own end."""

    result_s = 0.0  # how long to wait for a completed job's result file

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
               ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        indices = range(initial_job_idx, initial_job_idx + len(job_overrides))
        for idx, overrides in zip(indices, job_overrides, strict=True):
            LOG.info("#%d: %s", idx, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        jobs = self.executor().map_array(
            self, [list(o) for o in job_overrides], ["hydra.sweep.dir"] * len(job_overrides),
            list(indices), [f"job_id_for_{idx}" for idx in indices], [state] * len(indices))
        ends = self.wait(jobs)
        return [self.collect(job, end, overrides, idx)
                for job, end, overrides, idx in zip(jobs, ends, job_overrides, indices,
                                                    strict=True)]

    def executor(self) -> Any:
        """submitit's executor for the launcher's parameters, its tasks started by :data:`TASK`."""
        import submitit

        prefix = f"{self._EXECUTOR}_"
        init = {f"{prefix}python": TASK}
        if "max_num_timeout" in self.params:
            init[f"{prefix}max_num_timeout"] = self.params["max_num_timeout"]
        executor = submitit.AutoExecutor(folder=self.params["submitit_folder"],
                                         cluster=self._EXECUTOR, **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{
            key if key in shared else prefix + key: value for key, value in self.params.items()
            if key not in ("submitit_folder", "max_num_timeout")})
        return executor

    def wait(self, jobs: Sequence[Any]) -> list[str]:
        """Block until every job has ended; how each one ended, in words."""
        raise NotImplementedError

    def collect(self, job: Any, end: str, overrides: Sequence[str], idx: int) -> JobReturn:
        """The job's run as the sweeper sees it: the result its task 0 wrote, or a failed run
        with one line saying how the job ended."""
        from submitit.core.utils import pickle_load

        assert self.config is not None and self.hydra_context is not None
        cfg, job_dir = job_config(self.hydra_context, self.config, overrides, idx)
        path = job.task(0).paths.result_pickle
        deadline = time.monotonic() + self.result_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(1.0)
        if path.exists():
            outcome, value = pickle_load(path)
            if outcome == "success":  # Hydra's JobReturn: completed, or the run's exception
                value.working_dir = str(job_dir)  # (Hydra's is the task's working directory)
                return value
            failure = f"submitit: {value.strip().splitlines()[-1]}"
        else:
            failure = f"no result from {end}"
        said = last_error(job)
        if said:
            failure += f"; the run said {said!r}"
        return job_return(overrides, cfg, job_dir, failure)


class SlurmJobsLauncher(_JobsLauncher):
    """hydra-submitit-launcher's Slurm launcher, each job's end its own (see the module doc)."""

    _EXECUTOR = "slurm"
    result_s = RESULT_S

    def wait(self, jobs: Sequence[Any]) -> list[str]:
        ids = [job.job_id for job in jobs]
        return [f"Slurm job {job_id}: {state}" for job_id, state in
                zip(ids, wait_slurm(ids), strict=True)]


class LocalJobsLauncher(_JobsLauncher):
    """hydra-submitit-launcher's local launcher, each job's end its own (see the module doc)."""

    _EXECUTOR = "local"

    def wait(self, jobs: Sequence[Any]) -> list[str]:
        while not all(job.done() for job in jobs):
            time.sleep(1.0)
        return [f"local job {job.job_id}: its processes ended" for job in jobs]


def wait_slurm(job_ids: Sequence[str], poll_s: float = POLL_S) -> list[str]:
    """Wait until Slurm will not run these jobs again; each one's last state seen (``squeue``
    lists a job for ``MinJobAge`` after it ends; one no longer listed has ended long ago)."""
    last = dict.fromkeys(job_ids, "no longer in Slurm's queue")
    waiting = set(job_ids)
    while waiting:
        listed = squeue(sorted(waiting))
        if listed is not None:
            for job_id in sorted(waiting):
                state = listed.get(job_id)
                if state is not None:
                    last[job_id] = state
                if state is None or state in ENDED:
                    waiting.discard(job_id)
        if waiting:
            time.sleep(poll_s)
    return [last[job_id] for job_id in job_ids]


def squeue(job_ids: Sequence[str]) -> dict[str, str] | None:
    """The state of each of these jobs that Slurm's controller holds (array tasks one by one);
    None if ``squeue`` cannot answer now (the controller restarting, say)."""
    done = subprocess.run(["squeue", "--noheader", "--array", "--states=all",
                           f"--jobs={','.join(job_ids)}", "--format=%i|%T"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        LOG.warning("squeue failed (%s); asking again in %g s", done.stderr.strip(), POLL_S)
        return None
    return dict(line.split("|", 1) for line in done.stdout.split() if "|" in line)


def last_error(job: Any) -> str | None:
    """The last ``error: ...`` line that any task of the job wrote to its stderr (run.py's
    one-line failures), if any."""
    found = None
    for task_id in range(job.num_tasks):
        path = job.task(task_id).paths.stderr
        if path.exists():
            lines = [line for line in path.read_text(errors="replace").splitlines()
                     if line.startswith("error: ")]
            found = lines[-1][len("error: "):] if lines else found
    return found
