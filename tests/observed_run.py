"""``run.py`` with observers, for tests that must see inside every rank of a real run.

    torchrun --nproc-per-node 2 tests/observed_run.py <run.py's overrides>   # OBSERVE_DIR=<dir>

Runs run.py's Hydra app unchanged. Before it starts, it wraps ``models.build`` and
``schedulers.build`` so that, on every rank, it records (into ``$OBSERVE_DIR/rank<r>.pt``,
rewritten at the end of every epoch):

- ``local``: per epoch and parameter, this rank's local gradients summed over the epoch's
  steps, taken by autograd hooks on the parameters themselves (``Tensor.register_hook``: the
  gradient of one backward, before DDP or the communication hook sees it), independently of
  the hook's Delta_e;
- ``received``: the norms each ``end_epoch`` call got, and ``started``: what each
  ``start_epoch`` call returned (the decisions), on this rank.

The objects are the real ones; the wrappers only watch.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
import schedulers  # noqa: E402

RECORD: dict[str, list[Any]] = {"local": [], "received": [], "started": []}


def _observed_model(*args: Any, **kwargs: Any) -> torch.nn.Module:
    model = _build_model(*args, **kwargs)
    for name, param in model.named_parameters():
        param.register_hook(lambda grad, name=name: _add(name, grad))
    return model


def _add(name: str, grad: torch.Tensor) -> None:
    if not RECORD["local"]:  # the backward that settles DDP's buckets, before any epoch
        return
    epoch = RECORD["local"][-1]
    if name in epoch:
        epoch[name] += grad.detach()
    else:
        epoch[name] = grad.detach().clone()


def _observed_scheduler(cfg: Any) -> schedulers.Scheduler:
    scheduler = _build_scheduler(cfg)
    start, end = scheduler.start_epoch, scheduler.end_epoch

    def start_epoch(epoch: int, hook_state: Any) -> dict[str, Any]:
        RECORD["local"].append({})
        row = start(epoch, hook_state)
        RECORD["started"].append(dict(row))
        return row

    def end_epoch(epoch: int, grad_norms: dict[str, float], lr: float, next_lr: float
                  ) -> dict[str, Any]:
        RECORD["received"].append(dict(grad_norms))
        row = end(epoch, grad_norms, lr, next_lr)
        _save()
        return row

    scheduler.start_epoch, scheduler.end_epoch = start_epoch, end_epoch
    return scheduler


def _save() -> None:
    """The record so far, after every epoch: run.py's process ends with ``os._exit``, so nothing
    can be written after it returns."""
    rank = int(os.environ.get("RANK", "0"))
    torch.save(RECORD, Path(os.environ["OBSERVE_DIR"]) / f"rank{rank}.pt")


_build_model, _build_scheduler = models.build, schedulers.build
models.build, schedulers.build = _observed_model, _observed_scheduler

if __name__ == "__main__":
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")  # as `python run.py ...`
