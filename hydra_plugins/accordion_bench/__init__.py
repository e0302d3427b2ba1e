"""accordion-bench's Hydra plugins: the run-group sweeper (``hydra/sweeper: runs``), the local
multi-process launcher (``hydra/launcher: ddp``) and the submitit launchers whose jobs fail one
by one (``accordion_slurm``, ``accordion_submitit_local``: jobs.py, their tasks started by
task.py). Hydra imports every module of the ``hydra_plugins`` namespace at start-up, so these
modules import the suite lazily."""
