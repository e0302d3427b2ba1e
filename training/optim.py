"""The optimizer of the ``optimizer`` config node: SGD (momentum, Nesterov) or Adam.

Compression sits before the optimizer: the hook hands it the aggregated gradient, with error
feedback already applied to gradients (as the AdaComp paper does under momentum SGD and Adam).
The learning rate of every epoch comes from :func:`core.lr.lr_at`, whatever the optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from core import lr
from core.errors import ConfigError, check_bool, check_choice, check_number

OPTIMIZERS = ("sgd", "adam")


def check(cfg: Any) -> None:
    """Validate the ``optimizer`` node: its name, its own keys, the LR and its schedule."""
    check_choice(cfg.name, "optimizer.name", OPTIMIZERS)
    lr.check(cfg)
    if cfg.name == "sgd":
        momentum = check_number(cfg.momentum, "optimizer.momentum", 0, 1, high_open=True)
        if check_bool(cfg.nesterov, "optimizer.nesterov") and momentum == 0:
            raise ConfigError("optimizer.nesterov: Nesterov momentum needs optimizer.momentum "
                              "> 0")
        return
    betas = list(cfg.betas) if isinstance(cfg.betas, Iterable) else cfg.betas
    if not (isinstance(betas, list) and len(betas) == 2
            and all(0 <= _number(b, "optimizer.betas") < 1 for b in betas)):
        raise ConfigError(f"optimizer.betas: expected two numbers in [0, 1), got {cfg.betas}")
    check_number(cfg.eps, "optimizer.eps", 0, low_open=True)


def build(cfg: Any, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer over ``params`` (its LR is set every epoch from the schedule)."""
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=float(cfg.lr), betas=tuple(map(float, cfg.betas)),
                                eps=float(cfg.eps), weight_decay=float(cfg.weight_decay))
    return torch.optim.SGD(params, lr=float(cfg.lr), momentum=float(cfg.momentum),
                           weight_decay=float(cfg.weight_decay), nesterov=bool(cfg.nesterov))


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{field}: expected a number, got {value!r}")
    return float(value)
