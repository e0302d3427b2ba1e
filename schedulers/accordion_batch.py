"""``scheduler=accordion_batch``: Accordion's switch between a small and a large global batch.

Agarwal et al. (MLSys 2021), Algorithm 1 with batch sizes for levels: ``batch_low`` (default 512)
in critical regimes, ``batch_high`` (default 4096) elsewhere. The detector is the one of
:mod:`schedulers.accordion` (same ``eta``, ``interval``, LR-decay rule, same rank-0 norms on every
rank), applied to the whole model: ||Delta_e|| = sqrt(sum over layers of ||Delta_e^layer||^2).

``trainer.batch_size`` is ignored: the global batch of every epoch is ``batch_low`` or
``batch_high``. The switch happens at epoch boundaries: run.py rebuilds the loader from
:meth:`~AccordionBatch.batch_size` and multiplies the schedule's LR by
:meth:`~AccordionBatch.lr_scale`, relative to ``batch_low`` (``lr_scaling``: ``linear``
batch / batch_low, ``sqrt`` its square root, ``none`` 1). The optimizer config's LR is
therefore the LR of ``batch_low``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from compression.base import Compressor
from compression.worker import WorkerState
from core.errors import ConfigError, check_choice, check_int
from schedulers import register
from schedulers.accordion import History
from schedulers.base import Scheduler

MODEL = "model"  # the detector's one "layer": the whole model
LR_SCALINGS = ("linear", "sqrt", "none")


def lr_factor(batch: int, base_batch: int, lr_scaling: str) -> float:
    """The LR multiplier of global batch ``batch`` relative to ``base_batch``: ``linear``
    batch / base_batch, ``sqrt`` its square root, ``none`` 1."""
    factor = batch / base_batch
    if lr_scaling == "linear":
        return factor
    return math.sqrt(factor) if lr_scaling == "sqrt" else 1.0


def check_divisible(batches: Iterable[tuple[str, int]], world_size: int) -> None:
    """ConfigError naming ``scheduler.<field>`` unless every (field, global batch) splits
    evenly over the ranks."""
    for field, batch in batches:
        if batch % world_size:
            raise ConfigError(f"scheduler.{field}: the global batch {batch} must be divisible by "
                              f"the world size {world_size}")


def model_norm(grad_norms: dict[str, float]) -> float:
    """The whole model's ||Delta_e||: sqrt of the sum of the squared per-layer norms."""
    return math.sqrt(sum(g * g for g in grad_norms.values()))


@register("accordion_batch")
class AccordionBatch(Scheduler):
    """Global batch ``batch_low`` in critical regimes, ``batch_high`` elsewhere."""

    def __init__(self, batch_low: int = 512, batch_high: int = 4096, lr_scaling: str = "linear",
                 eta: float = 0.5, interval: int = 10) -> None:
        self.batch_low = check_int(batch_low, "scheduler.batch_low")
        self.batch_high = check_int(batch_high, "scheduler.batch_high")
        if batch_low > batch_high:
            raise ConfigError(f"scheduler.batch_low: expected <= scheduler.batch_high "
                              f"({batch_high}), got {batch_low}")
        self.lr_scaling = check_choice(lr_scaling, "scheduler.lr_scaling", LR_SCALINGS)
        self.history = History(eta, interval)

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """ConfigError unless both batches split evenly over the ranks."""
        check_divisible([("batch_low", self.batch_low), ("batch_high", self.batch_high)],
                        world_size)

    def critical(self, epoch: int) -> bool:
        """Whether ``epoch`` is critical for the whole model."""
        return self.history.critical(epoch, [MODEL])[MODEL]

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Log ``critical/model`` (the batch itself is :meth:`batch_size`)."""
        return {f"critical/{MODEL}": self.critical(epoch)}

    def batch_size(self, epoch: int, default: int) -> int:
        """Algorithm 1: ``batch_low`` in a critical regime, else ``batch_high``."""
        return self.batch_low if self.critical(epoch) else self.batch_high

    def batch_sizes(self, default: int) -> dict[str, int]:
        """``batch_low`` and ``batch_high``."""
        return {"scheduler.batch_low": self.batch_low, "scheduler.batch_high": self.batch_high}

    def lr_scale(self, epoch: int) -> float:
        """The LR multiplier of ``epoch``'s batch, relative to ``batch_low``."""
        return lr_factor(self.batch_size(epoch, self.batch_low), self.batch_low, self.lr_scaling)

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the whole model's ||Delta_e||; log ``ratio/model`` on check epochs."""
        self.history.record(epoch, {MODEL: model_norm(grad_norms)}, lr, next_lr)
        return {f"ratio/{n}": r for n, r in self.history.ratios(epoch, [MODEL]).items()}

    def state_dict(self) -> dict[str, Any]:
        """The detector's history (norms, LRs, decisions)."""
        return self.history.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.history.load_state_dict(state)
