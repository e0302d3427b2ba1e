"""DDP's buckets are laid out for good before the first step (training/buckets.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import models
from core import rng
from data import DataBundle
from tests.ranks.test_compression_ddp import PROBE, SmallCNN, batch
from training import buckets
from training.simulated import simulated_envs
from training.tasks import LanguageModel


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _layouts(ddp: DDP, steps: int) -> list[list[list[int]]]:
    """Each step's buckets, as the comm hook sees them: the storage offsets of their grads."""
    seen: list[list[list[int]]] = []

    def hook(state, bucket):
        if bucket.index() == 0:
            seen.append([])
        seen[-1].append([g.storage_offset() for g in bucket.gradients()])
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    ddp.register_comm_hook(None, hook)
    for step in range(steps):
        x, y = batch(0, step)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    return seen


@pytest.mark.parametrize("settled", [True, False])
def test_every_step_sees_the_final_buckets(group, settled):
    torch.manual_seed(0)
    ddp = DDP(SmallCNN(), bucket_cap_mb=1e-4)  # a bucket per parameter, once rebuilt
    if settled:
        buckets.settle(ddp, PROBE)
    first, *later = _layouts(ddp, 3)
    assert all(layout == later[0] for layout in later) and len(later[0]) > 1
    # without settling, DDP's first step has every parameter in one bucket
    assert (first == later[0]) is settled


def test_settling_leaves_no_trace(group):
    torch.manual_seed(0)
    model = models.build("resnet18", num_classes=10, width=4)
    ddp = DDP(model, bucket_cap_mb=0.01)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    rng.seed_everything(3, rank=0, deterministic=False)
    streams = (random.random(), np.random.rand(), torch.rand(2))
    rng.seed_everything(3, rank=0, deterministic=False)
    buckets.settle(ddp, PROBE_IMAGES)
    assert (random.random(), np.random.rand()) == streams[:2]
    assert torch.equal(torch.rand(2), streams[2])
    for key, value in model.state_dict().items():  # weights and BatchNorm statistics
        assert torch.equal(value, saved[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_a_language_model_keeps_its_carry_and_dropout_its_rng(group):
    stream = torch.arange(400) % 17
    bundle = DataBundle("language_model", 17, stream, stream)
    task = LanguageModel(bundle, simulated_envs(1)[0], batch_size=4, eval_batch_size=2, bptt=5,
                         device=torch.device("cpu"))
    model = models.build("lstm", num_classes=17, emb_size=8, hidden_size=8, num_layers=2,
                         dropout=0.5)  # dropout draws from torch's RNG
    carried = (torch.ones(2, 2, 8), torch.zeros(2, 2, 8))
    task.set_carry(carried)
    torch.manual_seed(5)
    buckets.settle(DDP(model), task)
    assert all(torch.equal(a, b) for a, b in zip(task.carry(), carried, strict=True))
    assert torch.equal(torch.rand(2), torch.rand(2, generator=torch.Generator().manual_seed(5)))


PROBE_IMAGES = type(PROBE)(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
                           torch.tensor([1, 2]))
