"""What one training step and one evaluation mean for each kind of dataset.

- :class:`Classification`: map-style ``(input, label)`` datasets, a ``DistributedSampler`` that
  reshuffles every epoch (``set_epoch``), cross-entropy, test accuracy in %.
- :class:`LanguageModel`: a token stream cut into one contiguous shard per rank, batchified into
  ``batch`` columns and read in BPTT windows; the LSTM's hidden state is carried (detached) from
  window to window within an epoch; test perplexity = exp(mean cross-entropy per token).

Evaluation shards the test set over the ranks without padding and sums losses with one
all-reduce, so the number is exact for any world size.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset, default_collate

from core.distributed import DistEnv
from core.errors import ConfigError
from data import DataBundle


class Task:
    """What every task shares: an evaluation over the whole test set, summed over ranks."""

    def carry(self) -> Any:
        """What this rank carries from one training step to the next within an epoch (saved
        in a mid-epoch checkpoint); None if nothing."""
        return None

    def set_carry(self, carry: Any) -> None:
        """Continue an epoch with the :meth:`carry` saved part-way through it."""

    def probe_batch(self) -> Any:
        """A small batch of this rank's test shard, read without randomness: what
        :func:`training.buckets.settle` runs one backward on."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """The test metrics of ``model`` over every rank's shard (one all-reduce)."""
        totals = self.test_totals(model)
        dist.all_reduce(totals)
        return self.test_metrics(totals)

    def test_totals(self, model: nn.Module) -> torch.Tensor:
        """This rank's shard's sums (float64), which add up over ranks."""
        raise NotImplementedError

    @staticmethod
    def test_metrics(totals: torch.Tensor) -> dict[str, float]:
        """The metrics from the totals of every shard."""
        raise NotImplementedError


class Classification(Task):
    """Image (or any tensor) classification."""

    metric = "test/accuracy"

    def __init__(self, bundle: DataBundle, env: DistEnv, batch_size: int, eval_batch_size: int,
                 num_workers: int | None, seed: int, device: torch.device) -> None:
        self.env, self.device = env, device
        self.num_workers = data_workers(num_workers, device, env)
        self.train = bundle.train
        self.sampler = _ResumableSampler(bundle.train, env.world_size, env.rank, shuffle=True,
                                         seed=seed, drop_last=True)
        # The loader's own generator (not the global one) draws its workers' base seed, so that
        # starting an epoch's batches takes nothing from the RNG state a checkpoint restores.
        self.loader_rng = torch.Generator().manual_seed(seed * 1000 + env.rank)
        self.batch_size = 0
        self.set_batch_size(batch_size)
        shard = Subset(bundle.test, range(env.rank, len(bundle.test), env.world_size))
        self.test_loader = DataLoader(shard, eval_batch_size, num_workers=self.num_workers,
                                      pin_memory=device.type == "cuda",
                                      persistent_workers=self.num_workers > 0,
                                      multiprocessing_context=worker_start(device,
                                                                           self.num_workers))

    def set_batch_size(self, batch_size: int) -> None:
        """Use global batch ``batch_size`` from the next epoch on (rebuilds the loader)."""
        if batch_size == self.batch_size:
            return
        _check_examples(len(self.train), batch_size, "trainer.batch_size")  # type: ignore[arg-type]
        self.batch_size = batch_size
        self.train_loader = DataLoader(self.train, batch_size // self.env.world_size,
                                       sampler=self.sampler, num_workers=self.num_workers,
                                       drop_last=True, pin_memory=self.device.type == "cuda",
                                       persistent_workers=self.num_workers > 0,
                                       multiprocessing_context=worker_start(
                                           self.device, self.num_workers),
                                       generator=self.loader_rng)

    def probe_batch(self) -> Any:
        """The first (at most) 2 examples of this rank's test shard, collated."""
        shard = self.test_loader.dataset
        return default_collate([shard[i] for i in range(min(2, len(shard)))])

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (the same on every rank)."""
        return len(self.train_loader)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """This rank's training batches of ``epoch``, from its ``start``-th step on (the
        earlier ones are not loaded)."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = start * (self.batch_size // self.env.world_size)
        yield from self.train_loader

    @staticmethod
    def size(batch: Any) -> int:
        """Examples in a batch."""
        return len(batch[1])

    @staticmethod
    def split(batch: Any, micro_batch_size: int | None) -> list[Any]:
        """Micro-batches of at most ``micro_batch_size`` examples (gradient accumulation)."""
        if micro_batch_size is None or len(batch[1]) <= micro_batch_size:
            return [batch]
        x, y = batch
        return list(zip(x.split(micro_batch_size), y.split(micro_batch_size), strict=True))

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """Mean loss over the batch and the number of examples in it."""
        x, y = (t.to(self.device, non_blocking=True) for t in batch)
        return F.cross_entropy(model(x), y), len(y)

    @torch.no_grad()
    def test_totals(self, model: nn.Module) -> torch.Tensor:
        """This rank's shard of the test set: summed loss, correct predictions, examples."""
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for x, y in self.test_loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            logits = model(x)
            totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
            totals[1] += (logits.argmax(1) == y).sum()
            totals[2] += len(y)
        model.train()
        return totals

    @staticmethod
    def test_metrics(totals: torch.Tensor) -> dict[str, float]:
        """``test/loss`` and ``test/accuracy`` (%) from the totals of every shard."""
        loss, correct, n = totals.tolist()
        return {"test/loss": loss / n, "test/accuracy": 100.0 * correct / n}


class LanguageModel(Task):
    """Word- or character-level language modelling with truncated BPTT."""

    metric = "test/perplexity"

    def __init__(self, bundle: DataBundle, env: DistEnv, batch_size: int, eval_batch_size: int,
                 bptt: int, device: torch.device) -> None:
        self.env, self.device, self.bptt = env, device, bptt
        self.stream = _shard(bundle.train, env)
        self.batch_size = 0
        self.set_batch_size(batch_size)
        self.test = self._batchify(_shard(bundle.test, env), eval_batch_size,
                                   "trainer.eval_batch_size")
        self.hidden: Any = None

    def set_batch_size(self, batch_size: int) -> None:
        """Use ``batch_size`` parallel sequences (over all ranks) from the next epoch on."""
        if batch_size != self.batch_size:
            self.batch_size = batch_size
            self.train = self._batchify(self.stream, batch_size // self.env.world_size,
                                        "trainer.batch_size")

    def _batchify(self, stream: torch.Tensor, columns: int, field: str) -> torch.Tensor:
        _check_columns(len(stream), columns, field)
        rows = len(stream) // columns
        # Standard recipe: drop the tail, lay the stream out as `columns` parallel sequences.
        return stream[: rows * columns].view(columns, rows).to(self.device)

    def probe_batch(self) -> Any:
        """The first BPTT window of this rank's test stream."""
        return next(_windows(self.test, self.bptt))

    def steps_per_epoch(self) -> int:
        """BPTT windows per epoch."""
        return math.ceil((self.train.size(1) - 1) / self.bptt)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """Consecutive BPTT windows (input, target) from the ``start``-th on; the hidden state
        restarts every epoch (a resumed epoch continues with its :meth:`carry`)."""
        if start == 0:
            self.hidden = None
        yield from itertools.islice(_windows(self.train, self.bptt), start, None)

    def carry(self) -> Any:
        """The LSTM's hidden state after the last window (on the CPU)."""
        return None if self.hidden is None else _map(self.hidden, lambda h: h.cpu().clone())

    def set_carry(self, carry: Any) -> None:
        """Continue from a saved hidden state."""
        self.hidden = None if carry is None else _map(carry, lambda h: h.to(self.device))

    @staticmethod
    def size(batch: Any) -> int:
        """Target tokens in a window."""
        return batch[1].numel()

    @staticmethod
    def split(batch: Any, micro_batch_size: int | None) -> list[Any]:
        """No accumulation for language models: the hidden state spans the whole window batch."""
        return [batch]

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """Mean cross-entropy per token of one window; carries the hidden state (detached)."""
        x, y = batch
        logits, hidden = model(x, self.hidden)
        self.hidden = _detach(hidden)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)), y.numel()

    @torch.no_grad()
    def test_totals(self, model: nn.Module) -> torch.Tensor:
        """This rank's shard of the test stream: summed cross-entropy and tokens."""
        model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        hidden = None
        for x, y in _windows(self.test, self.bptt):
            logits, hidden = model(x, hidden)
            totals[0] += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                         reduction="sum").double()
            totals[1] += y.numel()
        model.train()
        return totals

    @staticmethod
    def test_metrics(totals: torch.Tensor) -> dict[str, float]:
        """``test/loss`` per token and ``test/perplexity`` from the totals of every shard."""
        loss = totals[0].item() / totals[1].item()
        return {"test/loss": loss, "test/perplexity": math.exp(min(loss, 700.0))}


class FixedBatch(Task):
    """Cross-entropy on one fixed batch ``(x, y)``: the least of a task, for code that drives
    DDP itself (benchmarks, tests) and needs :func:`training.buckets.settle`'s probe."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def probe_batch(self) -> Any:
        """The batch itself."""
        return self.x, self.y

    @staticmethod
    def loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """Mean cross-entropy over the batch and its size."""
        x, y = batch
        return F.cross_entropy(model(x), y), len(y)


def check_batches(bundle: DataBundle, batch_sizes: dict[str, int], eval_batch_size: int,
                  world_size: int) -> None:
    """ConfigError naming the field if a global batch the run may use (``batch_sizes``: field
    to size) or the per-rank evaluation batch does not fit the data: checked before the process
    group starts, not when a scheduler first switches to the batch."""
    if bundle.task == "language_model":
        train, test = len(bundle.train) // world_size, len(bundle.test) // world_size
        for field, size in batch_sizes.items():
            _check_columns(train, size // world_size, field)
        _check_columns(test, eval_batch_size, "trainer.eval_batch_size")
        return
    for field, size in batch_sizes.items():
        _check_examples(len(bundle.train), size, field)  # type: ignore[arg-type]


def _check_examples(examples: int, batch_size: int, field: str) -> None:
    if examples < batch_size:
        raise ConfigError(f"{field}: {batch_size} is larger than the training set ({examples} "
                          f"examples)")


def _check_columns(tokens: int, columns: int, field: str) -> None:
    if tokens // columns < 2:
        raise ConfigError(f"{field}: {columns} sequences per rank leave fewer than 2 tokens per "
                          f"sequence of a {tokens}-token shard")


def data_workers(requested: int | None, device: torch.device, env: DistEnv,
                 environ: Mapping[str, str] = os.environ) -> int:
    """DataLoader worker processes per rank for ``trainer.num_workers`` (``requested``).

    A number is taken as it is. null (the default): none on the CPU, where the ranks' own
    compute takes the cores (and a run is bit for bit what it was without workers), nor for
    simulated learners (W loaders in one process); on a GPU, every CPU this rank has but one,
    which the training process keeps: :func:`rank_cpus`.
    """
    if requested is not None:
        return int(requested)
    if device.type != "cuda" or env.launcher == "simulated":
        return 0
    return max(rank_cpus(environ) - 1, 0)


def worker_start(device: torch.device, workers: int) -> str | None:
    """How a loader's worker processes start: ``forkserver`` beside a CUDA device, else the
    platform's default (fork on Linux).

    PyTorch's multiprocessing notes: "The CUDA runtime does not support the fork start method;
    either the spawn or forkserver start method are required to use CUDA in subprocesses". A
    forked worker holds the parent's CUDA tensors, and freeing one there (its garbage collector)
    aborts it: on an H200, every run with workers stopped at its first evaluation with "CUDA
    error: initialization error" (results/bench/smoke_gpu.md). A forkserver's workers are forked
    from a fresh process, and get the dataset pickled (tensors through shared memory).
    """
    return "forkserver" if workers > 0 and device.type == "cuda" else None


def rank_cpus(environ: Mapping[str, str] = os.environ) -> int:
    """The CPUs one rank of this job may use: Slurm's ``--cpus-per-task``
    (``SLURM_CPUS_PER_TASK``, which ``cpus_per_task`` in conf/launcher/slurm.yaml sets), else
    the CPUs this process may run on (``os.sched_getaffinity``) shared by the ranks started on
    this node together (torchrun's ``LOCAL_WORLD_SIZE``, submitit's local ``tasks_per_node``).
    """
    if environ.get("SLURM_CPUS_PER_TASK"):
        return int(environ["SLURM_CPUS_PER_TASK"])
    local_ranks = int(environ.get("LOCAL_WORLD_SIZE") or environ.get("SUBMITIT_LOCAL_NTASKS")
                      or 1)
    return max(len(os.sched_getaffinity(0)) // local_ranks, 1)


def make_task(bundle: DataBundle, env: DistEnv, cfg: Any, device: torch.device
              ) -> Classification | LanguageModel:
    """The task object for ``bundle.task``."""
    t = cfg.trainer
    if bundle.task == "language_model":
        return LanguageModel(bundle, env, t.batch_size, t.eval_batch_size,
                             int(cfg.dataset.bptt), device)
    return Classification(bundle, env, t.batch_size, t.eval_batch_size, t.num_workers, cfg.seed,
                          device)


def _shard(stream: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Rank r's contiguous 1/world_size of a token stream."""
    size = len(stream) // env.world_size
    return stream[env.rank * size:(env.rank + 1) * size]


def _windows(data: torch.Tensor, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input, target) windows of at most ``bptt`` tokens, batch-first."""
    for i in range(0, data.size(1) - 1, bptt):
        n = min(bptt, data.size(1) - 1 - i)
        yield data[:, i:i + n], data[:, i + 1:i + 1 + n]


def _detach(hidden: Any) -> Any:
    return _map(hidden, torch.Tensor.detach)


def _map(hidden: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor of a hidden state (a tensor or nested tuples of them)."""
    if isinstance(hidden, torch.Tensor):
        return fn(hidden)
    return tuple(_map(h, fn) for h in hidden)


class _ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` whose epoch can start part-way: it skips the first ``start``
    indices of the rank's share (its length stays the whole epoch's)."""

    start = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)
