"""The pieces of a mid-epoch resume, in process: an epoch's batches from a step on, the global
RNG untouched by starting them, the LSTM's carry, the hook's epoch sums, and the ranks' agreement
on when to stop (2 real gloo ranks, real signals). End to end: tests/e2e/test_preemption_e2e.py."""

from __future__ import annotations

import os
import signal

import torch
from omegaconf import OmegaConf
from torch.utils.data import TensorDataset

import compression
from benchmarks.ranks import run_ranks
from core.distributed import DistEnv
from data import DataBundle
from jobs import signals
from training.tasks import Classification, LanguageModel

ENV = DistEnv(rank=1, world_size=2, local_rank=1, launcher="torchrun")


def classification() -> Classification:
    x, y = torch.arange(64.0).view(64, 1), torch.arange(64) % 3
    bundle = DataBundle("classification", 3, TensorDataset(x, y), TensorDataset(x, y))
    return Classification(bundle, ENV, batch_size=8, eval_batch_size=8, num_workers=0, seed=5,
                          device=torch.device("cpu"))


def test_an_epoch_resumes_at_its_step_without_touching_the_global_rng():
    task = classification()
    whole = [b[0].flatten().tolist() for b in task.batches(3)]
    assert len(whole) == task.steps_per_epoch() == 8
    state = torch.get_rng_state()
    rest = [b[0].flatten().tolist() for b in task.batches(3, start=5)]
    assert rest == whole[5:]
    # Starting the epoch's loader draws nothing from the RNG a checkpoint restores.
    assert torch.equal(torch.get_rng_state(), state)
    assert [b[0].flatten().tolist() for b in task.batches(3)] == whole  # the next epoch: all


def test_a_language_model_epoch_resumes_with_its_hidden_state():
    stream = torch.arange(200) % 17
    task = LanguageModel(DataBundle("language_model", 17, stream, stream), ENV, batch_size=4,
                         eval_batch_size=2, bptt=5, device=torch.device("cpu"))
    windows = [x.tolist() for x, _ in task.batches(0)]
    task.hidden = (torch.ones(1, 2, 3), torch.zeros(1, 2, 3))
    carry = task.carry()
    task.hidden = None
    task.set_carry(carry)
    resumed = task.batches(0, start=4)
    assert [x.tolist() for x, _ in resumed] == windows[4:]
    assert torch.equal(task.hidden[0], torch.ones(1, 2, 3))  # kept: not a new epoch
    list(task.batches(1))
    assert task.hidden is None  # a new epoch starts afresh


def _hook_round_trip(rank: int, world_size: int) -> bool:
    model = torch.nn.Linear(4, 3)
    state = compression.build(OmegaConf.create({"name": "none"}), model.named_parameters())
    sums = state.stats
    sums.grad_sums = {"weight": torch.randn(3, 4)}
    sums.bits, sums.wire_bits, sums.bits_dense, sums.step = 10, 12, 320, 3
    sums.type_bits["fc"], sums.chosen = 7, {"weight": [2, 12]}
    sums.timer.seconds = 0.25
    saved = state.epoch_state_dict()
    stats = state.epoch_stats()
    state.reset_epoch()
    changed = state.epoch_stats() != stats
    state.load_epoch_state_dict(saved, torch.device("cpu"))
    return changed and state.epoch_stats() == stats and sums.step == 3


def _agree(rank: int, world_size: int) -> tuple[list[int], bool]:
    signals.defer(["SIGUSR1", "SIGTERM"])
    try:
        check = signals.StopCheck(every=2, enabled=True)
        seen = []
        for step in range(1, 9):
            if rank == 1 and step == 3:  # only rank 1 hears it, between two checks
                os.kill(os.getpid(), signal.SIGUSR1)
            seen.append(check.due(step))
        return seen, _hook_round_trip(rank, world_size)
    finally:
        signals.undefer()


def test_the_ranks_agree_on_the_step_to_stop_at_and_the_hooks_sums_survive():
    # Rank 1 got SIGUSR1 before step 3; both stop at the next check (step 4), rank 0 included.
    # (The same ranks check that the hook's epoch sums come back whole from a checkpoint.)
    stop = int(signal.SIGUSR1)
    assert run_ranks(_agree, 2, timeout_s=900) == [([0, 0, 0, stop, 0, stop, 0, stop], True)] * 2
