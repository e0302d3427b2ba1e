"""The scheduler interface the training loop calls at epoch boundaries."""

from __future__ import annotations

from typing import Any

from compression.hook import HookState


class Scheduler:
    """Decides each layer's compression level, epoch by epoch.

    The loop calls :meth:`start_epoch` before an epoch's first step and :meth:`end_epoch` after
    its last; both return metrics for that epoch's row (``critical/<layer>``, ...).
    """

    name: str = "base"

    def start_epoch(self, epoch: int, hook: HookState) -> dict[str, Any]:
        """Set the levels ``hook`` uses in ``epoch``; return metrics to log."""
        return {}

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the epoch's statistics; return metrics to log."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The history a resumed run needs to make the same decisions."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
