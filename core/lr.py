"""Per-epoch learning-rate schedule: linear warm-up, then step decays.

``lr(e)`` for 0-based epoch e, with ``lr`` the peak (post-warm-up) learning rate:

- warm-up, e < warmup_epochs:  warmup_start_lr + (lr - warmup_start_lr) * e / warmup_epochs
- afterwards:                  lr * product of decay_factors[i] for every milestone[i] <= e
  (``decay_factors`` are cumulative factors relative to ``lr``: the CIFAR recipe's
  "/10 after epoch 150, /100 after epoch 250" is milestones [150, 250], factors [0.1, 0.01]).

The rate is a pure function of the epoch, so a resumed run needs no schedule state, and
Accordion reads LR decays from it ("gamma_next < gamma_curr").
"""

from __future__ import annotations

from typing import Any

from core.errors import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_int_list,
    check_number,
)


def check(cfg: Any) -> None:
    """Validate ``optimizer`` (SGD: lr, momentum, weight decay, Nesterov) and
    ``optimizer.schedule``."""
    check_choice(cfg.name, "optimizer.name", ("sgd",))
    check_number(cfg.lr, "optimizer.lr", 0, low_open=True)
    momentum = check_number(cfg.momentum, "optimizer.momentum", 0, 1, high_open=True)
    check_number(cfg.weight_decay, "optimizer.weight_decay", 0)
    if check_bool(cfg.nesterov, "optimizer.nesterov") and momentum == 0:
        raise ConfigError("optimizer.nesterov: Nesterov momentum needs optimizer.momentum > 0")
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


def lr_at(cfg: Any, epoch: int) -> float:
    """The learning rate of 0-based ``epoch`` under the ``optimizer`` config."""
    peak, s = float(cfg.lr), cfg.schedule
    warmup = int(s.warmup_epochs)
    if epoch < warmup:
        start = float(s.warmup_start_lr)
        return start + (peak - start) * epoch / warmup
    factor = 1.0
    for milestone, f in zip(s.milestones, s.decay_factors, strict=True):
        if epoch >= int(milestone):
            factor = float(f)
    return peak * factor
