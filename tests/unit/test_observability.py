"""What the hook logs for the papers' claims beyond the tables: AdaComp's residue range and the
fraction of elements it chose (its Figs. 4-6 and 7a), per layer, at each epoch's end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

import compression
from compression.hook import HookState


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def run_steps(state: HookState, model: nn.Module, steps: int, seed: int = 0) -> None:
    """``steps`` hook calls on one bucket of the model's random gradients (world size 1)."""
    gen = torch.Generator().manual_seed(seed)
    params = list(model.named_parameters())
    for _ in range(steps):
        buffer = torch.randn(sum(p.numel() for _, p in params), generator=gen)
        grads = list(buffer.split([p.numel() for _, p in params]))
        grads = [g.view_as(p) for g, (_, p) in zip(grads, params, strict=True)]
        state.aggregate([n for n, _ in params], grads, buffer).wait()


@pytest.mark.parametrize("soft", [True, False])
def test_adacomp_logs_its_residue_range_and_the_fraction_sent(group, soft: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(32, 10))
    state = HookState(compression.create("adacomp", conv_bin_size=9, fc_bin_size=40,
                                         soft_threshold=soft), model.named_parameters())
    run_steps(state, model, steps=4)
    stats = state.epoch_stats()
    for name in state.compressed_layers():
        residue = state.compressor.error(state.layers[name])
        assert stats[f"residue_min/{name}"] == float(residue.min()) < 0
        assert stats[f"residue_max/{name}"] == float(residue.max()) > 0
        numel = math.prod(state.layers[name].shape)
        bins = math.ceil(numel / state.layers[name].level)
        fraction = stats[f"sent_fraction/{name}"]
        if soft:  # at least one per bin, and more (the soft threshold), never all
            assert bins / numel < fraction < 1
        else:     # hard LS: one element per bin
            assert fraction == bins / numel
    assert not any(k.startswith("sent_fraction/0.bias") for k in stats)
    state.reset_epoch()
    assert not any(k.startswith("sent_fraction/") for k in state.epoch_stats())


def test_compressors_without_a_choice_log_no_fraction(group) -> None:
    model = nn.Linear(30, 20)
    state = HookState(compression.create("powersgd", rank=1), model.named_parameters())
    run_steps(state, model, steps=2)
    assert not any(k.startswith(("sent_fraction/", "residue_")) for k in state.epoch_stats())
