"""What the training loop, the schedulers, the checkpoint and the progress see of a worker's
hook state: :class:`WorkerState`.

Two classes implement it, and say so by subclassing it: :class:`~compression.hook.HookState`
(one DDP rank's) and :class:`~training.simulated.AllWorkers` (W simulated learners in one
process, seen as rank 0 is: learner 0's layers and statistics, levels set on every learner).
A subclass must define every member: one it leaves out would inherit the stub below
(``tests/unit/test_worker_state.py`` checks both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from compression.base import Compressor, Layer

if TYPE_CHECKING:
    from compression.hook import Probe


class WorkerState(Protocol):
    """A worker's hook state as seen from outside the hook.

    Schedulers: :attr:`compressor`, :attr:`layers`, :meth:`compressed_layers`,
    :meth:`set_levels`, :meth:`add_probe`, :meth:`epoch_stats`. The training loop:
    :meth:`reset_epoch`, :meth:`epoch_stats`, :meth:`grad_norms`, :meth:`nonfinite`. A
    mid-epoch checkpoint: :meth:`epoch_state_dict`, :meth:`load_epoch_state_dict`.
    """

    compressor: Compressor
    layers: dict[str, Layer]  # names, shapes, levels, memories

    def compressed_layers(self) -> list[str]:
        """Names of the layers the compressor handles (ndim > 1); the rest always go dense."""
        ...

    def set_levels(self, levels: dict[str, Any]) -> None:
        """Set the compression level of some layers from the next step on (every rank sets the
        same levels at the same step); a bad level or layer raises a ConfigError naming
        ``level/<layer>``."""
        ...

    def add_probe(self, make: Callable[[], Probe]) -> Probe:
        """Take the measurement ``make()`` on the steps it chooses, from the next step on;
        returns it (rank 0's, whose results are recorded)."""
        ...

    def reset_epoch(self, epoch: int | None = None) -> None:
        """Start a new epoch's sums (``epoch``: the epoch about to be trained)."""
        ...

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's metrics (``comm/*``, ``time/compress_s``, ``level/*``, ``grad_norm/*``,
        ...), as rank 0 records them."""
        ...

    def grad_norms(self) -> dict[str, float]:
        """||Delta_e|| per layer, the statistic the schedulers decide on."""
        ...

    def nonfinite(self) -> tuple[int, list[str]] | None:
        """The first step of this epoch after which some layers' Delta_e were no longer
        finite, and those layers; None while every sum is finite."""
        ...

    def epoch_state_dict(self) -> Any:
        """The sums of the epoch so far, as plain data: a mid-epoch checkpoint's."""
        ...

    def load_epoch_state_dict(self, state: Any, device: torch.device) -> None:
        """Continue the epoch :meth:`epoch_state_dict` saved (after :meth:`reset_epoch`)."""
        ...
