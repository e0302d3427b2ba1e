"""What a checkpoint holds and how every rank saves and restores its part of it; seeding.

Rank 0 writes ``checkpoint.pt`` (atomically, :func:`core.record.save_checkpoint`) with the model,
the optimizer, the scheduler's history and, per rank, what differs across ranks: the RNG states
and the compressor memories (error feedback, residues, warm-start Q). A resumed run therefore
continues bit for bit (on CPU) as if it had never stopped.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from compression import HookState
from core import record
from core.errors import ConfigError
from schedulers import Scheduler


def save(path: Path, cfg: Any, next_epoch: int, elapsed_s: float, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, hook_state: HookState, scheduler: Scheduler) -> None:
    """Gather every rank's own state (RNG, compressor memories); rank 0 writes the checkpoint.

    Collective: every rank must call it.
    """
    mine = {"rng": _rng_state(), "compressor": _to_cpu(hook_state.state_dict())}
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, mine)
    if dist.get_rank() == 0:
        record.save_checkpoint(path, {
            "epoch": next_epoch,
            "elapsed_s": elapsed_s,
            "world_size": dist.get_world_size(),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": {"epoch": next_epoch, "seed": int(cfg.seed)},
            "per_rank": per_rank,
            "config": OmegaConf.to_container(cfg, resolve=True),
        })
    dist.barrier()


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         hook_state: HookState, scheduler: Scheduler) -> tuple[int, float]:
    """Restore a checkpoint on this rank; returns (first epoch to run, elapsed seconds)."""
    ckpt = record.load_checkpoint(path)
    world_size = dist.get_world_size()
    if ckpt["world_size"] != world_size:
        raise ConfigError(f"resume: {path} was written by {ckpt['world_size']} ranks; resume it "
                          f"with the same number, not {world_size}")
    device = next(model.parameters()).device
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    mine = ckpt["per_rank"][dist.get_rank()]
    hook_state.load_state_dict(_map_tensors(mine["compressor"], lambda t: t.to(device)))
    _set_rng_state(mine["rng"])
    return int(ckpt["epoch"]), float(ckpt["elapsed_s"])


def seed_everything(seed: int, rank: int, deterministic: bool) -> None:
    """Seed Python, NumPy and torch; ``rank`` offsets the data-side seeds (model init uses 0).

    (Here rather than in run.py: submitit pickles run.py's functions by value, and
    ``torch.backends.cudnn`` is a module object that cannot be pickled so.)
    """
    s = int(seed) * 1000 + rank
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _to_cpu(obj: Any) -> Any:
    return _map_tensors(obj, lambda t: t.detach().cpu())


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj
