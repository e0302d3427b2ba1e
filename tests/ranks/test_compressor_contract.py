"""The contract every registered compressor keeps: registering one is how it gets tested.

For each name in :func:`compression.available` (its default parameters, plus the variants in
``EXTRA``): simulate equals a real 2-rank DDP step; error feedback loses nothing (what was
applied plus the memories equals the sum of the gradients); a checkpoint continues bit for bit;
a level change keeps the memory and takes effect at the next step; the bits reported match the
compressor's own ``step_bits`` and the bytes it put into its collectives. Algorithm-specific
checks against naive references are in tests/unit/test_compression.py.
"""

from __future__ import annotations

import copy
import math
import traceback
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP

import compression
from benchmarks.ranks import run_ranks
from compression.stats import LAYER_TYPES, layer_type
from tests.ranks.test_compression_ddp import batch, make_ddp, plain, train

# Variants that take another code path than the defaults.
EXTRA = {"topk-authors": ("topk", {"error_feedback": False, "reduce": "sum"}),
         "powersgd-authors": ("powersgd", {"restart_on_rank_change": True}),
         "adacomp-hard": ("adacomp", {"conv_bin_size": 20, "fc_bin_size": 100,
                                      "soft_threshold": False}),
         "adacomp-small-bins": ("adacomp", {"conv_bin_size": 20, "fc_bin_size": 100})}
CASES = {**{name: (name, {}) for name in compression.available()}, **EXTRA}
SHAPES = ((24, 30), (8, 3, 3, 3), (17,))
WORKERS = 3
STEPS = 3  # DDP steps of each case's job


def levels_of(name: str) -> list[Any]:
    """The default level, then Accordion's low and high (where the compressor has levels)."""
    pair = compression.create(name).accordion_levels
    return [None] if pair is None else [None, *pair]


def steps_for(shape: tuple[int, ...], steps: int, seed: int = 0) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=gen) for _ in range(WORKERS)] for _ in range(steps)]


def error_of(sim: compression.Simulation, worker: int) -> torch.Tensor:
    """Worker's error-feedback memory (zeros where the compressor keeps none), float64."""
    e = sim.compressor.error(sim.layers[worker]) if sim.compressed else None
    return torch.zeros(sim.shape, dtype=torch.float64) if e is None else e.double()


# ---- simulate == DDP, and a checkpoint continues bit for bit (every case in one 2-rank job) -
def _ddp_and_local(model: torch.nn.Module, ddp: DDP, opt: torch.optim.Optimizer, rank: int,
                   steps: int) -> dict[str, Any]:
    """Each step's local gradients (a twin model, no communication) and DDP's aggregate."""
    local, aggregated = [], []
    for step in range(steps):
        x, y = batch(rank, step)
        twin = copy.deepcopy(model)
        torch.nn.functional.cross_entropy(twin(x), y).backward()
        local.append(plain({n: p.grad for n, p in twin.named_parameters()}))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        aggregated.append(plain({n: p.grad for n, p in model.named_parameters()}))
        opt.step()
    return {"local": local, "aggregated": aggregated,
            "params": plain(dict(model.named_parameters()))}


def _resume(cfg: Any, rank: int) -> dict[bool, bool]:
    """Whether training on from a saved state (model, optimizer, hook state) equals training
    straight on; and the same without the hook state (which should differ)."""
    model, ddp, state, opt = make_ddp(cfg)
    train(model, ddp, opt, rank, range(3))
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()),
             state.state_dict())
    train(model, ddp, opt, rank, range(3, 6))
    straight = {n: p.detach().clone() for n, p in model.named_parameters()}
    results = {}
    for restore in (True, False):
        model2, ddp2, state2, opt2 = make_ddp(cfg)
        model2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        if restore:
            state2.load_state_dict(saved[2])
        train(model2, ddp2, opt2, rank, range(3, 6))
        results[restore] = all(torch.equal(p, straight[n]) for n, p in model2.named_parameters())
    return results


def _contract(rank: int, world: int, name: str, params: dict, steps: int) -> dict[str, Any]:
    cfg = OmegaConf.create({"name": name, **params})
    model, ddp, state, opt = make_ddp(cfg)
    out = _ddp_and_local(model, ddp, opt, rank, steps)
    return {**out, "stats": state.epoch_stats(), "resume": _resume(cfg, rank)}


def _contract_cases(rank: int, world: int, cases: list[str], steps: int) -> dict[str, Any]:
    """:func:`_contract` for each case in turn (fresh models, hooks and seeds each): its result,
    or its traceback. After a failure the rank runs no further case (the other rank may be
    waiting in a collective of the failed one): each of those says so."""
    out: dict[str, Any] = {}
    failed = None  # the first case that failed on this rank
    for case in cases:
        if failed is not None:
            out[case] = f"not run: case {failed} failed before it on this rank"
            continue
        name, params = CASES[case]
        try:
            out[case] = _contract(rank, world, name, params, steps)
        except Exception:  # noqa: BLE001 (reported by the case's test)
            out[case], failed = traceback.format_exc(), case
    return out


@pytest.fixture(scope="module")
def contract_jobs(request: pytest.FixtureRequest) -> dict[str, list[Any]]:
    """The selected cases of the test below on one pair of gloo ranks: starting two ranks (a
    torch import and DDP's each) costs more than most cases. {case: [rank 0's, rank 1's]}."""
    test = test_simulate_equals_ddp_and_checkpoints_continue.__name__
    cases = [item.callspec.params["case"] for item in request.session.items
             if item.module is request.module and item.originalname == test]
    ranks = run_ranks(_contract_cases, 2, (cases, STEPS))
    return {case: [r[case] for r in ranks] for case in cases}


@pytest.mark.parametrize("case", [c if c == "topk" else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_simulate_equals_ddp_and_checkpoints_continue(case: str, contract_jobs) -> None:
    name, params = CASES[case]
    ranks = contract_jobs[case]
    for rank, result in enumerate(ranks):
        assert not isinstance(result, str), f"rank {rank} failed:\n{result}"
    for layer, p in ranks[0]["params"].items():
        assert np.array_equal(p, ranks[1]["params"][layer]), f"ranks differ on {layer}"
    compressor = compression.create(name, **params)
    type_bits = dict.fromkeys(LAYER_TYPES, 0)  # rank 0's bits per compressed layer type
    for layer, first in ranks[0]["local"][0].items():
        sim = compression.Simulation(name, 2, first.shape, layer_name=layer, **params)
        for step in range(STEPS):
            out, bits = sim.step([torch.from_numpy(r["local"][step][layer]) for r in ranks])
            if sim.compressed:
                type_bits[layer_type(sim.shape)] += bits[0]
            for r in ranks:  # buckets batch layers differently: the last bits may differ
                torch.testing.assert_close(torch.from_numpy(r["aggregated"][step][layer]), out,
                                           atol=1e-6, rtol=1e-5, msg=f"{layer} step {step}")
    stats = ranks[0]["stats"]
    assert {k: stats[f"comm/bits_{k}"] for k in LAYER_TYPES} == type_bits
    if compressor.compresses:
        assert 0 < stats["comm/bits"] < stats["comm/bits_dense"]
        conv = sum(g.size for g in ranks[0]["local"][0].values() if g.ndim >= 3)
        assert stats["comm/bits_dense_conv"] == 32 * STEPS * conv
    else:
        assert stats["comm/bits"] == stats["comm/bits_dense"] == stats["comm/wire_bits"]
    for r in ranks:
        assert r["resume"][True], "the resumed run differs from the uninterrupted one"
        if compressor.memory.enabled:
            assert not r["resume"][False], "the compressor state made no difference (blind)"


# ---- error feedback ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize("case", CASES)
def test_error_feedback_loses_nothing(case: str, shape: tuple[int, ...]) -> None:
    # sum_t out_t + mean_w e_w = sum_t mean_w g_w,t: what is not applied yet is in the memories.
    name, params = CASES[case]
    sim = compression.Simulation(name, WORKERS, shape, **params)
    if sim.compressor.compresses and not sim.compressor.memory.enabled:
        pytest.skip("no error feedback: what a message leaves out is lost by design")
    applied = torch.zeros(shape, dtype=torch.float64)
    total = torch.zeros(shape, dtype=torch.float64)
    for grads in steps_for(shape, steps=6, seed=1):
        applied += sim.step(grads)[0].double()
        total += torch.stack([g.double() for g in grads]).mean(0)
    memory = torch.stack([error_of(sim, w) for w in range(WORKERS)]).mean(0)
    torch.testing.assert_close(applied + memory, total, atol=1e-4, rtol=0)
    if sim.compressor.memory.enabled:
        assert memory.abs().max() > 1e-3, "the memory holds nothing: the test would be blind"


# ---- levels -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize("case", [c for c in CASES if levels_of(CASES[c][0]) != [None]])
def test_a_level_change_keeps_the_memory(case: str, shape: tuple[int, ...]) -> None:
    # Switching to level L at step t gives what a compressor started at L gives from the memory
    # the switch left (settled): the level takes effect at once and the memory carries over
    # (as the compressor's set_level leaves it: the authors' PowerSGD restarts Q).
    name, params = CASES[case]
    steps = steps_for(shape, steps=4, seed=2)
    for level in levels_of(name)[1:]:
        switched = compression.Simulation(name, WORKERS, shape, **params)
        for grads in steps[:2]:
            switched.step(grads)
        switched.set_level(level)
        fresh = compression.Simulation(name, WORKERS, shape, **params)
        fresh.set_level(level)
        for w in range(WORKERS):
            fresh.layers[w].memory = {k: v.clone() for k, v in switched.memory(w).items()}
        for grads in steps[2:]:
            got, want = switched.step(grads), fresh.step(grads)
            assert torch.equal(got[0], want[0]) and got[1] == want[1], f"level {level}"
        assert all(x.level == level for x in switched.layers)


def test_the_registry_lists_every_compressor_with_its_facts() -> None:
    names = compression.available()
    assert {"none", "powersgd", "topk", "adacomp", "ef_signsgd"} <= set(names)
    for name in names:
        c = compression.create(name)
        assert c.name == name
        if c.accordion_levels is not None:  # the levels Accordion switches are valid levels
            assert [c.validate_level(x) for x in c.accordion_levels] == list(c.accordion_levels)
    # Those without levels: nothing for Accordion to switch (sent whole, cast, sign, C_nat).
    fixed = {"none", "fp16", "bf16", "signsgd", "signum", "natural"}
    assert compression.with_levels() == [n for n in names if n not in fixed]


# ---- bit accounting ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", CASES)
def test_bits_match_the_messages(case: str, shape: tuple[int, ...]) -> None:
    # wire_bits: exactly the bytes each worker put into its collectives; bits: the compressor's
    # step_bits where it depends on shape and level only (32 per element for what goes dense).
    name, params = CASES[case]
    sim = compression.Simulation(name, WORKERS, shape, **params)
    for level, grads in zip(levels_of(name), steps_for(shape, steps=3, seed=3), strict=False):
        if level is not None and sim.compressed:
            sim.set_level(level)
        before = [comm.bytes_sent for comm in sim.comms]
        _, bits = sim.step(grads)
        for w, comm in enumerate(sim.comms):
            assert sum(s.wire_bits for s in sim.sent[w]) == 8 * (comm.bytes_sent - before[w])
        expected = (sim.compressor.step_bits(sim.shape, sim.layers[0].level) if sim.compressed
                    else 32 * math.prod(shape))
        if expected is not None:
            assert bits == [expected] * WORKERS, f"level {sim.layers[0].level}"
        assert 0 < bits[0] <= 64 * math.prod(shape) + 32  # at most values + indices, one scale
