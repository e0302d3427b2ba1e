"""accordion-bench's Hydra plugins: the run-group sweeper (``hydra/sweeper: runs``), the local
multi-process launcher (``hydra/launcher: ddp``), the submitit launchers whose jobs fail one by one
(``accordion_slurm``, ``accordion_submitit_local``: :mod:`.jobs`, their tasks started by
:mod:`.task`), and a one-line error for a misspelt config group option (:mod:`.choices`). Hydra
imports every module of the ``hydra_plugins`` namespace at start-up, so these modules import the
suite lazily."""

from hydra_plugins.accordion_bench import choices

choices.install()
