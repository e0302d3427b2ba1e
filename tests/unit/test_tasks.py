"""What a training step and an evaluation mean (training/tasks.py): the sampler's shards and
epochs, micro-batches, token shards, batchify, BPTT windows, the carried hidden state, and
evaluations against sums computed here.

In one process: sampling needs no process group; ``evaluate`` runs on a world-size-1 gloo
group. The same evaluation over 2 ranks is in ``tests/ranks/test_glue_ranks.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from core.distributed import DistEnv
from core.errors import ConfigError
from data import DataBundle
from training import tasks
from training.tasks import (
    Classification,
    LanguageModel,
    _shard,
    _windows,
    check_batches,
    data_workers,
    make_task,
    rank_cpus,
)

CPU = torch.device("cpu")


def env(rank: int = 0, world: int = 1) -> DistEnv:
    return DistEnv(rank, world, rank, "single" if world == 1 else "torchrun")


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def images(n: int, seed: int = 0) -> TensorDataset:
    """``n`` examples whose input holds its own index (so a batch says which examples it has)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen)
    x[:, 0] = torch.arange(n, dtype=torch.float32)
    return TensorDataset(x, torch.randint(0, 4, (n,), generator=gen))


def classification(n_train: int = 20, n_test: int = 7, rank: int = 0, world: int = 1,
                   batch_size: int = 4, eval_batch_size: int = 3, seed: int = 0
                   ) -> Classification:
    bundle = DataBundle("classification", 4, images(n_train), images(n_test, seed=1))
    return Classification(bundle, env(rank, world), batch_size, eval_batch_size, 0, seed, CPU)


def ids(batches) -> list[list[int]]:
    return [x[:, 0].long().tolist() for x, _ in batches]


# ---- classification: sampling ----------------------------------------------------------------
def test_ranks_get_disjoint_shards_that_cover_the_epoch():
    per_rank = [ids(classification(rank=r, world=2, batch_size=4).batches(0)) for r in range(2)]
    assert all(len(b) == 2 for batches in per_rank for b in batches)  # 4 / 2 ranks per step
    assert [len(batches) for batches in per_rank] == [5, 5]
    seen = [i for batches in per_rank for b in batches for i in b]
    assert sorted(seen) == list(range(20))


def test_every_epoch_reshuffles_and_a_restart_repeats_it():
    task = classification(batch_size=5)
    epochs = [ids(task.batches(e)) for e in range(3)]
    assert len({str(e) for e in epochs}) == 3  # three different orders
    assert all(sorted(i for b in e for i in b) == list(range(20)) for e in epochs)
    # a resumed run (a new task object) gets the same order for the same epoch
    assert ids(classification(batch_size=5).batches(2)) == epochs[2]
    assert ids(classification(batch_size=5, seed=1).batches(2)) != epochs[2]  # the seed matters


def test_batch_size_is_global_and_drops_the_last_partial_batch():
    task = classification(n_train=22, world=2, batch_size=8)
    assert task.steps_per_epoch() == len(list(task.batches(0))) == 2  # 11 per rank, 4 a step
    assert all(len(b) == 4 for b in ids(task.batches(0)))
    task.set_batch_size(4)
    assert task.batch_size == 4 and task.steps_per_epoch() == 5
    with pytest.raises(ConfigError) as info:
        task.set_batch_size(24)
    assert str(info.value) == "trainer.batch_size: 24 is larger than the training set (22 " \
                              "examples)"
    assert task.batch_size == 4


def test_micro_batches_split_a_batch_in_order():
    x, y = torch.arange(10.0).view(5, 2), torch.arange(5)
    assert Classification.split((x, y), None)[0] is not None
    assert len(Classification.split((x, y), None)) == 1
    assert len(Classification.split((x, y), 5)) == 1
    parts = Classification.split((x, y), 2)
    assert [p[1].tolist() for p in parts] == [[0, 1], [2, 3], [4]]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert Classification.size((x, y)) == 5


def test_an_uneven_epoch_drops_examples_rather_than_repeating_them():
    # 21 examples over 2 ranks: 10 each, no example padded in twice (DistributedSampler's
    # drop_last=False would give each rank 11, one of them a repeat)
    per_rank = [ids(classification(n_train=21, rank=r, world=2, batch_size=2).batches(0))
                for r in range(2)]
    seen = [i for batches in per_rank for b in batches for i in b]
    assert [len(batches) for batches in per_rank] == [10, 10]
    assert len(seen) == len(set(seen)) == 20


def test_a_batch_of_one_example_or_of_the_whole_training_set():
    one = classification(n_train=20, batch_size=1)
    assert one.steps_per_epoch() == 20 and all(len(b) == 1 for b in ids(one.batches(0)))
    whole = classification(n_train=20, batch_size=20)
    assert [sorted(b) for b in ids(whole.batches(0))] == [list(range(20))]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_loaders_use_the_configured_workers_and_pin_memory_only_for_cuda(device):
    # a task is built without touching the device: a CUDA one can be built here
    bundle = DataBundle("classification", 4, images(20), images(7, seed=1))
    task = Classification(bundle, env(), 4, 3, 1, 0, torch.device(device))
    for batch_size in (4, 5):  # the loader set_batch_size rebuilds keeps them
        task.set_batch_size(batch_size)
        for loader in (task.train_loader, task.test_loader):
            assert loader.num_workers == 1 and loader.pin_memory is (device == "cuda")
            assert loader.persistent_workers is True  # workers kept across epochs
            start = loader.multiprocessing_context  # CUDA: never fork (training/tasks.py)
            assert (start.get_start_method() if start else None) == (
                "forkserver" if device == "cuda" else None)
    if device == "cpu":  # a worker process yields the batches the main process would
        assert ids(task.batches(0)) == ids(classification(batch_size=5).batches(0))
    assert classification().train_loader.persistent_workers is False  # no workers to keep


@pytest.mark.slow  # ~3 s: a forkserver and its worker start
def test_workers_started_as_beside_a_gpu_yield_the_main_processes_batches(monkeypatch):
    # the loaders a CUDA rank makes (workers from a forkserver, the dataset pickled to them),
    # here on the CPU: the same batches, epoch after epoch, and the same evaluation
    monkeypatch.setattr(tasks, "worker_start", lambda device, n: "forkserver" if n else None)
    bundle = DataBundle("classification", 4, images(20), images(7, seed=1))
    task = Classification(bundle, env(), 4, 3, 1, 0, CPU)
    plain = classification()
    for epoch in (0, 1):
        assert ids(task.batches(epoch)) == ids(plain.batches(epoch))
    assert ids(task.test_loader) == ids(plain.test_loader)


# ---- data-loading workers (trainer.num_workers: null by default) ------------------------------
NODE = len(os.sched_getaffinity(0))  # the CPUs this process may run on


@pytest.mark.parametrize(("environ", "cpus"), [
    ({"SLURM_CPUS_PER_TASK": "8"}, 8),                          # Slurm's cpus_per_task
    ({"SLURM_CPUS_PER_TASK": "8", "LOCAL_WORLD_SIZE": "4"}, 8),  # are the task's own
    ({}, NODE),
    ({"LOCAL_WORLD_SIZE": "2"}, max(NODE // 2, 1)),            # torchrun's ranks share them
    ({"SUBMITIT_LOCAL_NTASKS": "3"}, max(NODE // 3, 1)),       # and submitit's local tasks
    ({"LOCAL_WORLD_SIZE": str(NODE + 1)}, 1),
])
def test_a_rank_has_its_tasks_cpus_or_its_share_of_the_node(environ, cpus):
    assert rank_cpus(environ) == cpus


def test_data_workers_are_none_on_cpu_and_the_ranks_cpus_but_one_on_a_gpu():
    gpu, slurm = torch.device("cuda", 0), {"SLURM_CPUS_PER_TASK": "8"}
    assert data_workers(None, gpu, env(), slurm) == 7
    assert data_workers(None, gpu, env(), {"SLURM_CPUS_PER_TASK": "1"}) == 0
    assert data_workers(None, CPU, env(), slurm) == 0  # the CPU ranks compute on the cores
    assert data_workers(None, gpu, DistEnv(0, 64, 0, "simulated"), slurm) == 0  # 64 loaders
    assert data_workers(3, gpu, env(), slurm) == 3 and data_workers(0, gpu, env(), slurm) == 0
    assert data_workers(2, CPU, env(), slurm) == 2


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_default_config_loads_data_with_the_ranks_cpus(compose_cfg, monkeypatch, device):
    # a task is built without touching the device: a CUDA one can be built here
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    cfg = compose_cfg("trainer.batch_size=4")
    assert cfg.trainer.num_workers is None
    task = make_task(DataBundle("classification", 4, images(20), images(7)), env(), cfg,
                     torch.device(device))
    workers = 2 if device == "cuda" else 0
    for loader in (task.train_loader, task.test_loader):
        assert loader.num_workers == workers and loader.pin_memory is (device == "cuda")


@pytest.mark.slow  # ~5 s: the first computation on the meta device imports torch._dynamo
def test_a_batch_moves_to_the_task_device():
    # the meta device stands in for an accelerator: an input left on the CPU fails there
    meta = torch.device("meta")
    bundle = DataBundle("classification", 4, images(20), images(7, seed=1))
    task = Classification(bundle, env(), 4, 3, 0, 0, meta)
    loss, n = task.loss(nn.Linear(3, 4).to(meta), next(iter(task.batches(0))))
    assert loss.device == meta and n == 4


def test_token_streams_live_on_the_task_device():
    meta = torch.device("meta")  # stands in for an accelerator
    bundle = DataBundle("language_model", 10, torch.arange(50) % 10, torch.arange(21) % 10)
    task = LanguageModel(bundle, env(), 4, 2, 3, meta)
    assert task.train.device == task.test.device == meta


def test_classification_loss_is_the_mean_cross_entropy():
    task = classification()
    model = nn.Linear(3, 4)
    x, y = next(iter(task.batches(0)))
    loss, n = task.loss(model, (x, y))
    assert n == 4
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y))


# ---- classification: evaluation ----------------------------------------------------------------
def test_classification_evaluate_is_exact_over_the_whole_test_set(group):
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    task = classification(n_test=7, eval_batch_size=3)
    model.train()
    result = task.evaluate(model)
    assert model.training  # back to training mode afterwards
    x, y = images(7, seed=1).tensors
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits.double(), y, reduction="sum").item() / 7
    correct = (logits.argmax(1) == y).sum().item()
    assert result == {"test/loss": pytest.approx(loss, rel=1e-6),
                      "test/accuracy": pytest.approx(100.0 * correct / 7, rel=1e-12)}
    assert 0 < correct < 7  # a meaningful accuracy


def test_evaluate_runs_in_eval_mode(group):
    # BatchNorm in eval mode uses its running statistics: the result must match them
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 4))
    model[0].running_mean.fill_(5.0)
    task = classification(n_test=7)
    result = task.evaluate(model)
    x, y = images(7, seed=1).tensors
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(x).double(), y).item()
    assert result["test/loss"] == pytest.approx(loss, rel=1e-6)


def test_each_rank_evaluates_its_own_examples():
    shards = [classification(n_test=7, rank=r, world=3).test_loader for r in range(3)]
    got = [sorted(i for x, _ in loader for i in x[:, 0].long().tolist()) for loader in shards]
    assert got == [[0, 3, 6], [1, 4], [2, 5]]  # no padding, no repeats


class Lookup(nn.Module):
    """A classifier that predicts ``predictions[i]`` for example ``i`` (its input's first entry)."""

    def __init__(self, predictions: torch.Tensor) -> None:
        super().__init__()
        self.predictions = predictions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3.0 * F.one_hot(self.predictions[x[:, 0].long()], 4).float()


def test_accuracy_counts_the_correct_examples_of_every_batch(group):
    # 7 test examples in batches of 3, 3, 1; right on examples 0, 1 and 4 (both first batches)
    y = images(7, seed=1).tensors[1]
    right = torch.tensor([1, 1, 0, 0, 1, 0, 0], dtype=torch.bool)
    model = Lookup(torch.where(right, y, (y + 1) % 4))
    result = classification(n_test=7, eval_batch_size=3).evaluate(model)
    assert result["test/accuracy"] == pytest.approx(100.0 * 3 / 7, rel=1e-12)
    # cross-entropy of logits (3, 0, 0, 0): log(e^3 + 3) - 3 on the right class, log(e^3 + 3)
    # on a wrong one
    assert result["test/loss"] == pytest.approx((7 * math.log(math.exp(3.0) + 3) - 3 * 3.0) / 7,
                                                rel=1e-6)


def test_evaluation_sums_losses_in_float64(group):
    # losses in the thousands: a float32 sum would round away their last digits
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    with torch.no_grad():
        model.weight.mul_(1000.0)
    x, y = images(7, seed=1).tensors
    with torch.no_grad():  # per batch as the loader gives them, in float32; summed in float64
        sums = [F.cross_entropy(model(x[i:i + 3]), y[i:i + 3], reduction="sum").item()
                for i in range(0, 7, 3)]
    assert min(sums) > 50
    result = classification(n_test=7, eval_batch_size=3).evaluate(model)
    assert result["test/loss"] == pytest.approx(sum(sums) / 7, rel=1e-13)


# ---- language models -----------------------------------------------------------------------------
def test_each_rank_gets_a_contiguous_shard_of_the_stream():
    stream = torch.arange(11)
    assert [_shard(stream, env(r, 3)).tolist() for r in range(3)] == \
           [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert _shard(stream, env()).tolist() == list(range(11))


def test_bptt_windows_shift_targets_by_one_token():
    data = torch.arange(16).view(2, 8)
    windows = list(_windows(data, 3))
    assert [(x.tolist(), y.tolist()) for x, y in windows] == [
        ([[0, 1, 2], [8, 9, 10]], [[1, 2, 3], [9, 10, 11]]),
        ([[3, 4, 5], [11, 12, 13]], [[4, 5, 6], [12, 13, 14]]),
        ([[6], [14]], [[7], [15]]),
    ]


def lm(rank: int = 0, world: int = 1, batch_size: int = 4, eval_batch_size: int = 2,
       bptt: int = 3, n_train: int = 50, n_test: int = 21) -> LanguageModel:
    bundle = DataBundle("language_model", 10, torch.arange(n_train) % 10,
                        torch.arange(n_test) * 7 % 10)
    return LanguageModel(bundle, env(rank, world), batch_size, eval_batch_size, bptt, CPU)


def test_batchify_lays_each_shard_out_as_parallel_sequences():
    task = lm(rank=1, world=2, batch_size=4)
    # rank 1's shard is tokens 25..49 of the stream; 2 sequences of 12, the last token dropped
    shard = (torch.arange(25, 50) % 10)
    assert torch.equal(task.train, shard[:24].view(2, 12))
    assert task.steps_per_epoch() == len(list(task.batches(0))) == math.ceil(11 / 3) == 4
    assert torch.equal(task.test, (torch.arange(10, 20) * 7 % 10).view(2, 5))
    task.set_batch_size(8)
    assert torch.equal(task.train, shard[:24].view(4, 6))
    assert task.batch_size == 8


def test_too_few_tokens_per_sequence_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        lm(batch_size=50)
    assert str(info.value) == "trainer.batch_size: 50 sequences per rank leave fewer than 2 " \
                              "tokens per sequence of a 50-token shard"
    with pytest.raises(ConfigError, match=r"^trainer\.eval_batch_size: 11 sequences per rank"):
        lm(eval_batch_size=11)


def test_two_tokens_per_sequence_make_one_window():
    task = lm(batch_size=25, bptt=3)  # 50 tokens as 25 sequences of 2: the fewest allowed
    assert task.train.shape == (25, 2)
    assert [(x.tolist(), y.tolist()) for x, y in task.batches(0)] == \
           [(task.train[:, :1].tolist(), task.train[:, 1:].tolist())]
    assert task.steps_per_epoch() == 1
    assert lm(batch_size=1).train.shape == (1, 50)  # one sequence: the whole shard


@pytest.mark.parametrize("bptt", [1, 2, 3, 6, 7, 8])
def test_steps_per_epoch_counts_the_windows(bptt):
    task = lm(batch_size=4, n_train=32, bptt=bptt)  # sequences of 8 tokens: 7 targets each
    assert task.train.shape == (4, 8)
    assert task.steps_per_epoch() == len(list(task.batches(0))) == math.ceil(7 / bptt)


class Recurrent(nn.Module):
    """A tiny LSTM LM (the shape of models/lstm.py) that records the hidden state it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.lstm, self.out = nn.Embedding(10, 4), nn.LSTM(4, 5, batch_first=True), \
            nn.Linear(5, 10)
        self.given: list = []

    def forward(self, x, hidden=None):
        self.given.append(hidden)
        y, hidden = self.lstm(self.embed(x), hidden)
        return self.out(y), hidden


def test_the_hidden_state_is_carried_detached_and_restarts_every_epoch():
    torch.manual_seed(0)
    task, model = lm(), Recurrent()
    for epoch in range(2):
        for window in task.batches(epoch):
            loss, n = task.loss(model, window)
            assert n == window[1].numel()
            loss.backward()  # would fail on a second backward through a kept graph
    steps = task.steps_per_epoch()
    assert [h is None for h in model.given] == ([True] + [False] * (steps - 1)) * 2
    assert all(not t.requires_grad for h in model.given if h is not None for t in h)
    x, y = next(iter(task.batches(0)))
    logits, _ = model(x)
    torch.testing.assert_close(task.loss(model, (x, y))[0],
                               F.cross_entropy(logits.reshape(-1, 10), y.reshape(-1)))
    assert LanguageModel.split((x, y), 1) == [(x, y)]  # no micro-batches for BPTT
    assert LanguageModel.size((x, y)) == x.numel()


def window_sums(model: nn.Module, data: torch.Tensor, bptt: int) -> list[float]:
    """Summed cross-entropy of each BPTT window of ``data``, the hidden state carried, by hand."""
    sums, hidden, length = [], None, data.size(1) - 1
    with torch.no_grad():
        for i in range(0, length, bptt):
            x, y = data[:, i:i + bptt][:, :length - i], data[:, i + 1:i + 1 + bptt]
            logits, hidden = model(x, hidden)
            sums.append(F.cross_entropy(logits.reshape(-1, 10), y.reshape(-1),
                                        reduction="sum").item())
    return sums


def test_language_model_evaluate_is_exact_over_the_test_stream(group):
    torch.manual_seed(0)
    task, model = lm(eval_batch_size=2, bptt=3, n_test=21), Recurrent()
    result = task.evaluate(model)
    assert model.training
    # by hand: the stream as 2 sequences of 10, 3 windows of 3 with the hidden state carried
    sums = window_sums(model, (torch.arange(21) * 7 % 10)[:20].view(2, 10), 3)
    assert len(sums) == 3
    assert result["test/loss"] == pytest.approx(sum(sums) / 18, rel=1e-6)
    assert result["test/perplexity"] == pytest.approx(math.exp(sum(sums) / 18), rel=1e-6)


def test_language_model_evaluation_sums_losses_in_float64(group):
    torch.manual_seed(0)
    task, model = lm(eval_batch_size=2, bptt=3, n_test=21), Recurrent()
    with torch.no_grad():
        model.out.weight.mul_(1000.0)  # losses in the thousands
    sums = window_sums(model, task.test, 3)
    assert min(sums) > 100
    assert task.evaluate(model)["test/loss"] == pytest.approx(sum(sums) / 18, rel=1e-13)


def test_perplexity_of_a_diverged_model_is_finite(group):
    task, model = lm(), Recurrent()
    with torch.no_grad():
        model.out.bias.copy_(torch.tensor([1e4] + [-1e4] * 9))  # certain of the wrong token
    result = task.evaluate(model)
    assert result["test/loss"] > 700 and result["test/perplexity"] == math.exp(700)


def test_make_task_by_dataset_kind(compose_cfg):
    cfg = compose_cfg("dataset=synthetic_text", "dataset.bptt=7", "trainer.batch_size=4",
                      "trainer.eval_batch_size=2")
    bundle = DataBundle("language_model", 10, torch.arange(100) % 10, torch.arange(40) % 10)
    task = make_task(bundle, env(), cfg, torch.device("meta"))
    assert isinstance(task, LanguageModel) and task.bptt == 7
    assert task.train.shape == (4, 25) and task.test.shape == (2, 20)
    assert task.train.device.type == "meta"  # the device given
    cfg = OmegaConf.merge(compose_cfg(), {"trainer": {"batch_size": 5, "eval_batch_size": 3},
                                          "seed": 4})
    task = make_task(DataBundle("classification", 4, images(20), images(7)), env(), cfg, CPU)
    assert isinstance(task, Classification) and task.batch_size == 5
    assert task.test_loader.batch_size == 3
    assert ids(task.batches(0)) == ids(classification(batch_size=5, seed=4).batches(0))


# ---- the batches a run may use, checked before it starts (check_batches) ----------------------
def test_every_classification_batch_is_checked_against_the_training_set():
    bundle = DataBundle("classification", 4, images(20), images(7))
    check_batches(bundle, {"trainer.batch_size": 20, "scheduler.batch_low": 8}, 50, 4)
    with pytest.raises(ConfigError) as info:
        check_batches(bundle, {"trainer.batch_size": 8, "scheduler.batch_high": 21}, 50, 4)
    assert str(info.value) == "scheduler.batch_high: 21 is larger than the training set (20 " \
                              "examples)"


@pytest.mark.parametrize(("batches", "eval_batch_size", "message"), [
    ({"scheduler.batch_high": 19}, 4, "scheduler.batch_high: 9 sequences per rank leave fewer "
     "than 2 tokens per sequence of a 10-token shard"),  # 21 tokens, 2 ranks: 10 each
    ({"trainer.batch_size": 4}, 6, "trainer.eval_batch_size: 6 sequences per rank leave fewer "
     "than 2 tokens per sequence of a 11-token shard"),  # 23 test tokens: 11 each
])
def test_every_language_model_batch_is_checked_per_rank(batches, eval_batch_size, message):
    bundle = DataBundle("language_model", 10, torch.arange(21) % 10, torch.arange(23) % 10)
    check_batches(bundle, {"trainer.batch_size": 10, "scheduler.batch_low": 4}, 5, 2)  # fits
    with pytest.raises(ConfigError) as info:
        check_batches(bundle, batches, eval_batch_size, 2)
    assert str(info.value) == message


def test_the_loader_draws_from_the_ranks_own_generator():
    assert classification(seed=5, rank=1, world=2).loader_rng.initial_seed() == 5001


def test_a_language_model_without_a_carry_keeps_none():
    task = lm()
    assert task.carry() is None
    task.set_carry(None)
    assert task.hidden is None and task.carry() is None
