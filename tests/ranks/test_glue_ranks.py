"""The glue that is about ranks, on 2 real gloo ranks (``benchmarks.ranks.run_ranks``, spawned once
for the whole module): ``params_in_sync`` reporting False, rank 0's object reaching every rank,
each rank's own RNG stream and compressor memory restored from one checkpoint, and evaluations
summed over ranks that equal one pass over the whole test set.

The Accordion scheduler receiving rank 0's norms on every rank, inside a real run, is tested
in ``tests/e2e/test_accordion_norm_rule.py``.
"""

from __future__ import annotations

import math
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn
from torch.nn import functional as F

import compression
import run
import schedulers
from benchmarks.ranks import run_ranks
from core.distributed import DistEnv
from data import DataBundle
from tests.unit.test_tasks import Recurrent, images
from training import checkpoint
from training.tasks import Classification, LanguageModel

TEST_TOKENS = torch.arange(43) * 7 % 10  # 21 tokens per rank


def _in_sync(rank: int) -> dict[str, bool]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    same = run._params_in_sync(model)
    model[1].running_mean.fill_(float(rank))  # buffers are not parameters
    buffers_differ = run._params_in_sync(model)
    if rank == 1:
        with torch.no_grad():
            w = model[0].weight
            w[2, 1] = torch.nextafter(w[2, 1], torch.tensor(math.inf))  # one ulp apart
    one_ulp = run._params_in_sync(model)
    return {"same": same, "buffers_differ": buffers_differ, "one_ulp": one_ulp}


def _checkpoint(rank: int, path: str) -> dict[str, Any]:
    """Save with rank-specific RNG streams and memories, train on, restore, draw again."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = compression.HookState(compression.create("topk", ratio=0.5), model.named_parameters())
    hook.layers["weight"].memory["error"] = torch.full((3, 4), float(rank + 1))
    scheduler = schedulers.build(OmegaConf.create({"name": "static"}))
    random.seed(10 + rank), np.random.seed(10 + rank), torch.manual_seed(10 + rank)
    checkpoint.save(Path(path), OmegaConf.create({"seed": 0}), 2, 1.0, model, optimizer, hook,
                    scheduler)
    saved = (random.random(), float(np.random.rand()), torch.rand(2).tolist())
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    hook.layers["weight"].memory["error"].zero_()
    epoch, _, _ = checkpoint.load(Path(path), model, optimizer, hook, scheduler)
    restored = (random.random(), float(np.random.rand()), torch.rand(2).tolist())
    return {"saved": saved, "restored": restored, "epoch": epoch,
            "error": hook.layers["weight"].memory["error"].tolist()}


def _evaluate(rank: int, world: int) -> dict[str, Any]:
    env = DistEnv(rank, world, rank, "torchrun")
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    bundle = DataBundle("classification", 4, images(20), images(7, seed=1))
    classification = Classification(bundle, env, 4, 3, 0, 0, torch.device("cpu")).evaluate(model)
    torch.manual_seed(0)
    lm_model = Recurrent()
    lm_bundle = DataBundle("language_model", 10, torch.arange(80) % 10, TEST_TOKENS)
    lm = LanguageModel(lm_bundle, env, 4, 2, 3, torch.device("cpu")).evaluate(lm_model)
    return {"classification": classification, "lm": lm}


def _own_group(rank: int) -> dict[str, Any]:
    """A hook state over a group of this rank alone: its collectives stay in that group."""
    groups = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group
    state = compression.HookState(compression.create("none"), nn.Linear(2, 2).named_parameters(),
                                  group=groups[rank])
    total = torch.full((3,), float(rank + 1))
    state.comm.all_reduce(total).future.wait()
    return {"world_size": state.world_size, "sum": total.tolist()}


def _all(rank: int, world: int, tmp: str) -> dict[str, Any]:
    return {"in_sync": _in_sync(rank), "own_group": _own_group(rank),
            "from_rank0": run._from_rank0({"rank": rank, "norms": [float(rank)] * 2}),
            "checkpoint": _checkpoint(rank, str(Path(tmp) / "c.pt")),
            "evaluate": _evaluate(rank, world),
            "barrier": dist.barrier() is None}


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        return run_ranks(_all, world_size=2, args=(tmp,))


def test_params_in_sync_reports_false_for_one_ulp(ranks):
    for r in ranks:
        assert r["in_sync"] == {"same": True, "buffers_differ": True, "one_ulp": False}


def test_a_hook_state_communicates_over_its_own_group(ranks):
    for rank, r in enumerate(ranks):
        assert r["own_group"] == {"world_size": 1, "sum": [float(rank + 1)] * 3}


def test_every_rank_gets_rank0s_object(ranks):
    assert [r["from_rank0"] for r in ranks] == [{"rank": 0, "norms": [0.0, 0.0]}] * 2


def test_each_rank_restores_its_own_rng_streams_and_memories(ranks):
    for rank, r in enumerate(ranks):
        c = r["checkpoint"]
        assert c["restored"] == c["saved"] and c["epoch"] == 2
        assert c["error"] == [[float(rank + 1)] * 4] * 3
    assert ranks[0]["checkpoint"]["saved"] != ranks[1]["checkpoint"]["saved"]


def test_classification_over_two_ranks_equals_one_pass_over_the_test_set(ranks):
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    x, y = images(7, seed=1).tensors
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits.double(), y, reduction="sum").item() / 7
    accuracy = 100.0 * (logits.argmax(1) == y).sum().item() / 7
    for r in ranks:
        assert r["evaluate"]["classification"] == {"test/loss": pytest.approx(loss, rel=1e-6),
                                                   "test/accuracy": accuracy}


def test_language_model_over_two_ranks_sums_both_shards(ranks):
    # each rank: its contiguous 21 tokens as 2 sequences of 10 (trainer.eval_batch_size is per
    # rank), windows of 3 with the hidden state carried; the loss summed over both ranks' tokens
    torch.manual_seed(0)
    model = Recurrent()
    total, count = 0.0, 0
    for rank in range(2):
        data = TEST_TOKENS[21 * rank:21 * rank + 20].view(2, 10)
        hidden = None
        with torch.no_grad():
            for i in range(0, 9, 3):
                logits, hidden = model(data[:, i:i + 3], hidden)
                total += F.cross_entropy(logits.reshape(-1, 10), data[:, i + 1:i + 4]
                                         .reshape(-1), reduction="sum").item()
                count += 6
    assert count == 36
    for r in ranks:
        assert r["evaluate"]["lm"]["test/loss"] == pytest.approx(total / count, rel=1e-6)
        assert r["evaluate"]["lm"]["test/perplexity"] == pytest.approx(math.exp(total / count),
                                                                      rel=1e-6)
