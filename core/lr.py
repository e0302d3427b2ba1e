"""Per-epoch learning-rate schedule: linear warm-up, then step decays, optionally one epoch late.

``s(k)`` for 0-based k, with ``lr`` the peak (post-warm-up) learning rate:

- warm-up, k < warmup_epochs:  warmup_start_lr + (lr - warmup_start_lr) * k / warmup_epochs
- afterwards:                  lr * decay_factors[i] for the last milestone[i] <= k
  (``decay_factors`` are cumulative factors relative to ``lr``: the paper's CIFAR recipe,
  "/10 after epoch 150, /100 after epoch 250", is milestones [150, 250], factors [0.1, 0.01]).

Epoch e trains with ``s(max(e - lag, 0))``. ``lag: 0`` is the schedule as written. ``lag: 1`` is
how the Accordion authors' code ran it: it computes the next epoch's LR at the end of epoch e
from e (their ``get_lr(e)``, decayed for e > 150 and e > 250), so the warm-up peaks at epoch 6
and the decays first take effect at epochs 152 and 252 (conf/recipe/paper_*.yaml: milestones
[151, 251] with lag 1; their logs show the accuracy jump at 152).

The rate is a pure function of the epoch, so a resumed run needs no schedule state, and
Accordion reads LR decays from it ("gamma_next < gamma_curr").
"""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError, check_int, check_int_list, check_number


def check(cfg: Any) -> None:
    """Validate ``optimizer.lr``, ``optimizer.weight_decay`` and ``optimizer.schedule`` (the
    optimizer's own keys: :func:`training.optim.check`)."""
    check_number(cfg.lr, "optimizer.lr", 0, low_open=True)
    check_number(cfg.weight_decay, "optimizer.weight_decay", 0)
    s = cfg.schedule
    check_int(s.warmup_epochs, "optimizer.schedule.warmup_epochs", 0)
    check_number(s.warmup_start_lr, "optimizer.schedule.warmup_start_lr", 0, low_open=True)
    milestones = check_int_list(s.milestones, "optimizer.schedule.milestones")
    if milestones != sorted(set(milestones)):
        raise ConfigError("optimizer.schedule.milestones: expected increasing epochs >= 1, got "
                          f"{milestones}")
    factors = s.decay_factors
    if not isinstance(factors, list | tuple) and type(factors).__name__ != "ListConfig":
        raise ConfigError(f"optimizer.schedule.decay_factors: expected a list of numbers > 0, "
                          f"got {factors!r}")
    if len(milestones) != len(factors):
        raise ConfigError("optimizer.schedule.decay_factors: expected one factor per milestone, "
                          f"got {len(factors)} factors for {len(milestones)} milestones")
    for factor in factors:
        check_number(factor, "optimizer.schedule.decay_factors", 0, low_open=True)
    check_int(s.get("lag", 0), "optimizer.schedule.lag", 0)


def lr_at(cfg: Any, epoch: int) -> float:
    """The learning rate of 0-based ``epoch`` under the ``optimizer`` config."""
    peak, s = float(cfg.lr), cfg.schedule
    epoch = max(epoch - int(s.get("lag", 0)), 0)
    warmup = int(s.warmup_epochs)
    if epoch < warmup:
        start = float(s.warmup_start_lr)
        return start + (peak - start) * epoch / warmup
    factor = 1.0
    for milestone, f in zip(s.milestones, s.decay_factors, strict=True):
        if epoch >= int(milestone):
            factor = float(f)
    return peak * factor
