"""How a rank reacts to the signals that end jobs early: the one place for it.

- SIGTERM (`kill`, Slurm's preemption, torchrun stopping the other workers when one fails) ends
  the run through ``SystemExit(143)``, so that ``summary.json`` records ``failed: SystemExit:
  143``; the last epoch's checkpoint is there to resume from.
- While the run writes down how it ended (:func:`shield`), a SIGTERM is held, not acted on: the
  summary is written whole, then the run ends as it was ending anyway.

(Checkpointing at the next step on SIGTERM / SIGUSR1 would hook in here.)
"""

from __future__ import annotations

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
