"""``scheduler=accordion_batch_auto``: Accordion's batch switch with B_high from the noise scale.

Agarwal et al. (MLSys 2021), Algorithm 1 with batch sizes for levels, as
``scheduler=accordion_batch`` runs it (the same detector on the whole model's ||Delta_e||, the
same LR scaling relative to ``batch_low``), except that B_high is not fixed: at the end of epoch
0 and of every check epoch it becomes the largest of ``batches`` (and at least ``batch_low``)
that does not exceed the gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al.,
"An Empirical Model of Large-Batch Training", 2018: the batch beyond which a larger one buys
little), measured on the first ``probe_steps`` steps of that epoch from each worker's gradient
and their mean (:mod:`compression.noise`, :func:`schedulers.accordion_auto.noise_scale`). Where
the |G|^2 estimate is not positive (noise dominates) B_simple is inf and the largest candidate
is taken. Critical regimes run at ``batch_low``.

Logged at the end of measured epochs: ``auto/noise_scale/model``, ``auto/grad_sq/model``,
``auto/trace/model``, ``auto/probe_bits/model`` and the chosen ``auto/batch_high/model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compression.base import Compressor
from compression.worker import WorkerState
from core.errors import check_int
from schedulers import register
from schedulers.accordion_auto import (
    Probing,
    as_list,
    check_world,
    measured_epoch,
    model_noise_metrics,
)
from schedulers.accordion_batch import MODEL, AccordionBatch, check_divisible

DOUBLINGS = 6  # default candidates: batch_low x 1, 2, 4, ..., 32


def batch_high(noise_scale: float, batch_low: int, batches: Sequence[int]) -> int:
    """The largest of ``batches`` <= B_simple, and at least ``batch_low``."""
    return max([batch_low, *(b for b in batches if b <= noise_scale)])


@register("accordion_batch_auto")
class AccordionBatchAuto(AccordionBatch):
    """Global batch ``batch_low`` in critical regimes, elsewhere ``batch_high``: the largest of
    ``batches`` up to the measured noise scale (``batch_low`` until the first measurement)."""

    def __init__(self, batch_low: int = 512, batches: Sequence[int] | None = None,
                 lr_scaling: str = "linear", eta: float = 0.5, interval: int = 10,
                 probe_steps: int = 4, probe_sample: float = 1 / 16) -> None:
        super().__init__(batch_low, batch_low, lr_scaling, eta, interval)
        listed = as_list(batches, "batches")
        self.batches = sorted(check_int(b, "scheduler.batches", batch_low) for b in listed) \
            if listed is not None else [batch_low * 2**k for k in range(DOUBLINGS)]
        self.probing = Probing(interval, probe_steps, probe_sample)

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """ConfigError unless every batch splits evenly over >= 2 workers."""
        check_world(world_size, self.name)
        check_divisible([("batch_low", self.batch_low), *(("batches", b) for b in self.batches)],
                        world_size)

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Attach the probe; log ``critical/model``."""
        self.probing.attach(hook_state)
        return super().start_epoch(epoch, hook_state)

    def batch_sizes(self, default: int) -> dict[str, int]:
        """``batch_low`` and every candidate."""
        return {"scheduler.batch_low": self.batch_low,
                **{f"scheduler.batches[{i}]": b for i, b in enumerate(self.batches)}}

    def end_epoch(self, epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        """Record the whole model's ||Delta_e||; on measured epochs choose B_high again."""
        batch = self.batch_size(epoch, self.batch_low)
        out = super().end_epoch(epoch, grad_norms, lr, next_lr)
        if not measured_epoch(epoch, self.history.interval):
            return out
        measured = self.probing.take()
        if measured.steps == 0:
            return out
        out.update(model_noise_metrics(measured, batch))
        self.batch_high = batch_high(out[f"auto/noise_scale/{MODEL}"], self.batch_low,
                                     self.batches)
        out[f"auto/batch_high/{MODEL}"] = self.batch_high
        return out

    def state_dict(self) -> dict[str, Any]:
        """The detector's history, B_high, the probe's sums (mid-epoch)."""
        return {**super().state_dict(), "batch_high": self.batch_high,
                "probe": self.probing.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.batch_high = int(state["batch_high"])
        self.probing.load_state_dict(state["probe"])
