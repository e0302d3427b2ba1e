"""The scheduler interface the training loop calls at epoch boundaries.

Order within epoch e (run.py):

1. ``start_epoch(e, hook_state)``: set every compressed layer's level for epoch e via
   ``hook_state.set_levels``; returns metrics for e's row (``critical/<layer>``,
   ``level/<layer>``...).
2. ``batch_size(e)`` and ``lr_scale(e)``: the global batch and the LR multiplier of epoch e
   (batch-size schedulers; the defaults keep ``trainer.batch_size`` and the configured LR).
3. the epoch trains;
4. ``end_epoch(e, grad_norms, lr, next_lr)``: ``grad_norms`` maps each layer to ||Delta_e||
   (its local gradient summed over epoch e, rank 0's, broadcast so every rank passes the same
   values), ``lr``/``next_lr`` are the schedule's LR of epochs e and e + 1; returns metrics.

Every rank calls the same methods with the same arguments, so all ranks decide alike.
"""

from __future__ import annotations

from typing import Any

from compression.worker import WorkerState


class Scheduler:
    """Decides each layer's compression level (and the batch size), epoch by epoch."""

    name: str = "base"

    def validate(self, compressor: Any, batch_size: int, world_size: int) -> None:
        """Raise ConfigError if the scheduler's settings don't fit the compressor or the job."""

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Set the levels ``hook_state`` uses in ``epoch``; return metrics to log."""
        return {}

    def batch_size(self, epoch: int, default: int) -> int:
        """The global batch of ``epoch`` (``default`` = ``trainer.batch_size``)."""
        return default

    def batch_sizes(self, default: int) -> dict[str, int]:
        """Every global batch :meth:`batch_size` may return, by the config field that sets it
        (checked against the data before the run starts)."""
        return {"trainer.batch_size": default}

    def lr_scale(self, epoch: int) -> float:
        """Multiplier on the schedule's LR in ``epoch`` (batch-size scaling)."""
        return 1.0

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the epoch's statistics; return metrics to log."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The history a resumed run needs to make the same decisions."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
