"""``hydra/launcher: ddp``: run a sweep's jobs, each a multi-process DDP job, one after another or
``parallel`` at a time.

Hydra's basic launcher calls the task function inside the sweeping process, which cannot start
``torch.distributed`` ranks. This launcher starts each job as its own process tree instead:

    python -m torch.distributed.run --standalone --nproc-per-node <nproc_per_node> \
        run.py <the job's overrides> hydra.run.dir=<the job's directory>

so every job is exactly what a user gets from ``torchrun`` by hand (same code path, same run
record), on a fresh port, isolated from the other jobs: a job that fails or exits with status 2
does not stop the sweep, and its status comes back to the sweeper as a failed ``JobReturn``
(``exit status 2``, ``killed by SIGKILL``).
A job of one rank is ``python run.py <overrides>`` (a world-size-1 group, the same training
code), which spares torchrun's agent: about 4 s of start-up a job.

``parallel: N`` keeps N jobs running at once, each its own process tree, starting the next in
the sweep's order as one ends; their output interleaves on the console (each run's own log is
its directory's ``run.log``). Statuses come back in the sweep's order, as one after another.
It is meant for jobs of one process each (simulated learners: ``launcher=simulated``), N of
them on N cores.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules without registering them in
# sys.modules, where dataclasses would look the string annotations up.
import logging
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

LOG = logging.getLogger(__name__)
# Hydra overrides of the sweep that make no sense for a single run.
_SWEEP_ONLY = ("hydra.mode", "hydra.sweep", "hydra.sweeper", "hydra/sweeper", "hydra.run.dir")


@dataclass
class DDPLauncherConf:
    _target_: str = "hydra_plugins.accordion_bench.launcher.DDPLauncher"
    nproc_per_node: int = 1   # ranks per job (make WORKERS=...)
    parallel: int = 1         # jobs running at once (make PARALLEL=...)


ConfigStore.instance().store(group="hydra/launcher", name="ddp", node=DDPLauncherConf,
                             provider="accordion-bench")


class DDPLauncher(Launcher):
    """Each job: ``torchrun --standalone --nproc-per-node N <script> <overrides>``."""

    def __init__(self, nproc_per_node: int = 1, parallel: int = 1) -> None:
        self.nproc_per_node, self.parallel = int(nproc_per_node), int(parallel)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
               ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        hydra_overrides = [o for o in self.config.hydra.overrides.hydra
                           if not o.startswith(_SWEEP_ONLY)]
        jobs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            cfg, job_dir = job_config(self.hydra_context, self.config, overrides, idx)
            jobs.append((idx, overrides, cfg, job_dir))

        def run(job: tuple[int, Sequence[str], DictConfig, Path]) -> JobReturn:
            idx, overrides, cfg, job_dir = job
            LOG.info("#%d: %s -> %s", idx, " ".join(filter_overrides(overrides)), job_dir)
            code = self.run_job([*overrides, *hydra_overrides, f"hydra.run.dir={job_dir}"])
            return job_return(overrides, cfg, job_dir, exit_failure(code))

        if self.parallel <= 1:
            return [run(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:  # each thread waits on a job
            return list(pool.map(run, jobs))

    def run_job(self, overrides: list[str]) -> int:
        """Run one job to its end; its exit status."""
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={self.nproc_per_node}"]
        cmd = [*(torchrun if self.nproc_per_node > 1 else [sys.executable]), sys.argv[0],
               *overrides]
        return subprocess.run(cmd, check=False).returncode


def job_config(hydra_context: HydraContext, config: DictConfig, overrides: Sequence[str],
               idx: int) -> tuple[DictConfig, Path]:
    """The job's composed config (``hydra.job.num`` set) and its directory."""
    cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.num = idx
    return cfg, Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def exit_failure(code: int) -> str | None:
    """How a job's process ended, if not well (None for status 0)."""
    if code == 0:
        return None
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def job_return(overrides: Sequence[str], cfg: DictConfig, job_dir: Path, failure: str | None
               ) -> JobReturn:
    """The sweeper's record of a job: completed, or failed with ``failure`` (one line) as its
    error."""
    ret = JobReturn(overrides=list(overrides), cfg=cfg, hydra_cfg=cfg, working_dir=str(job_dir),
                    task_name=str(cfg.hydra.job.name))
    ret.status = JobStatus.COMPLETED if failure is None else JobStatus.FAILED
    value: Any = 0 if failure is None else RuntimeError(failure)
    ret.return_value = value
    return ret
