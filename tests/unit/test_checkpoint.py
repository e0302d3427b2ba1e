"""Checkpoint contents and restore (training/checkpoint.py), in one process (a world-size-1
gloo group): model, optimizer, scheduler history, compressor levels and memories, the RNG
streams, the epoch to resume from. Each rank's own RNG state on 2 ranks is tested in
``tests/ranks/test_glue_ranks.py``; a resumed run end to end in ``tests/e2e/test_resume.py``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn

import compression
import schedulers
from core import rng
from core.errors import ConfigError
from training import checkpoint
from training.simulated import AllWorkers, WorkerRNG


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def parts(seed: int = 0):
    """A model, SGD with momentum, Top-K hook state and an Accordion scheduler."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook_state = compression.HookState(compression.create("topk", ratio=0.5),
                                       model.named_parameters())
    scheduler = schedulers.build(OmegaConf.create({"name": "accordion", "interval": 1}))
    return model, optimizer, hook_state, scheduler


def draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def trained_parts():
    model, optimizer, hook_state, scheduler = parts()
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()  # momentum buffers exist
    hook_state.layers["2.weight"].memory["error"] = torch.arange(18.0).view(3, 6)
    scheduler.start_epoch(0, hook_state)  # epoch 0 is critical: level low (0.99) everywhere
    scheduler.end_epoch(0, {"0.weight": 3.0, "2.weight": 4.0}, 0.1, 0.1)
    hook_state.set_levels({"0.weight": 0.25})
    return model, optimizer, hook_state, scheduler


def test_a_checkpoint_holds_every_part(group, tmp_path):
    cfg = OmegaConf.create({"seed": 7, "name": "${seed}-x"})
    model, optimizer, hook_state, scheduler = trained_parts()
    checkpoint.save(tmp_path / "c.pt", cfg, 3, 12.5, model, optimizer, hook_state, scheduler)
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    assert ckpt["epoch"] == 3 and ckpt["elapsed_s"] == 12.5 and ckpt["world_size"] == 1
    assert ckpt["sampler"] == {"epoch": 3, "seed": 7, "step": 0}  # an epoch-end checkpoint
    assert ckpt["config"] == {"seed": 7, "name": "7-x"}  # resolved
    assert ckpt["scheduler"] == scheduler.state_dict()
    assert len(ckpt["per_rank"]) == 1
    assert set(ckpt["per_rank"][0]) == {"rng", "compressor", "progress"}
    assert ckpt["per_rank"][0]["progress"] is None  # an epoch-end checkpoint
    assert ckpt["per_rank"][0]["compressor"]["layers"]["0.weight"]["level"] == 0.25
    for key, value in model.state_dict().items():
        assert torch.equal(ckpt["model"][key], value)
    assert ckpt["optimizer"]["state"][0]["momentum_buffer"] is not None


def test_load_restores_everything_and_the_rng_streams(group, tmp_path):
    cfg = OmegaConf.create({"seed": 0})
    model, optimizer, hook_state, scheduler = trained_parts()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    checkpoint.save(tmp_path / "c.pt", cfg, 1, 4.0, model, optimizer, hook_state, scheduler)
    after_save = draws()

    fresh = parts(seed=5)  # other weights, no momentum, default levels, empty history
    draws(), draws()  # the streams move on
    epoch, elapsed, progress = checkpoint.load(tmp_path / "c.pt", *fresh)
    assert (epoch, elapsed, progress) == (1, 4.0, None)
    again = draws()
    assert again[:2] == after_save[:2] and torch.equal(again[2], after_save[2])

    f_model, f_optimizer, f_hook, f_scheduler = fresh
    for key, value in model.state_dict().items():
        assert torch.equal(f_model.state_dict()[key], value)
    for a, b in zip(optimizer.state.values(), f_optimizer.state.values(), strict=True):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert f_hook.layers["0.weight"].level == 0.25 and f_hook.layers["2.weight"].level == 0.99
    assert torch.equal(f_hook.layers["2.weight"].memory["error"], torch.arange(18.0).view(3, 6))
    assert f_scheduler.state_dict() == scheduler.state_dict()
    assert f_scheduler.history.norms == [{"0.weight": 3.0, "2.weight": 4.0}]


def test_a_mid_epoch_checkpoint_holds_its_step_and_this_ranks_progress(group, tmp_path):
    model, optimizer, hook_state, scheduler = trained_parts()
    progress = {"step": 5, "loss_sum": torch.tensor(2.5)}
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 4}), 2, 3.0, model, optimizer,
                    hook_state, scheduler, progress)
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    assert (ckpt["format"], ckpt["epoch"], ckpt["step"]) == (checkpoint.FORMAT, 2, 5) == (2, 2, 5)
    assert ckpt["sampler"] == {"epoch": 2, "seed": 4, "step": 5}
    assert ckpt["per_rank"][0]["progress"]["step"] == 5
    epoch, elapsed, restored = checkpoint.load(tmp_path / "c.pt", *parts(seed=5))
    assert (epoch, elapsed, restored["step"]) == (2, 3.0, 5)
    assert torch.equal(restored["loss_sum"], torch.tensor(2.5))
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 4}), 3, 3.0, model, optimizer,
                    hook_state, scheduler)  # at the epoch's end: step 0, no progress
    assert torch.load(tmp_path / "c.pt", weights_only=True)["step"] == 0


def simulated(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, AllWorkers, Any]:
    """Two simulated workers' hook states (Top-K: error memories) behind one model."""
    model, optimizer, _, scheduler = parts(seed)
    states = [compression.HookState(compression.create("topk", ratio=0.5),
                                    model.named_parameters()) for _ in range(2)]
    return model, optimizer, AllWorkers(states, WorkerRNG([seed, seed + 1])), scheduler


def test_simulated_learners_checkpoint_every_workers_state(group, tmp_path):
    model, optimizer, workers, scheduler = simulated(0)
    for w, state in enumerate(workers.states):
        state.layers["2.weight"].memory["error"] = torch.full((3, 6), float(w + 1))
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 0}), 3, 6.0, model, optimizer,
                    workers, scheduler)
    assert torch.load(tmp_path / "c.pt", weights_only=True)["world_size"] == 2
    *_, fresh, _ = restored = simulated(9)
    assert checkpoint.load(tmp_path / "c.pt", *restored) == (3, 6.0, None)
    for w, state in enumerate(fresh.states):
        assert torch.equal(state.layers["2.weight"].memory["error"],
                           torch.full((3, 6), float(w + 1)))
        assert torch.equal(fresh.rng.states[w]["torch"], workers.rng.states[w]["torch"])
        assert fresh.rng.states[w]["python"] == workers.rng.states[w]["python"]
    # mid-epoch: the process's progress travels with worker 0's part, and comes back
    progress = {"step": 1, "loss_sum": torch.tensor([0.5, 0.25]), "carry": [None, None]}
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 0}), 3, 6.0, model,
                    optimizer, workers, scheduler, progress)
    assert torch.load(tmp_path / "c.pt", weights_only=True)["step"] == 1
    _, _, saved = checkpoint.load(tmp_path / "c.pt", *simulated(9))
    assert saved["step"] == 1 and torch.equal(saved["loss_sum"], progress["loss_sum"])


def test_the_checkpoint_does_not_change_with_later_training(group, tmp_path):
    model, optimizer, hook_state, scheduler = trained_parts()
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 0}), 1, 0.0, model, optimizer,
                    hook_state, scheduler)
    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    hook_state.layers["2.weight"].memory["error"].add_(1)
    assert torch.equal(saved["per_rank"][0]["compressor"]["layers"]["2.weight"]["memory"]["error"],
                       torch.arange(18.0).view(3, 6))


def test_another_world_size_is_refused(group, tmp_path):
    model, optimizer, hook_state, scheduler = trained_parts()
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 0}), 1, 0.0, model, optimizer,
                    hook_state, scheduler)
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    ckpt["world_size"] = 4
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError) as info:  # checked before any process group starts
        checkpoint.check_resumable(tmp_path, OmegaConf.create({"seed": 0}), 1)
    assert str(info.value) == f"resume: {tmp_path / 'checkpoint.pt'} was written by 4 ranks; " \
                              f"resume it with the same number, not 1"


def test_nested_tensors_are_mapped_in_dicts_lists_and_tuples():
    nested = {"a": [torch.ones(1), (torch.zeros(2), 3)], "b": "x"}
    doubled = checkpoint._map_tensors(nested, lambda t: t + 1)
    assert torch.equal(doubled["a"][0], torch.full((1,), 2.0))
    assert isinstance(doubled["a"][1], tuple) and torch.equal(doubled["a"][1][0], torch.ones(2))
    assert doubled["a"][1][1] == 3 and doubled["b"] == "x"
    grad = torch.ones(2, requires_grad=True) * 2
    (cpu,) = checkpoint._to_cpu([grad])
    assert not cpu.requires_grad and cpu.device.type == "cpu"


# ---- seeding -------------------------------------------------------------------------------------
@pytest.fixture
def determinism() -> Iterator[None]:
    """Leave torch's global determinism flags as they were."""
    flags = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:]


def test_rank_seed_is_the_seed_times_1000_plus_the_rank():
    assert [rng.rank_seed(s, r) for s, r in [(0, 0), (0, 3), (2, 1), ("5", 0)]] == \
        [0, 3, 2001, 5000]


@pytest.mark.parametrize("deterministic", [True, False])
def test_seed_everything_seeds_each_stream_with_the_ranks_seed(determinism, deterministic):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    rng.seed_everything(2, rank=1, deterministic=deterministic)
    assert random.random() == random.Random(2001).random()
    assert np.random.rand() == np.random.RandomState(2001).rand()
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(2001)))
    assert torch.are_deterministic_algorithms_enabled() is deterministic
    assert torch.is_deterministic_algorithms_warn_only_enabled() is deterministic
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == \
        (deterministic, not deterministic)


# ---- a mid-epoch checkpoint's progress, round trip (seconds, not an end-to-end run) -----------
class _Carrying:
    """A task that carries a tensor from step to step (as an LSTM's hidden state)."""

    def __init__(self, carry: object = None) -> None:
        self._carry = carry

    def carry(self) -> object:
        return self._carry

    def set_carry(self, carry: object) -> None:
        self._carry = carry


def test_the_epoch_progress_comes_back_from_a_mid_epoch_checkpoint(group, tmp_path):
    from training.progress import EpochProgress

    model, optimizer, hook_state, scheduler = trained_parts()
    hook_state.reset_epoch(2)
    model(torch.randn(5, 4)).sum().backward()
    sums = hook_state.stats
    sums.accumulate(["2.weight"], [model[2].weight.grad])  # Delta_e of a step so far
    sums.bits, sums.step, sums.chosen = 96, 3, {"2.weight": [5, 18]}
    progress = EpochProgress(2, torch.device("cpu"), step=3, samples=15,
                             loss_sum=torch.tensor([4.5], dtype=torch.float64), seconds=2.0)
    tasks = [_Carrying((torch.ones(2), torch.zeros(2)))]
    checkpoint.save(tmp_path / "c.pt", OmegaConf.create({"seed": 0}), 2, 9.0, model, optimizer,
                    hook_state, scheduler, progress.state_dict(hook_state, tasks))
    *_, fresh, _ = restored = parts(5)
    epoch, _, saved = checkpoint.load(tmp_path / "c.pt", *restored)
    fresh.reset_epoch(epoch)
    again_tasks = [_Carrying()]
    again = EpochProgress.resume(saved, fresh, again_tasks, torch.device("cpu"))
    assert (again.epoch, again.step, again.samples) == (2, 3, 15)
    assert again.loss_sum.tolist() == [4.5] and again.seconds() >= 2.0
    assert (fresh.stats.bits, fresh.stats.step, fresh.stats.chosen) == \
        (96, 3, {"2.weight": [5, 18]})
    assert torch.equal(fresh.stats.grad_sums["2.weight"], sums.grad_sums["2.weight"])
    assert all(torch.equal(a, b) for a, b in zip(again_tasks[0].carry(), tasks[0].carry(),
                                                 strict=True))
