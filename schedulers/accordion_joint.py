"""``scheduler=accordion_joint``: Accordion's level switch and batch switch at once.

One detector rule (:func:`schedulers.accordion.replay`, same ``eta`` and ``interval``) drives
both: each compressed layer's level from its own ||Delta_e|| (as ``scheduler=accordion``) and the
global batch and LR scale from the whole model's (as ``scheduler=accordion_batch``;
``trainer.batch_size`` is ignored). The papers evaluate the two separately; this combination is
ours.
"""

from __future__ import annotations

from typing import Any

from compression.base import Compressor
from compression.worker import WorkerState
from schedulers import register
from schedulers.accordion import Accordion
from schedulers.accordion_batch import AccordionBatch
from schedulers.base import Scheduler


@register("accordion_joint")
class AccordionJoint(Scheduler):
    """Per-layer levels (``low`` / ``high``) and the batch (``batch_low`` / ``batch_high``)."""

    def __init__(self, low: Any = None, high: Any = None, batch_low: int = 512,
                 batch_high: int = 4096, lr_scaling: str = "linear", eta: float = 0.5,
                 interval: int = 10) -> None:
        self.levels = Accordion(low, high, eta, interval)
        self.batch = AccordionBatch(batch_low, batch_high, lr_scaling, eta, interval)

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """Both parts' checks."""
        self.levels.validate(compressor, batch_size, world_size)
        self.batch.validate(compressor, batch_size, world_size)

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Set the levels; log ``critical/*``, ``level/*`` and ``critical/model``."""
        return {**self.levels.start_epoch(epoch, hook_state),
                **self.batch.start_epoch(epoch, hook_state)}

    def batch_size(self, epoch: int, default: int) -> int:
        """The batch part's decision."""
        return self.batch.batch_size(epoch, default)

    def batch_sizes(self, default: int) -> dict[str, int]:
        """The batch part's batches."""
        return self.batch.batch_sizes(default)

    def lr_scale(self, epoch: int) -> float:
        """The batch part's LR multiplier."""
        return self.batch.lr_scale(epoch)

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the epoch in both parts; log their ``ratio/*``."""
        return {**self.levels.end_epoch(epoch, grad_norms, lr, next_lr),
                **self.batch.end_epoch(epoch, grad_norms, lr, next_lr)}

    def state_dict(self) -> dict[str, Any]:
        """Both parts' histories."""
        return {"levels": self.levels.state_dict(), "batch": self.batch.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.levels.load_state_dict(state["levels"])
        self.batch.load_state_dict(state["batch"])
