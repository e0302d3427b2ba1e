"""Accordion with measured endpoints: the probe against naive references (simulated workers and
real gloo ranks), measuring changes no result, the rules, the schedulers on a real HookState,
their state, bad input, and the offline replay."""

from __future__ import annotations

import math
import re

import pytest
import torch
from omegaconf import OmegaConf

import compression
import schedulers
from benchmarks.ranks import run_ranks
from compression.comm import SimComm
from compression.hook import HookState
from compression.noise import NoiseProbe, TensorStats, sample_index
from core.errors import ConfigError
from schedulers.accordion_auto import (
    Candidate,
    Chooser,
    Epoch,
    LayerStats,
    choose,
    fit_budget,
    heaviest,
    noise_scale,
)
from schedulers.accordion_batch_auto import batch_high

WORKERS = 2


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))


def local_grads(params: list[tuple[str, torch.nn.Parameter]], workers: int, steps: int
                ) -> list[list[torch.Tensor]]:
    """Per step, each worker's flat gradient buffer (random, a shared part plus noise)."""
    gen = torch.Generator().manual_seed(7)
    n = sum(p.numel() for _, p in params)
    out = []
    for _ in range(steps):
        shared = torch.randn(n, generator=gen)
        out.append([shared + 2 * torch.randn(n, generator=gen) for _ in range(workers)])
    return out


def views(buffer: torch.Tensor, params: list[tuple[str, torch.nn.Parameter]]
          ) -> list[torch.Tensor]:
    sizes = [p.numel() for _, p in params]
    return [v.view_as(p) for v, (_, p) in zip(buffer.split(sizes), params, strict=True)]


def run_steps(compressor: compression.Compressor, steps: list[list[torch.Tensor]],
              probe: NoiseProbe | None, comms: list | None = None
              ) -> tuple[list[HookState], list[NoiseProbe | None], list[list[torch.Tensor]]]:
    """Every worker's HookState through ``steps`` (one bucket a step); returns the states,
    their probes and each step's aggregate (worker 0's buffer)."""
    net = model()
    params = list(net.named_parameters())
    comms = comms or SimComm.group(len(steps[0]))
    states = [HookState(compressor, params, comm=c) for c in comms]
    probes = [s.add_probe(lambda: NoiseProbe(probe.epochs, probe.steps, probe.levels,
                                             probe.sample)) if probe else None for s in states]
    outs = []
    for grads in steps:
        buffers = [g.clone() for g in grads]
        for f in [s.aggregate([n for n, _ in params], views(b, params), b)
                  for s, b in zip(states, buffers, strict=True)]:
            f.wait()  # simulated workers: done already; a gloo rank: its collectives
        for s in states:
            s.stats.step += 1
        outs.append(buffers)
    return states, probes, outs


# ---- the probe ------------------------------------------------------------------------------
def naive_topk(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """Keep the k = max(1, floor(ratio n)) entries of largest |x| (sorting a list)."""
    flat = x.reshape(-1).tolist()
    k = max(1, math.floor(ratio * len(flat)))
    keep = set(sorted(range(len(flat)), key=lambda i: -abs(flat[i]))[:k])
    return torch.tensor([v if i in keep else 0.0 for i, v in enumerate(flat)],
                        dtype=torch.float64).view(x.shape)


@pytest.mark.parametrize("workers", [2, 3])
def test_probe_matches_a_naive_reference_under_topk_with_error_feedback(workers):
    # Top-K at 0.5 (the level in use) with error feedback, measured at 0.5 and 0.1: M = g + e,
    # e tracked here as Top-K with error feedback defines it (e = M - topk(M) at the level used).
    levels, used, steps = [0.5, 0.1], 0.5, 3
    grads = local_grads(list(model().named_parameters()), workers, steps)
    probe = NoiseProbe(lambda e: True, steps, levels, sample=1.0)
    _, probes, _ = run_steps(compression.create("topk", ratio=used), grads, probe)
    got = probes[0].take()
    params = list(model().named_parameters())
    weights = [i for i, (_, p) in enumerate(params) if p.ndim > 1]
    memory = {(w, i): torch.zeros(params[i][1].shape, dtype=torch.float64)
              for w in range(workers) for i in weights}
    want = {params[i][0]: [0.0] * (4 + 2 * len(levels)) for i in weights}
    for step in grads:
        per_worker = [[v.double() for v in views(g, params)] for g in step]
        for i in weights:
            name, sums = params[i][0], want[params[i][0]]
            gs = [per_worker[w][i] for w in range(workers)]
            mean = sum(gs) / workers
            sums[0] += sum(float(g.square().sum()) for g in gs) / workers
            sums[1] += sum(float((g - mean).square().sum()) for g in gs)
            sums[2] += float(mean.square().sum())
            ms = [gs[w] + memory[(w, i)] for w in range(workers)]
            sums[3] += sum(float(m.square().sum()) for m in ms) / workers
            for j, level in enumerate(levels):
                sums[4 + j] += sum(float((naive_topk(m, level) - m).square().sum())
                                   for m in ms) / workers
                sums[4 + len(levels) + j] += 64 * max(1, math.floor(level * gs[0].numel()))
            for w in range(workers):
                memory[(w, i)] = ms[w] - naive_topk(ms[w], used)
    assert set(got.tensors) == set(want)  # only the compressed layers are measured
    assert got.world_size == workers and got.steps == steps
    for name, sums in want.items():
        t = got.tensors[name]
        flat = [t.local_sq, t.dev_sq, t.mean_sq, t.corrected_sq, *t.error, *t.bits]
        assert flat == pytest.approx([s / steps for s in sums], rel=1e-5), name


def test_probe_without_compression_reads_the_aggregate_and_measures_every_tensor():
    grads = local_grads(list(model().named_parameters()), WORKERS, 2)
    probe = NoiseProbe(lambda e: True, 5, sample=1 / 16)
    _, probes, _ = run_steps(compression.create("none"), grads, probe)
    got = probes[0].take()
    params = list(model().named_parameters())
    assert set(got.tensors) == {n for n, _ in params}
    # no all-reduce of its own: only the gathered scalars (3 per tensor, 64 bits) per step
    assert got.probe_bits == 2 * 64 * 3 * len(params)
    for i, (name, _) in enumerate(params):
        gs = [[views(g, params)[i].double() for g in step] for step in grads]
        dev = sum(float((g - sum(s) / WORKERS).square().sum()) for s in gs for g in s) / 2
        assert got.tensors[name].dev_sq == pytest.approx(dev, rel=1e-5)
        assert got.tensors[name].error == [] and got.tensors[name].corrected_sq == 0.0


def test_sampled_mean_is_the_same_coordinates_on_every_worker_and_scaled():
    assert sample_index(100, 0.5, 0, 0, "a") is None  # 50 < MIN_SAMPLE: every coordinate
    a, b = sample_index(10_000, 0.1, 3, 1, "w"), sample_index(10_000, 0.1, 3, 1, "w")
    assert torch.equal(a, b) and a.numel() == 1000 and a.unique().numel() == 1000
    assert not torch.equal(a, sample_index(10_000, 0.1, 3, 2, "w"))  # another step: another
    torch.manual_seed(0)
    net = torch.nn.Linear(200, 100, bias=False)
    params = list(net.named_parameters())
    gen = torch.Generator().manual_seed(2)
    grads = [[torch.randn(20_000, generator=gen) for _ in range(2)]]
    comms = SimComm.group(2)
    states = [HookState(compression.create("powersgd", rank=1), params, comm=c) for c in comms]
    probes = [s.add_probe(lambda: NoiseProbe(lambda e: True, 1, [1], sample=0.1))
              for s in states]
    futures = [s.aggregate(["weight"], [g.view(100, 200)], g) for s, g in
               zip(states, [x.clone() for x in grads[0]], strict=True)]
    assert all(f.done() for f in futures)
    got = probes[0].take().tensors["weight"]
    index = sample_index(20_000, 0.1, 0, 0, "weight")
    g = [x[index].double() for x in grads[0]]
    mean = (g[0] + g[1]) / 2
    scale = 20_000 / 2_000
    assert got.dev_sq == pytest.approx(scale * float(((g[0] - mean) ** 2 + (g[1] - mean) ** 2)
                                                     .sum()), rel=1e-6)
    assert got.local_sq == pytest.approx(scale * float((g[0] ** 2 + g[1] ** 2).sum()) / 2,
                                         rel=1e-6)
    assert probes[0].bits == 0  # taken: the probe starts over


@pytest.mark.parametrize("name", compression.with_levels())
def test_measuring_changes_no_result(name):
    # Every compressor with levels, measured at two of its levels on every step: the aggregates
    # and the memories are bit-identical to an unmeasured run's.
    compressor = compression.create(name)
    low, high = compressor.accordion_levels
    grads = local_grads(list(model().named_parameters()), WORKERS, 3)
    plain_states, _, plain = run_steps(compression.create(name), grads, None)
    probe = NoiseProbe(lambda e: True, 10, [low, high], sample=0.5)
    states, probes, measured = run_steps(compression.create(name), grads, probe)
    for a, b in zip(plain, measured, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for s, t in zip(plain_states, states, strict=True):
        for layer, saved in s.state_dict()["layers"].items():
            mine = t.state_dict()["layers"][layer]["memory"]
            assert saved["memory"].keys() == mine.keys()
            assert all(torch.equal(v, mine[k]) for k, v in saved["memory"].items())
    stats = probes[0].take()
    assert stats.steps == 3 and all(len(t.error) == 2 for t in stats.tensors.values())


def _probe_on_rank(rank: int, world: int) -> tuple[list, list]:
    grads = local_grads(list(model().named_parameters()), world, 3)
    probe = NoiseProbe(lambda e: True, 2, [1, 2], sample=0.25)
    mine = [[g] for g in (step[rank] for step in grads)]
    _, probes, outs = run_steps(compression.create("powersgd", rank=2), mine, probe,
                                comms=[compression.hook.GroupComm()])
    return _flat(probes[0].take().tensors), [o[0] for o in outs]


def _flat(tensors: dict[str, TensorStats]) -> list:
    return [(n, t.local_sq, t.dev_sq, t.mean_sq, t.corrected_sq, t.error, t.bits)
            for n, t in sorted(tensors.items())]


@pytest.mark.slow
def test_two_gloo_ranks_measure_what_two_simulated_workers_measure():
    # Real ranks: the gathered numbers are bit-identical on both ranks (each sums every rank's
    # scalars in rank order) and equal to the simulated workers' (the same collectives).
    ranks = run_ranks(_probe_on_rank, 2)
    assert ranks[0][0] == ranks[1][0]
    grads = local_grads(list(model().named_parameters()), 2, 3)
    _, probes, outs = run_steps(compression.create("powersgd", rank=2), grads,
                                NoiseProbe(lambda e: True, 2, [1, 2], sample=0.25))
    assert _flat(probes[0].take().tensors) == ranks[0][0]
    assert all(torch.equal(a, b[0]) for a, b in zip(ranks[0][1], outs, strict=True))


def _epoch_one(swap_after: int | None) -> tuple[list[NoiseProbe], int]:
    """Two workers through epoch 0 (not measured) and epoch 1 (its first 2 steps measured);
    with ``swap_after``, each worker's probe is replaced after that step by a new one loaded
    from its state_dict (a mid-epoch checkpoint). Returns the probes and epoch 0's steps."""
    grads = local_grads(list(model().named_parameters()), WORKERS, 3)
    probe = NoiseProbe(lambda e: e == 1, 2, [1], sample=1.0)
    states, probes, _ = run_steps(compression.create("powersgd"), grads, probe)
    before = probes[0].take().steps
    for s in states:
        s.reset_epoch(1)
    params = list(model().named_parameters())
    for step in grads:
        for f in [s.aggregate([n for n, _ in params], views(g.clone(), params), g.clone())
                  for s, g in zip(states, step, strict=True)]:
            f.wait()
        for s in states:
            s.stats.step += 1
        if states[0].stats.step == swap_after:
            for w, s in enumerate(states):
                resumed = NoiseProbe(lambda e: e == 1, 2, [1], sample=1.0)
                resumed.load_state_dict(probes[w].state_dict())
                s.probes, probes[w] = [resumed], resumed
    return probes, before


def test_probe_measures_only_its_epochs_and_steps_and_resumes_mid_epoch():
    straight, before = _epoch_one(None)
    assert before == 0  # epoch 0 is not measured
    resumed, _ = _epoch_one(1)
    a, b = straight[0].take(), resumed[0].take()
    assert a.steps == 2  # the first 2 of 3 steps
    assert a == b  # the sums carried over the swap, bit for bit


# ---- the rules ------------------------------------------------------------------------------
def stats(noise: float, local_sq: float, corrected_sq: float,
          levels: list[tuple[object, float, float]]) -> LayerStats:
    return LayerStats(noise, local_sq, corrected_sq, [Candidate(*x) for x in levels])


# Noise share 0.5 (noise 5 of local_sq 10); dropped shares 0.05, 0.3, 0.6 of corrected_sq 10:
# h = 0.1, 0.6, 1.2 for ranks 4, 2, 1.
LAYER = stats(5.0, 10.0, 10.0, [(4, 0.5, 400.0), (2, 3.0, 200.0), (1, 6.0, 100.0)])


def test_noise_rule_takes_the_heaviest_level_within_the_fraction():
    assert heaviest(LAYER, 1.0).level == 2
    assert heaviest(LAYER, 1.2).level == 1     # h <= f: equality qualifies
    assert heaviest(LAYER, 0.1).level == 4
    assert heaviest(LAYER, 0.05).level == 4    # none qualifies: the smallest h
    # with twice the corrected norm: relative h 0.05, 0.3, 0.6; absolute (error / noise) 0.1,
    # 0.6, 1.2
    memory = stats(5.0, 10.0, 20.0, [(c.level, c.error, c.bits) for c in LAYER.candidates])
    assert heaviest(memory, 1.0).level == 1
    assert heaviest(memory, 1.0, absolute=True).level == 2
    assert choose({"a": LAYER}, "noise", 0.1, 1.0)["a"] == [LAYER.candidates[0],
                                                             LAYER.candidates[1]]
    assert choose({"a": LAYER}, "budget", 0.1, 1.0)["a"] == [LAYER.candidates[0]] * 2


def test_harm_edge_cases():
    zero = stats(0.0, 10.0, 10.0, [(1, 0.0, 1.0), (2, 1.0, 2.0)])
    assert [zero.harm(c) for c in zero.candidates] == [0.0, math.inf]
    nan = stats(math.nan, 10.0, 10.0, [(1, 1.0, 1.0), (2, 0.5, 2.0)])
    assert heaviest(nan, 1.0).level == 2  # all h are inf: the most bits


def test_budget_moves_high_levels_outside_critical_regimes_first():
    layers = {"a": LAYER, "b": stats(5.0, 10.0, 10.0, [(4, 0.1, 400.0), (2, 0.2, 200.0),
                                                        (1, 0.3, 100.0)])}
    weights = {"a": (0, 1), "b": (1, 0)}  # one epoch ahead: a outside a critical regime, b in
    choice = choose(layers, "budget", 0.1, 1.0)
    assert fit_budget(choice, layers, weights, 600.0)  # 800 -> 600: a's high to rank 2
    assert [c.level for c in choice["a"]] == [4, 2] and [c.level for c in choice["b"]] == [4, 4]
    choice = choose(layers, "budget", 0.1, 1.0)
    assert fit_budget(choice, layers, weights, 300.0)  # a's high to 1, then b's low to 2
    assert [c.level for c in choice["a"]] == [4, 1] and [c.level for c in choice["b"]] == [2, 2]
    choice = choose(layers, "budget", 0.1, 1.0)
    assert not fit_budget(choice, layers, weights, 50.0)  # cannot: everything heaviest
    assert [c.level for c in choice["a"]] == [4, 1] and [c.level for c in choice["b"]] == [1, 1]
    # Later epochs run at the high levels: b's high saves 3 epochs' worth before its low does.
    choice = choose(layers, "budget", 0.1, 1.0)
    assert fit_budget(choice, layers, {"a": (0, 4), "b": (1, 3)}, 4 * 400 + 400 + 3 * 200)
    assert [c.level for c in choice["a"]] == [4, 4] and [c.level for c in choice["b"]] == [4, 2]


def test_budget_takes_the_least_harmful_move_first():
    # Both layers outside critical regimes; b's rank 2 drops less (h 0.04) than a's (h 0.6).
    layers = {"a": LAYER, "b": stats(5.0, 10.0, 10.0, [(4, 0.1, 400.0), (2, 0.2, 200.0),
                                                        (1, 9.0, 100.0)])}
    choice = choose(layers, "budget", 0.1, 1.0)
    assert fit_budget(choice, layers, {"a": (0, 1), "b": (0, 1)}, 600.0)
    assert [c.level for c in choice["a"]] == [4, 4] and [c.level for c in choice["b"]] == [4, 2]


def test_noise_scale_against_its_definition():
    # W = 4, batch 64: b = 16, B = 64. True |G|^2 = 2, tr(Sigma) = 48: E|g_b|^2 = 2 + 48 / 16 =
    # 5, E|g_B|^2 = 2 + 48 / 64 = 2.75.
    grad_sq, trace, b_simple = noise_scale(5.0, 2.75, 64, 4)
    assert (grad_sq, trace, b_simple) == pytest.approx((2.0, 48.0, 24.0))
    assert noise_scale(5.0, 1.0, 64, 4)[2] == math.inf  # |G|^2 estimate <= 0
    assert batch_high(24.0, 8, [8, 16, 32, 64]) == 16
    assert batch_high(math.inf, 8, [8, 16, 32]) == 32
    assert batch_high(3.0, 8, [16, 32]) == 8


def test_chooser_accounts_the_payload_and_its_state_is_plain(tmp_path):
    chooser = Chooser([4, 2, 1], "noise", 0.1, 1.0, 0.5, interval=2)
    done = Epoch(0, {"a": True}, {"a": False}, bits_dense=10 * 1000.0)  # 10 steps of 1000
    out = chooser.end_epoch(done, {"a": LAYER}, probe_bits=50.0, step_dense=1000.0,
                            step_other=100.0)
    # epoch 0 at rank 4: 10 x (100 + 400) + 50; window: 2 epochs of 10 steps
    assert chooser.spent == [5050.0, 10_000.0]
    assert out["auto/allowance/model"] == pytest.approx((0.5 * 30_000 - 5050) / 20 - 100)
    assert chooser.choices == {"a": [4, 2]} and out["auto/over_budget/model"] == 0.0
    path = tmp_path / "state.pt"
    torch.save(chooser.state_dict(), path)
    again = Chooser([4, 2, 1], "noise", 0.1, 1.0, 0.5, interval=2)
    again.load_state_dict(torch.load(path, weights_only=True))
    assert again.state_dict() == chooser.state_dict()
    assert again.level("a", True) == 4 and again.level("a", False) == 2
    assert again.level("b", False) == 4  # never measured: the first candidate


def test_chooser_plans_the_budget_over_the_rest_of_the_run():
    # 6 epochs: after epoch 0 (not critical), 2 epochs of window (critical: at the low level)
    # and 3 more, critical as often as so far (never): at the high level. Dense 1000 a step, 10
    # steps an epoch; budget 0.3 of 60 000 = 18 000.
    chooser = Chooser([4, 2, 1], "budget", 0.5, 1.0, 0.3, interval=2, epochs=6)
    done = Epoch(0, {"a": False}, {"a": True}, bits_dense=10 * 1000.0)
    out = chooser.end_epoch(done, {"a": LAYER}, probe_bits=0.0, step_dense=1000.0,
                            step_other=100.0)
    # spent 10 x 500 = 5000; left 13 000 = 10 steps x (5 x 100 + 2 x low + 3 x high): low 4,
    # high 1 (800 + 300 = 1100 > 800): low 2, high 1 (400 + 300 = 700 <= 800)
    assert out["auto/allowance/model"] == pytest.approx((13_000 / 10 - 500) / 5)
    assert chooser.choices == {"a": [2, 1]} and out["auto/over_budget/model"] == 0.0
    # Had epoch 0 been critical, the later 3 would be too (5 epochs at the low level): 1, 1.
    critical = Chooser([4, 2, 1], "budget", 0.5, 1.0, 0.3, interval=2, epochs=6)
    critical.end_epoch(Epoch(0, {"a": True}, {"a": True}, 10 * 1000.0), {"a": LAYER}, 0.0,
                       1000.0, 100.0)
    assert critical.choices == {"a": [1, 1]}
    last = Epoch(5, {"a": False}, {"a": False}, bits_dense=10 * 1000.0)
    assert chooser.end_epoch(last, {"a": LAYER}, 0.0, 1000.0, 100.0) == {}  # nothing ahead


# ---- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(("params", "message"), [
    ({"rule": "best"}, "scheduler.rule: expected one of ['noise', 'noise_abs', 'budget']"),
    ({"rule": "budget"}, "scheduler.budget: rule 'budget' needs a budget"),
    ({"budget": 0}, "scheduler.budget: expected a number in (0, inf)"),
    ({"fraction_low": 0}, "scheduler.fraction_low: expected a number in (0, inf)"),
    ({"fraction_low": 2.0, "fraction_high": 1.0}, "scheduler.fraction_high: expected a number "
                                                  "in [2, inf)"),
    ({"probe_steps": 0}, "scheduler.probe_steps: expected an integer >= 1"),
    ({"probe_sample": 1.5}, "scheduler.probe_sample: expected a number in (0, 1]"),
    ({"levels": "4,2"}, "scheduler.levels: expected a list or null"),
    ({"levels": []}, "scheduler.levels: expected a non-empty list or null"),
])
def test_bad_settings_are_one_line(params, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        schedulers.build({"name": "accordion_auto", **params})


@pytest.mark.parametrize(("compressor", "levels", "world", "message"), [
    ({"name": "powersgd"}, [2, 0], 2, "scheduler.levels: expected an integer >= 1, got 0"),
    ({"name": "topk"}, [0.5, 1.5], 2, "scheduler.levels: expected a number in (0, 1], got 1.5"),
    ({"name": "powersgd"}, [2, 2], 2, "scheduler.levels: expected distinct levels, got [2, 2]"),
    ({"name": "none"}, None, 2, "scheduler.levels: compressor 'none' has no levels to choose"),
    ({"name": "powersgd"}, [2, 1], 1, "scheduler.name: accordion_auto measures the noise "
                                      "between workers' gradients; it needs >= 2 ranks"),
])
def test_bad_bounds_name_the_field(compressor, levels, world, message):
    scheduler = schedulers.build({"name": "accordion_auto", "levels": levels})
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        scheduler.validate(compression.build_compressor(OmegaConf.create(compressor)), 32, world)


@pytest.mark.parametrize(("params", "world", "message"), [
    ({"batches": [512, 100]}, 2, "scheduler.batches: expected an integer >= 512, got 100"),
    ({"batch_low": 30, "batches": [30, 60]}, 4, "scheduler.batch_low: the global batch 30 must "
                                                "be divisible by the world size 4"),
    ({"batch_low": 32, "batches": [32, 66]}, 4, "scheduler.batches: the global batch 66 must be "
                                                "divisible by the world size 4"),
    ({}, 1, "scheduler.name: accordion_batch_auto measures the noise"),
])
def test_bad_batches_name_the_field(params, world, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        schedulers.build({"name": "accordion_batch_auto", **params}).validate(
            compression.create("none"), 32, world)


def test_batch_defaults_double_batch_low():
    s = schedulers.build({"name": "accordion_batch_auto", "batch_low": 32})
    assert s.batches == [32, 64, 128, 256, 512, 1024]
    assert s.batch_sizes(7)["scheduler.batches[5]"] == 1024


# ---- the scheduler over every compressor with levels -------------------------------------------
@pytest.mark.parametrize("name", compression.with_levels())
def test_every_compressor_with_levels_gets_measured_endpoints(name):
    # Two simulated learners (AllWorkers, as run.py drives them), interval 1: epoch 0 at the
    # first candidate; from epoch 1 each layer at a chosen candidate, with why logged.
    from training.simulated import AllWorkers, WorkerRNG

    compressor = compression.create(name)
    levels = list(dict.fromkeys(compressor.accordion_levels))
    net = model()
    params = list(net.named_parameters())
    comms = SimComm.group(WORKERS)
    hook = AllWorkers([HookState(compressor, params, comm=c) for c in comms], WorkerRNG([0, 1]))
    scheduler = schedulers.build({"name": "accordion_auto", "levels": levels, "interval": 1,
                                  "probe_steps": 2})
    scheduler.validate(compressor, 32, WORKERS)
    grads = local_grads(params, WORKERS, 3)
    for epoch in range(3):
        row = scheduler.start_epoch(epoch, hook)
        scheduler.batch_size(epoch, 32)
        hook.reset_epoch(epoch)
        for step in grads:
            buffers = [g.clone() for g in step]
            for f in [s.aggregate([n for n, _ in params], views(b, params), b)
                      for s, b in zip(hook.states, buffers, strict=True)]:
                f.wait()
            for s in hook.states:
                s.stats.step += 1
        layers = hook.compressed_layers()
        used = {n: row[f"level/{n}"] for n in layers}
        assert all(s.layers[n].level == used[n] for s in hook.states for n in layers)
        if epoch == 0:
            assert set(used.values()) == {levels[0]}
        out = scheduler.end_epoch(epoch, hook.grad_norms(), 0.1, 0.1)
        for n in layers:
            assert out[f"auto/low/{n}"] in levels and out[f"auto/high/{n}"] in levels
            assert f"auto/error@{levels[-1]}/{n}" in out and out[f"auto/noise/{n}"] >= 0
    again = schedulers.build({"name": "accordion_auto", "levels": levels, "interval": 1,
                              "probe_steps": 2})
    again.load_state_dict(scheduler.state_dict())
    assert again.state_dict() == scheduler.state_dict()


def test_a_bad_bound_stops_the_run_with_one_line(tmp_path):
    from tests.conftest import TINY, run_cli

    proc = run_cli([*TINY, "compressor=powersgd", "scheduler=accordion_auto",
                    "scheduler.levels=[2,0]", "launcher=simulated", "trainer.workers=2",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("error: scheduler.levels: expected an "
                                                   "integer >= 1, got 0")
    assert "Traceback" not in proc.stderr and not (tmp_path / "metrics.jsonl").exists()
