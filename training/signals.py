"""How a rank reacts to the signals that end jobs early: the one place for it.

- Under submitit (hydra-submitit-launcher on Slurm, or its local executor), submitit's handlers
  stay: its preemption / time-limit signal (SIGUSR2 by default; Slurm sends it ``signal_delay_s``
  before the limit) makes rank 0 call the launcher's ``checkpoint()``, requeue the job and exit,
  and SIGTERM is logged and ignored. The requeued job starts the same run again, and
  ``resume: auto`` continues it from its last epoch checkpoint (training/runs.py).
- Elsewhere (torchrun, srun, one process), SIGTERM ends the run through ``SystemExit(143)``, so
  that ``summary.json`` records ``failed: SystemExit: 143``: an interruption, which a relaunch of
  the sweep resumes from the last epoch checkpoint.

(Checkpointing at the next step on these signals, rather than relying on the last epoch's
checkpoint, would hook in here.)
"""

from __future__ import annotations

import os
import signal
import sys


def install() -> None:
    """Set this process's handlers (see the module docstring)."""
    if "SUBMITIT_EXECUTOR" in os.environ:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
