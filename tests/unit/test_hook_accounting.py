"""The hook's own work (compression/hook.py), apart from the compressors' math: Delta_e, the
bit accounting, levels, its checkpoint state, and the mean of the dense tensors.

A real DDP model on a world-size-1 gloo group in this process; the reference gradients are
computed with ``torch.autograd.grad`` on the bare module, independently of the hook. The mean
over several workers runs on simulated workers (``SimComm``), which drive the hook's very
``aggregate_bucket``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
from compression import _adacomp_kernel as adacomp_kernel
from compression._adacomp_kernel import group_bytes
from compression.adacomp import AdaComp
from compression.base import Sent
from compression.comm import SimComm, drive
from compression.hook import HookState, aggregate_bucket, comm_hook
from compression.stats import layer_type
from core.errors import ConfigError
from tests.conftest import TIMING
from tests.references import require_kernel


class Net(nn.Module):
    """Conv kernels (with and without bias), a BatchNorm, an FC layer, a frozen parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, bias=False)
        self.fc = nn.Linear(16, 3)
        self.temperature = nn.Parameter(torch.full((3,), 0.5), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv2(torch.relu(self.bn(self.conv1(x))))), 2)
        return self.fc(x.flatten(1)) * self.temperature


TRAINABLE = ["conv1.weight", "conv1.bias", "bn.weight", "bn.bias", "conv2.weight", "fc.weight",
             "fc.bias"]
COMPRESSED = ["conv1.weight", "conv2.weight", "fc.weight"]
CONV, FC = ["conv1.weight", "conv2.weight"], ["fc.weight"]


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make(name: str, bucket_cap_mb: float = 1e-4, **params
         ) -> tuple[Net, DDP, HookState, torch.optim.Optimizer]:
    """The model under DDP with the hook of compressor ``name``; by default one parameter per
    bucket (several buckets a step)."""
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    state = HookState(compression.create(name, **params), model.named_parameters())
    ddp.register_comm_hook(state, comm_hook)
    return model, ddp, state, torch.optim.SGD(model.parameters(), lr=0.1)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 2, 6, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def train(model: Net, ddp: DDP, opt: torch.optim.Optimizer, steps: range
          ) -> list[dict[str, torch.Tensor]]:
    """SGD steps through DDP; returns each step's local gradients, computed beforehand on the
    bare module with autograd (no hook involved)."""
    params = dict(model.named_parameters())
    local = []
    for step in steps:
        x, y = batch(step)
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), [params[n] for n in TRAINABLE])
        local.append(dict(zip(TRAINABLE, grads, strict=True)))
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return local


def total(local: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {n: torch.stack([g[n] for g in local]).sum(0) for n in TRAINABLE}


def numel(model: Net, names: list[str]) -> int:
    params = dict(model.named_parameters())
    return sum(params[n].numel() for n in names)


# ---- Delta_e: Accordion's statistic --------------------------------------------------------------
@pytest.mark.parametrize(("name", "params"), [("none", {}), ("topk", {"ratio": 0.25}),
                                              ("powersgd", {"rank": 1}), ("adacomp", {})])
def test_delta_e_sums_every_step_of_the_local_gradient(group, name, params):
    model, ddp, state, opt = make(name, **params)
    local = train(model, ddp, opt, range(3))
    want = total(local)
    assert sorted(state.stats.grad_sums) == sorted(TRAINABLE)  # the frozen parameter has none
    norms = state.grad_norms()
    for n in TRAINABLE:
        torch.testing.assert_close(state.stats.grad_sums[n], want[n], rtol=1e-5, atol=1e-7)
        assert norms[n] == pytest.approx(float(want[n].norm()), rel=1e-5)
        assert state.epoch_stats()[f"grad_norm/{n}"] == norms[n]
    # the statistic is taken before compression: what the optimizer applied differs
    if name != "none":
        applied = dict(model.named_parameters())["fc.weight"].grad
        assert not torch.allclose(applied, local[-1]["fc.weight"])


def test_reset_epoch_starts_the_sums_and_the_bits_afresh(group):
    model, ddp, state, opt = make("topk", ratio=0.25)
    train(model, ddp, opt, range(2))
    one_epoch_bits = state.stats.bits
    state.reset_epoch()
    stats = state.epoch_stats()
    assert all(stats[k] == 0 for k in stats if k.startswith(("comm/", "grad_norm/")))
    assert stats["time/compress_s"] == 0
    local = train(model, ddp, opt, range(2, 3))
    for n in TRAINABLE:
        torch.testing.assert_close(state.stats.grad_sums[n], local[0][n], rtol=1e-5, atol=1e-7)
    assert 2 * state.stats.bits == one_epoch_bits  # one step of the same layers and levels


# ---- bits ----------------------------------------------------------------------------------------
def test_none_counts_32_bits_per_element_of_every_bucket(group):
    model, ddp, state, opt = make("none")
    train(model, ddp, opt, range(3))
    stats = state.epoch_stats()
    full = 3 * 32 * numel(model, TRAINABLE)
    assert stats["comm/bits"] == stats["comm/bits_dense"] == stats["comm/wire_bits"] == full
    assert all(stats[f"comm/bits_{k}"] == stats[f"comm/bits_dense_{k}"] == 0
               for k in ("conv", "fc"))
    assert not any(k.startswith("level/") for k in stats)


def test_topk_bits_by_layer_type(group):
    model, ddp, state, opt = make("topk", ratio=0.25)
    train(model, ddp, opt, range(2))
    stats = state.epoch_stats()
    params = dict(model.named_parameters())
    kept = {n: max(1, math.floor(0.25 * params[n].numel())) for n in COMPRESSED}
    dense = [n for n in TRAINABLE if n not in COMPRESSED]
    assert stats["comm/bits_conv"] == 2 * sum(64 * kept[n] for n in CONV)
    assert stats["comm/bits_fc"] == 2 * 64 * kept["fc.weight"]
    assert stats["comm/bits_dense_conv"] == 2 * 32 * numel(model, CONV)
    assert stats["comm/bits_dense_fc"] == 2 * 32 * numel(model, FC)
    assert stats["comm/bits"] == stats["comm/wire_bits"] == \
        stats["comm/bits_conv"] + stats["comm/bits_fc"] + 2 * 32 * numel(model, dense)
    assert stats["comm/bits_dense"] == 2 * 32 * numel(model, TRAINABLE)
    assert {k: v for k, v in stats.items() if k.startswith("level/")} == \
        {f"level/{n}": 0.25 for n in COMPRESSED}
    assert stats["time/compress_s"] > 0


def test_adacomp_wire_bits_in_one_bucket(group):
    # One bucket (the whole model): per step the dense tensors in fp32, then one message: s per
    # layer (4 bytes), each layer's sent and sign bytes, padded to whole 4-byte words.
    model, ddp, state, opt = make("adacomp", bucket_cap_mb=25, conv_bin_size=5, fc_bin_size=7)
    train(model, ddp, opt, range(2))
    stats = state.epoch_stats()
    params = dict(model.named_parameters())
    levels = {"conv1.weight": 5, "conv2.weight": 5, "fc.weight": 7}
    payload = 4 * 3 + 2 * sum(group_bytes(params[n].numel(), levels[n]) for n in COMPRESSED)
    message = -(-payload // 4) * 4
    assert message > payload  # the padding is counted too
    dense = [n for n in TRAINABLE if n not in COMPRESSED]
    assert stats["comm/wire_bits"] == 2 * (8 * message + 32 * numel(model, dense))
    # the paper's encoding: 8 bits per sent element (L_T < 64) + a 32-bit scale per layer
    sent_bits = stats["comm/bits"] - 2 * 32 * numel(model, dense)
    assert sent_bits == stats["comm/bits_conv"] + stats["comm/bits_fc"]
    assert (sent_bits - 2 * 3 * 32) % 8 == 0 and sent_bits > 2 * 3 * 32


# ---- levels, layers ------------------------------------------------------------------------------
def test_layers_levels_and_their_errors(group):
    _, _, state, _ = make("topk", ratio=0.5)
    assert state.world_size == 1
    assert state.compressed_layers() == COMPRESSED
    assert [state.layers[n].level for n in TRAINABLE] == [0.5, None, None, None, 0.5, 0.5, None]
    state.set_levels({"fc.weight": 0.1})
    assert [state.layers[n].level for n in COMPRESSED] == [0.5, 0.5, 0.1]
    with pytest.raises(ConfigError) as info:
        state.set_levels({"fc.bias": 0.1})
    assert str(info.value) == f"level/fc.bias: not a compressed layer; choose one of " \
                              f"{sorted(COMPRESSED)}"
    with pytest.raises(ConfigError, match=r"^level/conv1\.weight: expected a number in \(0, 1]"):
        state.set_levels({"conv1.weight": 1.5})
    _, _, none_state, _ = make("none")
    assert none_state.compressed_layers() == []
    assert all(layer.level is None for layer in none_state.layers.values())


def test_layer_type():
    assert layer_type(torch.Size([4, 2, 3, 3])) == "conv"
    assert layer_type(torch.Size([4, 2, 3])) == "conv"
    assert layer_type(torch.Size([3, 16])) == "fc"


# ---- checkpoint state ----------------------------------------------------------------------------
def test_state_dict_is_a_copy_and_restores_levels_and_memories(group):
    model, ddp, state, opt = make("topk", ratio=0.25)
    train(model, ddp, opt, range(2))
    state.set_levels({"fc.weight": 0.5})
    saved = state.state_dict()
    memory = {n: {k: v.clone() for k, v in state.layers[n].memory.items()} for n in COMPRESSED}
    assert saved["compressor"] == "topk" and sorted(saved["layers"]) == sorted(TRAINABLE)
    assert all(memory[n] for n in COMPRESSED)  # error feedback exists
    train(model, ddp, opt, range(2, 4))  # training on changes the live memories, not the saved
    for n in COMPRESSED:
        for k, v in memory[n].items():
            assert torch.equal(saved["layers"][n]["memory"][k], v)
    _, _, fresh, _ = make("topk", ratio=0.25)
    fresh.load_state_dict(saved)
    assert fresh.layers["fc.weight"].level == 0.5 and fresh.layers["conv1.weight"].level == 0.25
    for n in COMPRESSED:
        for k, v in memory[n].items():
            assert torch.equal(fresh.layers[n].memory[k], v)
        for v in saved["layers"][n]["memory"].values():
            v.add_(1)
        for k, v in memory[n].items():
            assert torch.equal(fresh.layers[n].memory[k], v)  # loading copied the tensors


def test_adacomp_state_is_settled_before_it_is_saved(group, monkeypatch):
    # the kernel defers residue -= G_q to the next step; a checkpoint must hold the settled
    # residue: the eager path's, bit for bit, and nothing owed
    require_kernel(adacomp_kernel.LIBRARY)
    saved = []
    for eager in (False, True):
        if eager:
            monkeypatch.setattr(adacomp_kernel, "kernel", lambda: None)
        model, ddp, state, opt = make("adacomp", conv_bin_size=5, fc_bin_size=7)
        train(model, ddp, opt, range(2))
        saved.append(state.state_dict()["layers"])
    for n in COMPRESSED:
        assert set(saved[0][n]["memory"]) == set(saved[1][n]["memory"]) == {"residue"}
        assert torch.equal(saved[0][n]["memory"]["residue"], saved[1][n]["memory"]["residue"])


def test_loading_another_compressors_state_is_refused(group):
    _, _, topk, _ = make("topk")
    _, _, adacomp, _ = make("adacomp")
    with pytest.raises(ConfigError) as info:
        adacomp.load_state_dict(topk.state_dict())
    assert str(info.value) == "resume: the checkpoint was written with compressor 'topk', not " \
                              "'adacomp'"


# ---- the mean of the dense tensors, on several simulated workers ---------------------------------
def _run_bucket(world: int, dense_sizes: list[int], name: str = "none", layer_shape=None
                ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], list, list]:
    comms = SimComm.group(world)
    compressor = compression.create(name)
    gen = torch.Generator().manual_seed(world)
    inputs = [[torch.randn(n, generator=gen) for n in dense_sizes] for _ in range(world)]
    dense = [[t.clone() for t in tensors] for tensors in inputs]
    layers, grads = [], []
    for _ in range(world):
        if layer_shape is None:
            layers.append([]), grads.append([])
        else:
            shape = torch.Size(layer_shape)
            layers.append([compression.base.Layer("w", shape, compressor.default_level(shape))])
            grads.append([torch.randn(shape, generator=gen)])
    futures = [drive(aggregate_bucket(compressor, dense[w], layers[w], grads[w], comms[w]))
               for w in range(world)]
    return inputs, dense, [f.value() for f in futures], grads


@pytest.mark.parametrize("sizes", [[5], [5, 3, 1]])
def test_dense_tensors_become_the_mean_over_workers(sizes):
    inputs, dense, sent, _ = _run_bucket(3, sizes)
    for i in range(len(sizes)):
        mean = torch.stack([inputs[w][i] for w in range(3)]).sum(0) / 3
        for w in range(3):
            torch.testing.assert_close(dense[w][i], mean, rtol=0, atol=1e-6)
    assert sent == [[Sent(32 * sum(sizes), 32 * sum(sizes))]] * 3


def test_a_bucket_with_dense_tensors_and_a_compressed_layer():
    inputs, dense, sent, grads = _run_bucket(2, [4, 2], name="topk", layer_shape=(4, 5))
    for i in range(2):
        mean = (inputs[0][i] + inputs[1][i]) / 2
        assert torch.equal(dense[0][i], mean) and torch.equal(dense[1][i], mean)
    k = max(1, math.floor(0.1 * 20))
    assert sent == [[Sent(32 * 6, 32 * 6), Sent(64 * k, 64 * k)]] * 2
    assert torch.equal(grads[0][0], grads[1][0])  # both workers apply the same aggregate


def test_a_bucket_of_compressed_layers_only():
    _, _, sent, _ = _run_bucket(2, [], name="topk", layer_shape=(4, 5))
    assert sent == [[Sent(64 * 2, 64 * 2)]] * 2


@pytest.mark.parametrize(("name", "params"), [("topk", {"ratio": 0.25}),
                                              ("adacomp", {"conv_bin_size": 5, "fc_bin_size": 7})])
def test_an_epoch_stopped_mid_way_continues_with_its_sums(group, name, params):
    # A mid-epoch checkpoint's epoch state (Delta_e, bits in all and by type, sent counts, step,
    # compress time), loaded into a fresh hook state after 3 of 6 steps: the epoch ends with the
    # stats of the state that ran all 6. One bucket: DDP lays out its buckets anew after a
    # model's first step, and AdaComp pads each bucket's message to whole words, so with several
    # buckets the first step after a restart can differ in comm/wire_bits by that padding.
    params = {**params, "bucket_cap_mb": 25}
    model, ddp, state, opt = make(name, **params)
    train(model, ddp, opt, range(3))
    epoch, saved = state.epoch_state_dict(), state.state_dict()
    weights, moments = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert epoch["step"] == 3 and epoch["bits"] > 0
    train(model, ddp, opt, range(3, 6))
    model2, ddp2, fresh, opt2 = make(name, **params)
    model2.load_state_dict(weights), opt2.load_state_dict(moments)
    fresh.load_state_dict(saved)
    fresh.reset_epoch(0)
    fresh.load_epoch_state_dict(epoch, torch.device("cpu"))
    assert fresh.stats.timer.seconds == epoch["compress_s"]
    train(model2, ddp2, opt2, range(3, 6))
    resumed, straight = fresh.epoch_stats(), state.epoch_stats()
    assert resumed.keys() == straight.keys()
    assert {k: v for k, v in resumed.items() if k not in TIMING} == \
        {k: v for k, v in straight.items() if k not in TIMING}
    assert fresh.grad_norms() == state.grad_norms() and fresh.stats.step == state.stats.step == 6
    assert fresh.nonfinite() is None
    fresh.load_epoch_state_dict({**epoch, "nonfinite": (2, ["fc.weight"])}, torch.device("cpu"))
    assert fresh.nonfinite() == (2, ["fc.weight"])


class DeviceCounts(AdaComp):
    """AdaComp returning its sent counts as 0-d tensors, as it does on CUDA (where reading them
    would wait for the device): the hook must sum them on the device and read them once."""

    def _compress(self, *args, **kwargs):
        return [torch.tensor(c) for c in super()._compress(*args, **kwargs)]


def test_counts_kept_on_the_device_are_the_counts_read_at_once(group):
    # The same steps with the counts as ints and as tensors: the same epoch metrics (plain
    # floats), the same mid-epoch state (plain ints), whatever the order they are asked in.
    runs = {}
    for cls in (AdaComp, DeviceCounts):
        torch.manual_seed(0)
        model = Net()
        ddp = DDP(model, bucket_cap_mb=1e-4)
        state = HookState(cls(conv_bin_size=5, fc_bin_size=7), model.named_parameters())
        ddp.register_comm_hook(state, comm_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, ddp, opt, range(2))
        middle = state.epoch_state_dict()
        train(model, ddp, opt, range(2, 4))
        runs[cls] = middle, state.epoch_stats(), state.epoch_state_dict()
        assert not state.stats._tally  # all read
    plain, counted = runs[AdaComp], runs[DeviceCounts]
    for a, b in ((plain[0], counted[0]), (plain[2], counted[2])):
        assert {k: v for k, v in a.items() if k not in ("grad_sums", "compress_s")} == \
            {k: v for k, v in b.items() if k not in ("grad_sums", "compress_s")}
    assert counted[0]["bits"] < counted[2]["bits"] and counted[0]["chosen"]
    stats = {k: v for k, v in counted[1].items() if k not in TIMING}
    assert stats == {k: v for k, v in plain[1].items() if k not in TIMING}
    assert all(type(v) in (int, float) for v in counted[1].values())
