"""How a rank reacts to the signals that end jobs early: the one place for it.

- Under submitit (hydra-submitit-launcher on Slurm, or its local executor), submitit's handlers
  stay: its preemption / time-limit signal (SIGUSR2 by default; Slurm sends it ``signal_delay_s``
  before the limit) makes rank 0 call the launcher's ``checkpoint()``, requeue the job and exit,
  and SIGTERM is logged and ignored. The requeued job starts the same run again, and
  ``resume: auto`` continues it from its last epoch checkpoint (training/runs.py).
- Elsewhere (`kill`, torchrun stopping the other workers when one fails, srun), SIGTERM ends the
  run through ``SystemExit(143)``, so that ``summary.json`` records ``failed: SystemExit: 143``:
  an interruption, which a relaunch of the sweep resumes from the last epoch's checkpoint.
- While the run writes down how it ended (:func:`shield`), a SIGTERM is held, not acted on: the
  summary is written whole, then the run ends as it was ending anyway.

(Checkpointing at the next step on SIGTERM / SIGUSR1 would hook in here.)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGTERM,)
_state = {"shielded": False}
_held: list[int] = []


def install() -> None:
    """Set this process's handlers (see the module docstring)."""
    if "SUBMITIT_EXECUTOR" in os.environ:
        return
    for signum in HANDLED:
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state["shielded"]:
        _held.append(signum)
        return
    sys.exit(128 + signum)


@contextmanager
def shield() -> Iterator[None]:
    """Hold the handled signals inside the block. Use it where the run is ending already (an
    exception on its way out): what a held signal asked for then happens anyway."""
    before = _state["shielded"]
    _state["shielded"] = True
    try:
        yield
    finally:
        _state["shielded"] = before


def held() -> list[int]:
    """Signals that arrived inside :func:`shield` blocks, in order."""
    return list(_held)
