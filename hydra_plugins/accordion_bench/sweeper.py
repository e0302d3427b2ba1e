"""``hydra/sweeper: runs``: a sweep as the union of run groups, planned before it launches.

Hydra's basic sweeper runs one cross product; a paper table is several (each model has its own
methods). This sweeper expands ``groups`` x ``params`` (:func:`jobs.sweeps.expand`), composes
every run, prints the plan (runs complete / to resume / to rerun / to start, and the compute),
checks that the data is there and that no run's directory holds another config (one line and
exit status 2 if not), and hands the runs that are not complete to the launcher: a relaunch
starts nothing that has finished. Failed runs do not stop the others; the sweep ends with one
line naming each failed run and how it ended (recorded in its directory if its job could not:
killed, out of memory) and exit status 1.

    python run.py -m sweep=table1 scale=tiny                  # every run of the table
    python run.py -m sweep=table1 model=resnet18 seed=0       # part of it
    python run.py -m sweep=table1 hydra.sweeper.dry_run=true  # the plan only
    python run.py -m sweep=table1 hydra.sweeper.dry_run=true hydra.sweeper.show=diff
                                     # ... and each run's config against the defaults (or: config)
"""

# No `from __future__ import annotations`: Hydra loads plugin modules without registering them in
# sys.modules, where dataclasses would look the string annotations up.
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf

# sbatch(1), --signal: "the signal may be sent up to 60 seconds earlier than specified"
SLURM_EARLY_S = 60
TASK_START_S = 10  # a task's interpreter starting, until task.py holds the signal (a loaded node)


@dataclass
class RunsSweeperConf:
    _target_: str = "hydra_plugins.accordion_bench.sweeper.RunsSweeper"
    groups: list[Any] = field(default_factory=list)   # run groups: {key: value or list}
    params: dict[str, Any] = field(default_factory=dict)  # crossed with every group
    dry_run: bool = False                              # print the plan, launch nothing
    max_batch_size: int | None = None                  # runs handed to the launcher at once
    show: str | None = None            # config | diff: each run's resolved config, or its diff


ConfigStore.instance().store(group="hydra/sweeper", name="runs", node=RunsSweeperConf,
                             provider="accordion-bench")


class RunsSweeper(Sweeper):
    """Union of run groups; plans, checks data, skips completed runs, then launches."""

    def __init__(self, groups: list[Any], params: dict[str, Any], dry_run: bool = False,
                 max_batch_size: int | None = None, show: str | None = None) -> None:
        self.groups = [OmegaConf.to_container(g) if OmegaConf.is_config(g) else g
                       for g in groups]
        self.params = dict(params or {})
        self.dry_run, self.max_batch_size, self.show = dry_run, max_batch_size, show
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from core.errors import ConfigError
        from jobs import runs, sweeps

        assert self.config is not None and self.hydra_context is not None
        assert self.launcher is not None
        cfg = self.config
        loader = self.hydra_context.config_loader

        def compose(overrides: list[str]) -> DictConfig:
            return loader.load_sweep_config(cfg, overrides)

        try:
            _check_launcher(cfg)
            jobs = sweeps.expand(self.groups, self.params, arguments, cfg.get("scale"))
            plan = sweeps.make_plan(str(cfg.get("sweep")), cfg.get("scale"), _workers(cfg), jobs,
                                    compose, loader.repository.group_exists,
                                    parallel=int(cfg.hydra.launcher.get("parallel") or 1),
                                    measured=_measured(cfg))
            print(plan.describe(), flush=True)
            if self.show:  # diff: against `python run.py` without overrides
                defaults = loader.load_configuration(cfg.hydra.job.config_name, [], RunMode.RUN)
                print(plan.show(self.show, defaults), flush=True)
            sweeps.check_directories(plan)
            sweeps.check_data(plan)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        todo = [job.overrides for job in plan.todo()]
        if self.dry_run or not todo:
            return []
        stamps = {str(job.run_dir): runs.summary_stamp(job.run_dir) for job in plan.todo()}
        size = self.max_batch_size or len(todo)
        returns: list[JobReturn] = []
        for start in range(0, len(todo), size):
            returns += self.launcher.launch(todo[start:start + size], initial_job_idx=start)
        failed = [r for r in returns if r.status is not JobStatus.COMPLETED]
        line = f"sweep {plan.name}: {len(returns) - len(failed)} of {len(returns)} runs finished"
        if not failed:
            print(line, flush=True)
            return returns
        ends = "; ".join(_record_failure(r, Path(str(cfg.hydra.sweep.dir)), stamps)
                         for r in failed)
        print(f"{line}, {len(failed)} failed: {ends}", file=sys.stderr, flush=True)
        sys.exit(1)


def _record_failure(ret: JobReturn, root: Path, stamps: dict[str, Any]) -> str:
    """``<run directory> (<how the run ended>)`` for a failed job, recorded in the run's
    directory if the job could not (:func:`jobs.runs.record_failed_job`)."""
    from jobs import runs

    error = ret._return_value  # noqa: SLF001 (JobReturn.return_value raises a job's error)
    lines = str(error).strip().splitlines()
    run_dir = Path(str(ret.working_dir))
    status = runs.record_failed_job(run_dir, lines[-1] if lines else type(error).__name__,
                                    stamps.get(str(run_dir)))
    shown = run_dir.relative_to(root) if run_dir.is_relative_to(root) else run_dir
    return f"{shown} ({status})"


def _check_launcher(cfg: DictConfig) -> None:
    """ConfigError naming the field if the ddp launcher's counts are not integers >= 1, or if
    the Slurm launcher's signal may come as a job starts (:func:`_check_slurm_signal`)."""
    from core.errors import check_int

    launcher = cfg.hydra.launcher
    for key in ("nproc_per_node", "parallel"):
        if key in launcher:
            check_int(launcher[key], f"hydra.launcher.{key}", 1)
    if str(launcher.get("_target_", "")).endswith(".SlurmJobsLauncher"):
        _check_slurm_signal(launcher)


def _check_slurm_signal(launcher: DictConfig) -> None:
    """ConfigError unless submitit's signal (``--signal=USR2@signal_delay_s``) comes well after
    a job (attempt) starts. Slurm may send it up to :data:`SLURM_EARLY_S` s before
    ``signal_delay_s`` (sbatch(1), ``--signal``; slurmctld checks every 30 s and sends it once
    ``now + signal_delay_s + 30 >= end``: send_job_warn_signal in src/slurmctld/job_mgr.c, 22.05),
    and a task holds it only once its interpreter runs
    (hydra_plugins/accordion_bench/task.py): a signal before that kills the task, and the job
    fails instead of being requeued."""
    from core.errors import ConfigError, check_int

    limit_s = 60 * check_int(launcher.timeout_min, "hydra.launcher.timeout_min", 1)
    delay_s = check_int(launcher.signal_delay_s, "hydra.launcher.signal_delay_s", 0)
    margin_s = SLURM_EARLY_S + TASK_START_S
    if delay_s > limit_s - margin_s:
        fix = (f"at most {limit_s - margin_s} with timeout_min={limit_s // 60}"
               if limit_s >= margin_s else f"and timeout_min >= {-(-margin_s // 60)}")
        raise ConfigError(
            f"hydra.launcher.signal_delay_s: expected an integer <= 60 * timeout_min - "
            f"{margin_s} ({fix}), got {delay_s}: Slurm may send the signal up to "
            f"{SLURM_EARLY_S} s early (sbatch --signal), which could reach a task in its first "
            f"{TASK_START_S} s, before it holds the signal, and kill it")


def _measured(cfg: DictConfig) -> Any:
    """At tiny scale, the FLOP rates of this machine's complete runs below ``runs_root`` under
    the sweep's numerics (jobs.sweeps.measured_rates); None at other scales."""
    from jobs import sweeps

    if cfg.get("scale") != "tiny":
        return None
    return sweeps.rates_here(Path(str(cfg.runs_root)), str(cfg.trainer.numerics))


def _workers(cfg: DictConfig) -> int:
    """Ranks per run under the configured launcher (for the compute estimate)."""
    launcher = cfg.hydra.launcher
    return int(launcher.get("nproc_per_node") or launcher.get("tasks_per_node") or 1) * int(
        launcher.get("nodes") or 1)
