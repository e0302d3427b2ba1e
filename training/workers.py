"""The data-parallel workers this process trains: one DDP rank, or W simulated learners.

run.py picks one at the start (:func:`build`) and drives both alike: each step it calls
``step(local_backward)``, where ``local_backward(w)`` reads local worker w's next batch from
``tasks[w]`` and runs its forward and backward through ``ddp``; afterwards every parameter's
``.grad`` holds the aggregate over all workers, and the one optimizer steps.

- :class:`Rank` (``trainer.workers: null``): this process is one rank of a DDP job (torchrun,
  Slurm, submitit, or a single process); the comm hook aggregates inside backward.
- :class:`~training.simulated.SimulatedWorkers` (``launcher=simulated trainer.workers=W``): W
  logical workers in this one process, aggregated through in-memory collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
from compression.hook import comm_hook
from core.distributed import DistEnv
from core.rng import rank_seed
from data import DataBundle
from training import buckets
from training.simulated import SimulatedWorkers, simulated_envs
from training.tasks import make_task

T = TypeVar("T")


class Rank:
    """This process as one rank of a DDP job: one worker, aggregated by the comm hook."""

    def __init__(self, model: nn.Module, cfg: Any, env: DistEnv, bundle: DataBundle,
                 device: torch.device) -> None:
        self.world_size = env.world_size
        self.tasks = [make_task(bundle, env, cfg, device)]
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                       bucket_cap_mb=float(cfg.trainer.bucket_cap_mb))
        self.hook_state = compression.build(cfg.compressor, model.named_parameters(),
                                            overlap=compression.overlap.from_config(cfg.observe))
        buckets.settle(self.ddp, self.tasks[0])  # the final buckets from the first step on
        self.ddp.register_comm_hook(self.hook_state, comm_hook)

    @staticmethod
    def step(local_backward: Callable[[int], T]) -> list[T]:
        """This rank's forward and backward (``local_backward(0)``); DDP's hook aggregates
        while it runs. Returns what it returned, as the one worker's."""
        return [local_backward(0)]

    def set_batch_size(self, batch_size: int) -> None:
        """Global batch ``batch_size`` from the next epoch on."""
        self.tasks[0].set_batch_size(batch_size)

    def evaluate(self) -> dict[str, float]:
        """The test metrics over every rank's shard (one all-reduce)."""
        return self.tasks[0].evaluate(self.ddp.module)

    def mean_loss(self, loss_sum: torch.Tensor, steps: int) -> float:
        """The epoch's mean training loss over all ranks, from this rank's sum (``loss_sum``:
        one element)."""
        total = loss_sum.sum()
        dist.all_reduce(total)
        return total.item() / (steps * self.world_size)


def build(model: nn.Module, cfg: Any, env: DistEnv, bundle: DataBundle, device: torch.device
          ) -> Rank | SimulatedWorkers:
    """The workers ``cfg.trainer.workers`` asks for: null, this rank; W, W simulated learners
    (worker w's data-side RNG seeded as rank w seeds its own)."""
    workers = cfg.trainer.workers
    if workers is None:
        return Rank(model, cfg, env, bundle, device)
    tasks = [make_task(bundle, e, cfg, device) for e in simulated_envs(int(workers))]
    seeds = [rank_seed(cfg.seed, w) for w in range(int(workers))]
    return SimulatedWorkers(model, cfg.compressor, tasks, seeds,
                            bucket_cap_mb=float(cfg.trainer.bucket_cap_mb),
                            overlap=compression.overlap.from_config(cfg.observe))
