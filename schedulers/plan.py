"""``scheduler=plan``: a fixed per-epoch plan of compression levels and/or batch sizes, no detector.

The plan is a list of phases: phase i starts at epoch ``epochs[i]`` (0-based, increasing, the
first 0) and lasts until the next one starts. In phase i every compressed layer runs at
``levels[i]`` (null: the compressor's own level) and the global batch is ``batch_sizes[i]``
(``batch_sizes: null`` keeps ``trainer.batch_size``), with the schedule's LR scaled by
``batch_sizes[i] / base_batch`` (``lr_scaling``: linear, its square root, or none; ``base_batch``
null = ``batch_sizes[0]``, the batch that ``optimizer.lr`` is for).

Uses: the Accordion authors' batch-size runs, which did not run the detector but followed a fixed
plan (their logs: ``fixed_sched=True, auto_switch=False``; batch 512 for epochs 0-19, 4096 from
epoch 20 to the end: ``epochs: [0, 20], batch_sizes: [512, 4096]``); a constant large batch
with the LR scaled to it (``epochs: [0], batch_sizes: [4096], base_batch: 512``); and what-if
schedules of levels ("rank 1 for epochs 0-19, then rank 2").
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from compression.base import Compressor
from compression.worker import WorkerState
from core.errors import ConfigError, check_int
from schedulers import register
from schedulers.accordion_batch import LR_SCALINGS, lr_factor
from schedulers.base import Scheduler


def _as_list(value: Any, field: str) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"scheduler.{field}: expected a list (one entry per phase) or null, got "
                          f"{value!r}")
    return list(value)


@register("plan")
class Plan(Scheduler):
    """Phase i (from epoch ``epochs[i]``): level ``levels[i]``, global batch ``batch_sizes[i]``."""

    def __init__(self, epochs: Sequence[int] = (0,), levels: Sequence[Any] | None = None,
                 batch_sizes: Sequence[int] | None = None, base_batch: int | None = None,
                 lr_scaling: str = "linear") -> None:
        starts = _as_list(epochs, "epochs") or []
        for e in starts:
            check_int(e, "scheduler.epochs", 0)
        if not starts or starts[0] != 0 or starts != sorted(set(starts)):
            raise ConfigError(f"scheduler.epochs: expected increasing phase starts beginning with "
                              f"0, got {list(starts)}")
        self.starts = starts
        self.levels = _as_list(levels, "levels")
        self.batches = _as_list(batch_sizes, "batch_sizes")
        for field, values in (("levels", self.levels), ("batch_sizes", self.batches)):
            if values is not None and len(values) != len(starts):
                raise ConfigError(f"scheduler.{field}: expected one entry per phase "
                                  f"({len(starts)}, as scheduler.epochs), got {len(values)}")
        for b in self.batches or []:
            check_int(b, "scheduler.batch_sizes")
        if base_batch is not None:
            check_int(base_batch, "scheduler.base_batch")
        self.base_batch = base_batch if base_batch is not None else (self.batches or [None])[0]
        if lr_scaling not in LR_SCALINGS:
            raise ConfigError(f"scheduler.lr_scaling: expected one of {list(LR_SCALINGS)}, got "
                              f"{lr_scaling!r}")
        self.lr_scaling = lr_scaling

    def phase(self, epoch: int) -> int:
        """The index of the phase ``epoch`` belongs to."""
        return bisect_right(self.starts, epoch) - 1

    def validate(self, compressor: Compressor, batch_size: int, world_size: int) -> None:
        """ConfigError for a level the compressor rejects or a batch the ranks cannot split."""
        for level in self.levels or []:
            if level is not None:
                compressor.validate_level(level, "scheduler.levels")
        for batch in self.batches or []:
            if batch % world_size:
                raise ConfigError(f"scheduler.batch_sizes: the global batch {batch} must be "
                                  f"divisible by the world size {world_size}")

    def start_epoch(self, epoch: int, hook_state: WorkerState) -> dict[str, Any]:
        """Set every compressed layer to the phase's level (``level/*`` is logged by the hook)."""
        if self.levels is not None:
            level = self.levels[self.phase(epoch)]
            compressor = hook_state.compressor
            hook_state.set_levels({
                name: compressor.default_level(hook_state.layers[name].shape) if level is None
                else level for name in hook_state.compressed_layers()})
        return {}

    def batch_size(self, epoch: int, default: int) -> int:
        """The phase's global batch (``default`` without ``batch_sizes``)."""
        return default if self.batches is None else int(self.batches[self.phase(epoch)])

    def batch_sizes(self, default: int) -> dict[str, int]:
        """Each planned batch by its place in ``batch_sizes`` (``default`` without a plan)."""
        if self.batches is None:
            return super().batch_sizes(default)
        return {f"scheduler.batch_sizes[{i}]": int(b) for i, b in enumerate(self.batches)}

    def lr_scale(self, epoch: int) -> float:
        """The LR multiplier of the phase's batch relative to ``base_batch``."""
        if self.batches is None:
            return 1.0
        return lr_factor(self.batch_size(epoch, 0), self.base_batch, self.lr_scaling)
