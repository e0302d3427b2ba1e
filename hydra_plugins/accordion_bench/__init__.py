"""accordion-bench's Hydra plugins: the run-group sweeper (``hydra/sweeper: runs``) and the local
multi-process launcher (``hydra/launcher: ddp``), and a one-line error for a misspelt config group
option (:mod:`.choices`). Hydra imports every module of the ``hydra_plugins`` namespace at
start-up, so these modules import the suite lazily."""

from hydra_plugins.accordion_bench import choices

choices.install()
