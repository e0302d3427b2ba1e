"""Simulated learners: W logical workers of a data-parallel job in one process.

``launcher=simulated trainer.workers=W`` trains as W DDP ranks would, on one CPU: each worker has
its own data shard (its own ``DistributedSampler`` rank), its own RNG streams (data order,
augmentation, dropout: seeded as rank w would seed them), computes its own gradient and keeps its
own compressor memories; the aggregation runs the very compressor code of the DDP hook, through
the in-process collectives of :mod:`compression.simulate` (:class:`~compression.comm.SimComm`).

How a step runs (:meth:`SimulatedWorkers.step`):

1. worker by worker, forward and backward through a real ``DistributedDataParallel`` over this
   process's world-size-1 group, whose comm hook (:class:`_Recorder`) keeps a copy of each
   bucket and hands it back unchanged: the buckets are exactly those of a real DDP job (DDP
   builds them from the same model, laid out for good before the first step:
   :mod:`training.buckets`);
2. bucket by bucket, each worker's :class:`~compression.hook.HookState` aggregates its copy; the
   i-th collectives of the W workers meet in memory, so every worker ends with the mean;
3. worker 0's result becomes the gradient of the one model, and the one optimizer steps.

BatchNorm running statistics are worker 0's (a DDP job broadcasts rank 0's buffers), and the
statistic Accordion decides on is worker 0's Delta_e (rank 0's). With W = 2 the per-epoch metrics
equal those of a real 2-rank gloo job bit for bit on CPU (tested).

Memory: one model and one optimizer; per worker a copy of its gradient (the buckets, held until
the exchange completes) and its compressor memory (error feedback: one gradient-sized tensor;
PowerSGD: that plus Q; AdaComp: its residue; ``none``: nothing); the all-gather compressors keep
one message buffer per worker and bucket, and each all-gather's W messages are one tensor that
every worker reads (:class:`~compression.comm.SimComm`), not a copy per worker.
"""

# No `from __future__ import annotations`: DDP checks the recording hook's annotations at runtime.
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
from compression.comm import SimComm
from compression.hook import HookState, Probe
from compression.overlap import OverlapProbe
from compression.worker import WorkerState
from core import rng
from core.distributed import DistEnv
from training import buckets

Bucket = tuple[list[nn.Parameter], torch.Tensor, list[torch.Tensor]]  # params, buffer, views
T = TypeVar("T")


class _Recorder:
    """A DDP comm hook's state that keeps a copy of every bucket's local gradients."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []



def _record(state: _Recorder, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """DDP comm hook: keep the bucket (its parameters, a copy of its buffer and the gradients'
    views into the copy); hand it back as it is."""
    buffer = bucket.buffer()
    copy = buffer.clone()
    views = [copy[g.storage_offset() - buffer.storage_offset():][:g.numel()].view_as(g)
             for g in bucket.gradients()]
    state.buckets.append((list(bucket.parameters()), copy, views))
    done: Future[torch.Tensor] = Future()
    done.set_result(buffer)
    return done


class AllWorkers(WorkerState):
    """What the schedulers, the accounting and the checkpoint see of the simulated workers, as
    they see one DDP rank's :class:`~compression.hook.HookState` (the
    :class:`~compression.worker.WorkerState` both implement): worker 0's layers, statistics
    and epoch sums (rank 0 records them, and Accordion decides on rank 0's Delta_e), levels set
    on every worker, and every worker's own state for the checkpoint."""

    def __init__(self, states: list[HookState], rng: "WorkerRNG") -> None:
        self.states, self.rng = states, rng
        self.compressor = states[0].compressor
        self.layers = states[0].layers  # names, shapes, levels (the same on every worker)

    def compressed_layers(self) -> list[str]:
        """The layers the compressor handles (the same on every worker)."""
        return self.states[0].compressed_layers()

    def set_levels(self, levels: dict[str, Any]) -> None:
        """Set the levels on every worker, as every rank of a DDP job does."""
        for state in self.states:
            state.set_levels(levels)

    def add_probe(self, make: Callable[[], Probe]) -> Probe:
        """A probe on every worker, as every rank of a DDP job adds its own (they meet in the
        probe's collectives); worker 0's is returned (rank 0's results are recorded)."""
        return [state.add_probe(make) for state in self.states][0]

    def reset_epoch(self, epoch: int | None = None) -> None:
        """Start every worker's epoch sums."""
        for state in self.states:
            state.reset_epoch(epoch)

    def epoch_stats(self) -> dict[str, float]:
        """Worker 0's epoch metrics (bits it sent, its Delta_e norms, levels)."""
        return self.states[0].epoch_stats()

    def grad_norms(self) -> dict[str, float]:
        """Worker 0's ||Delta_e|| per layer (what every rank of a DDP job decides on)."""
        return self.states[0].grad_norms()

    def nonfinite(self) -> tuple[int, list[str]] | None:
        """Worker 0's first non-finite Delta_e (only worker 0 keeps Delta_e: a non-finite
        gradient elsewhere reaches worker 0 through the mean one step later)."""
        return self.states[0].nonfinite()

    def epoch_state_dict(self) -> list[dict[str, Any]]:
        """Every worker's sums of the epoch so far (a mid-epoch checkpoint's)."""
        return [state.epoch_state_dict() for state in self.states]

    def load_epoch_state_dict(self, saved: list[dict[str, Any]], device: torch.device) -> None:
        """Continue the epoch :meth:`epoch_state_dict` saved."""
        for state, mine in zip(self.states, saved, strict=True):
            state.load_epoch_state_dict(mine, device)

    def rank_states(self) -> list[dict[str, Any]]:
        """Every worker's own state: RNG streams and compressor memories (a rank's part of a
        checkpoint, as :mod:`training.checkpoint` stores it for real ranks)."""
        return [{"rng": rng, "compressor": state.state_dict()}
                for rng, state in zip(self.rng.states, self.states, strict=True)]

    def load_rank_states(self, per_rank: list[dict[str, Any]]) -> None:
        """Restore :meth:`rank_states`."""
        for w, (mine, state) in enumerate(zip(per_rank, self.states, strict=True)):
            self.rng.states[w] = mine["rng"]
            state.load_state_dict(mine["compressor"])


class WorkerRNG:
    """Each worker's Python, NumPy and torch (CPU) RNG states, swapped in while it works."""

    def __init__(self, seeds: list[int]) -> None:
        self.states = []
        for seed in seeds:
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            self.states.append(rng.capture())

    @contextmanager
    def worker(self, w: int) -> Iterator[None]:
        """Inside: worker ``w``'s RNG streams; afterwards, where it left them."""
        rng.restore(self.states[w])
        try:
            yield
        finally:
            self.states[w] = rng.capture()


class SimulatedWorkers:
    """``world_size`` workers of ``model`` under the compressor config ``compressor_cfg``.

    ``tasks[w]`` is worker w's task (data shard and loss, :mod:`training.tasks`), ``seeds[w]``
    the seed rank w would seed its data-side RNG with.

    run.py drives it as it drives one DDP rank (:class:`training.workers.Rank`): ``tasks``,
    ``ddp`` (call forward on it), ``hook_state``, :meth:`step`, :meth:`evaluate`,
    :meth:`mean_loss`.
    """

    def __init__(self, model: nn.Module, compressor_cfg: Any, tasks: list[Any],
                 seeds: list[int], bucket_cap_mb: float,
                 overlap: OverlapProbe | None = None) -> None:
        self.world_size = len(tasks)
        self.model, self.tasks = model, tasks
        self.ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)  # world size 1: real DDP buckets
        buckets.settle(self.ddp, tasks[0])  # the final buckets from the first step on
        self.recorder = _Recorder()
        self.ddp.register_comm_hook(self.recorder, _record)
        compressor = compression.build_compressor(compressor_cfg)  # one, shared by all
        comms = SimComm.group(self.world_size)
        # The top-k overlap (observe.overlap_epochs): every learner joins its gathers, learner
        # 0 measures (it records the metrics, as rank 0 does).
        probes = [overlap if w == 0 or overlap is None else overlap.gather_only()
                  for w in range(self.world_size)]
        self.states = [HookState(compressor, model.named_parameters(), comm=comms[w],
                                 track_norms=w == 0, overlap=probes[w])
                       for w in range(self.world_size)]
        self.rng = WorkerRNG(seeds)
        self.hook_state = AllWorkers(self.states, self.rng)

    # ---- a step --------------------------------------------------------------------------
    def step(self, local_backward: Callable[[int], T]) -> list[T]:
        """One optimizer step's gradients: ``local_backward(w)`` runs worker w's forward and
        backward through :attr:`ddp` (with its RNG streams swapped in); afterwards every
        parameter's ``.grad`` holds the aggregate, as after a DDP job's backward. Returns what
        each worker's ``local_backward`` returned."""
        recorded, results, buffers = [], [], [b.detach().clone() for b in self.model.buffers()]
        for w in range(self.world_size):
            self.recorder.buckets = []
            self.model.zero_grad(set_to_none=True)  # worker w's own gradient
            with self.rng.worker(w):
                results.append(local_backward(w))
            recorded.append(self.recorder.buckets)  # the same buckets for every worker
            if w == 0:
                buffers = [b.detach().clone() for b in self.model.buffers()]
            else:                                   # running statistics: worker 0's
                for b, saved in zip(self.model.buffers(), buffers, strict=True):
                    b.copy_(saved)
        futures = []
        for b in range(len(recorded[0])):           # bucket by bucket, as DDP calls the hook
            for w, state in enumerate(self.states):
                params, buffer, views = recorded[w][b]
                futures.append(state.aggregate([state.name_of(p) for p in params], views,
                                               buffer))
        if not all(f.done() for f in futures):
            raise RuntimeError("simulated workers did not finish the step together")
        for state in self.states:                   # as comm_hook counts a last bucket
            state.stats.step += 1
        for params, _, views in recorded[0]:        # every worker holds the same mean
            torch._foreach_copy_([p.grad for p in params], views)
        return results

    # ---- what run.py's loop needs besides the step ------------------------------------------
    def set_batch_size(self, batch_size: int) -> None:
        """Global batch ``batch_size`` from the next epoch on (each worker its 1/W share)."""
        for task in self.tasks:
            task.set_batch_size(batch_size)

    def evaluate(self) -> dict[str, float]:
        """The test metrics over every worker's test shard, summed in worker order (each shard
        read with its worker's RNG streams, as rank w reads it)."""
        totals = None
        for w, task in enumerate(self.tasks):
            with self.rng.worker(w):
                mine = task.test_totals(self.model)
            totals = mine if totals is None else totals + mine
        return self.tasks[0].test_metrics(totals)

    @staticmethod
    def mean_loss(loss_sum: torch.Tensor, steps: int) -> float:
        """The epoch's mean training loss from each worker's sum over its steps (``loss_sum``:
        one element per worker)."""
        return loss_sum.sum().item() / (steps * len(loss_sum))


def simulated_envs(world_size: int) -> list[DistEnv]:
    """The (rank, world size) every simulated worker sees, as its tasks shard the data."""
    return [DistEnv(w, world_size, 0, "simulated") for w in range(world_size)]
