"""Simulated learners (training/simulated.py) against real DDP ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from core.ranks import run_ranks
from tests.test_compression_ddp import SmallCNN, batch, make_ddp, plain
from training.simulated import SimulatedWorkers

CONFIGS = [{"name": "none"}, {"name": "powersgd", "rank": 2},
           {"name": "topk", "ratio": 0.1, "error_feedback": False, "reduce": "sum"},
           {"name": "adacomp", "conv_bin_size": 20, "fc_bin_size": 100},
           {"name": "ef_signsgd", "block_size": 16}]
STEPS = 4


def _real(rank: int, world: int) -> list[list[dict[str, np.ndarray]]]:
    """Each config's aggregated gradients of every step, on one rank of a real gloo job."""
    runs = []
    for cfg in CONFIGS:
        model, ddp, _, opt = make_ddp(OmegaConf.create(cfg), bucket_cap_mb=25)
        grads = []
        for step in range(STEPS):
            x, y = batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            grads.append(plain({n: p.grad for n, p in model.named_parameters()}))
            opt.step()
        runs.append(grads)
    return runs


@pytest.fixture
def group():
    """A world-size-1 group, one intra-op thread (as the real ranks use: threads round alike)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def simulated(cfg: dict, world: int) -> list[dict[str, np.ndarray]]:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    workers = SimulatedWorkers(model, OmegaConf.create(cfg), [None] * world,
                               list(range(world)), bucket_cap_mb=25)
    grads = []
    for step in range(STEPS):
        opt.zero_grad()

        def local_backward(w: int, step: int = step) -> None:
            x, y = batch(w, step)
            torch.nn.functional.cross_entropy(workers.ddp(x), y).backward()

        workers.step(local_backward)
        grads.append(plain({n: p.grad for n, p in model.named_parameters()}))
        opt.step()
    return grads


def test_two_simulated_workers_step_as_two_real_ranks(group) -> None:
    # Same buckets (DDP's, rebuilt after the first step), same reduction order: bit for bit.
    real = run_ranks(_real, 2)[0]
    for cfg, real_grads in zip(CONFIGS, real, strict=True):
        for step, (got, want) in enumerate(zip(simulated(cfg, 2), real_grads, strict=True)):
            for name in want:
                assert np.array_equal(got[name], want[name]), f"{cfg['name']} step {step} {name}"


def test_three_workers_average_three_gradients(group) -> None:
    local = []
    for w in range(3):
        torch.manual_seed(0)
        model = SmallCNN()
        x, y = batch(w, 0)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local.append({n: p.grad.clone() for n, p in model.named_parameters()})
    got = simulated({"name": "none"}, 3)[0]
    for name, g in got.items():
        mean = (local[0][name] + local[1][name] + local[2][name]) / 3
        torch.testing.assert_close(torch.from_numpy(g), mean, atol=1e-6, rtol=1e-6)
