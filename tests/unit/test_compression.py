"""Compressors on simulated workers (``compression.simulate``) against naive references.

The references below are written from the papers' algorithms, element by element where that is
clearer, in float64; the compressors run in float32, hence the tolerances.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

import compression
from compression import _topk_kernel as topk_kernel
from compression.base import Layer
from compression.comm import SimComm, Steps, all_gather_varlen, drive
from compression.powersgd import initial_q
from compression.topk import SAMPLE, TopK, kept_indices, kept_indices_on_device, top_k_indices
from core.errors import ConfigError
from tests.references import assert_outputs, bits_of, random_steps, ref_adacomp

WORKERS = (1, 2, 3)
SHAPES = ((6, 40), (8, 3, 3, 3), (50, 20), (30, 7))


def dense_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([g.double() for g in grads]).mean(0)


# ---- naive references ---------------------------------------------------------------------
def ref_powersgd_step(grads: list[torch.Tensor], errors: list[torch.Tensor], q: torch.Tensor
                      ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One step of Vogels et al. Alg. 1 + 2, orthogonalizing with QR (float64)."""
    n, m = errors[0].shape
    ms = [g.double().reshape(n, m) + e for g, e in zip(grads, errors, strict=True)]
    p, _ = torch.linalg.qr(sum(mat @ q for mat in ms))
    q = sum(mat.T @ p for mat in ms) / len(ms)
    out = p @ q.T
    return out.reshape(grads[0].shape), [mat - out for mat in ms], q


def ref_powersgd(steps: list[list[torch.Tensor]], rank: int, seed: int = 0) -> list[torch.Tensor]:
    shape = steps[0][0].shape
    n, m = shape[0], math.prod(shape[1:])
    q = initial_q(seed, "layer", m, min(rank, n, m)).double()
    errors = [torch.zeros(n, m, dtype=torch.float64) for _ in steps[0]]
    outs = []
    for grads in steps:
        out, errors, q = ref_powersgd_step(grads, errors, q)
        outs.append(out)
    return outs


def ref_topk(steps: list[list[torch.Tensor]], ratio: float) -> list[torch.Tensor]:
    """Keep the k largest |g + e| per worker (a full sort), mean of the sparse tensors."""
    errors = [torch.zeros(steps[0][0].numel(), dtype=torch.float64) for _ in steps[0]]
    outs = []
    for grads in steps:
        sparse = []
        for w, g in enumerate(grads):
            acc = g.double().reshape(-1) + errors[w]
            k = max(1, math.floor(ratio * acc.numel()))
            keep = torch.argsort(acc.abs(), descending=True)[:k]
            s = torch.zeros_like(acc)
            s[keep] = acc[keep]
            errors[w] = acc - s
            sparse.append(s)
        outs.append(torch.stack(sparse).mean(0).reshape(grads[0].shape))
    return outs


def ref_topk_authors(steps: list[list[torch.Tensor]], ratio: float) -> list[torch.Tensor]:
    """The Accordion authors' Top-K: each worker's k largest |g| (a full sort, no memory), and
    the plain SUM of the workers' sparse tensors."""
    outs = []
    for grads in steps:
        total = torch.zeros(grads[0].numel(), dtype=torch.float64)
        for g in grads:
            flat = g.double().reshape(-1)
            keep = torch.argsort(flat.abs(), descending=True)[:max(1, math.floor(ratio *
                                                                                flat.numel()))]
            total[keep] += flat[keep]
        outs.append(total.reshape(grads[0].shape))
    return outs


# ---- each compressor against its reference --------------------------------------------------
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_powersgd_matches_reference(workers: int, shape: tuple[int, ...], rank: int) -> None:
    steps = random_steps(shape, workers, steps=5)
    got = compression.simulate("powersgd", steps, rank=rank)
    assert_outputs(got, ref_powersgd(steps, rank), atol=1e-4)
    n, m = shape[0], math.prod(shape[1:])
    r = min(rank, n, m)
    assert {b for _, bits in got for b in bits} == {32 * (n + m) * r}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.1, 0.01])
def test_topk_matches_reference(workers: int, shape: tuple[int, ...], ratio: float) -> None:
    steps = random_steps(shape, workers, steps=5)
    got = compression.simulate("topk", steps, ratio=ratio)
    assert_outputs(got, ref_topk(steps, ratio))
    k = max(1, math.floor(ratio * math.prod(shape)))
    assert {b for _, bits in got for b in bits} == {64 * k}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.1, 0.01])
def test_topk_authors_matches_reference(workers: int, shape: tuple[int, ...], ratio: float
                                        ) -> None:
    steps = random_steps(shape, workers, steps=3)
    got = compression.simulate("topk", steps, ratio=ratio, error_feedback=False, reduce="sum")
    assert_outputs(got, ref_topk_authors(steps, ratio), atol=1e-5)


def test_powersgd_restart_on_rank_change_gives_a_fresh_q() -> None:
    # The authors rebuild a layer's reducer on a rank change: Q restarts as a fresh start's
    # (the same seed), the error memory stays. Ours keeps the warm start: another result.
    shape, steps = (30, 40), random_steps((30, 40), 2, steps=3, seed=4)
    runs = {}
    for restart in (True, False):
        sim = compression.Simulation("powersgd", 2, shape, rank=2, seed=7,
                                     restart_on_rank_change=restart)
        for grads in steps[:2]:
            sim.step(grads)
        errors = [sim.compressor.error(layer).clone() for layer in sim.layers]
        sim.set_level(1)
        runs[restart] = sim.step(steps[2])[0]
    fresh = compression.Simulation("powersgd", 2, shape, rank=1, seed=7)
    for layer, error in zip(fresh.layers, errors, strict=True):
        layer.memory["error"] = error.reshape(-1).clone()
    assert torch.equal(runs[True], fresh.step(steps[2])[0])
    assert not torch.allclose(runs[True], runs[False], atol=1e-4)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("bin_size", "soft"), [(7, True), (50, True), (64, True), (7, False),
                                                (1000, False)])
def test_adacomp_matches_reference(workers: int, shape: tuple[int, ...], bin_size: int,
                                   soft: bool) -> None:
    steps = random_steps(shape, workers, steps=5)
    got = compression.simulate("adacomp", steps, conv_bin_size=bin_size, fc_bin_size=bin_size,
                               soft_threshold=soft)
    outs, bits, _ = ref_adacomp(steps, bin_size, soft)
    assert_outputs(got, outs)
    assert [b for _, b in got] == bits


def test_adacomp_bin_size_by_layer_kind() -> None:
    conv = compression.Simulation("adacomp", 1, (4, 2, 3, 3), conv_bin_size=5, fc_bin_size=9)
    fc = compression.Simulation("adacomp", 1, (4, 18), conv_bin_size=5, fc_bin_size=9)
    assert (conv.layers[0].level, fc.layers[0].level) == (5, 9)
    steps = random_steps((4, 18), 2, steps=3)
    got = compression.simulate("adacomp", steps, conv_bin_size=5, fc_bin_size=9)
    assert_outputs(got, ref_adacomp(steps, 9)[0])


# ---- shared plumbing: variable-length exchange --------------------------------------------
def test_all_gather_varlen_returns_every_message() -> None:
    messages = [torch.arange(n, dtype=torch.int32) + 10 * w for w, n in enumerate([3, 0, 5])]

    def steps(w: int) -> Steps[list[torch.Tensor]]:
        return (yield from all_gather_varlen(comms[w], messages[w]))

    comms = SimComm.group(3)
    futures = [drive(steps(w)) for w in range(3)]
    for fut in futures:
        assert [p.tolist() for p in fut.value()] == [m.tolist() for m in messages]


def test_simulated_all_gather_shares_one_result_unless_given_a_buffer() -> None:
    # W simulated workers must hold W messages, not W^2: without an output buffer every worker
    # gets the one gathered tensor; a buffer of a worker's own still receives its copy.
    comms = SimComm.group(3)
    messages = [torch.full((2,), float(w)) for w in range(3)]
    shared = [comms[w].all_gather(messages[w]) for w in range(3)]
    assert all(p.future.done() for p in shared)
    assert len({p.result.data_ptr() for p in shared}) == 1
    assert shared[0].result.tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    own = torch.zeros(6)
    given = [comms[w].all_gather(messages[w], own if w == 1 else None) for w in range(3)]
    assert given[1].result is own and own.tolist() == shared[0].result.tolist()
    assert given[0].result is given[2].result and given[0].result.data_ptr() != own.data_ptr()


@pytest.mark.parametrize("name", ["topk", "adacomp", "ef_signsgd"])
def test_simulated_gather_compressors_keep_no_gather_buffer_per_worker(name: str) -> None:
    sim = compression.Simulation(name, 4, (8, 6))
    sim.step([torch.randn(8, 6) for _ in range(4)])
    slots = {key[0] for key in sim.compressor._scratch._buffers}
    assert "message" in slots and "gathered" not in slots


# ---- limits: no compression at the top level ------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 40), (40, 6), (5, 2, 2, 2)])
def test_powersgd_full_rank_is_dense_mean(shape: tuple[int, ...]) -> None:
    steps = random_steps(shape, 3, steps=4)
    got = compression.simulate("powersgd", steps, rank=min(shape[0], math.prod(shape[1:])))
    assert_outputs(got, [dense_mean(g) for g in steps], atol=1e-6)


def test_powersgd_exact_on_low_rank_gradients() -> None:
    # Rank-2 gradients on every worker: the rank-2 compression (which does compress a 30 x 40
    # matrix) must return the exact mean from the first step on.
    gen = torch.Generator().manual_seed(1)
    u, v = torch.randn(30, 2, generator=gen), torch.randn(2, 40, generator=gen)
    steps = [[u @ (torch.randn(2, 2, generator=gen) @ v) for _ in range(2)] for _ in range(3)]
    got = compression.simulate("powersgd", steps, rank=2)
    assert got[0][1] == [32 * 70 * 2] * 2
    assert_outputs(got, [dense_mean(g) for g in steps], atol=1e-5)


def test_topk_full_ratio_is_dense_mean() -> None:
    steps = random_steps((12, 5, 3, 3), 3, steps=4)
    assert_outputs(compression.simulate("topk", steps, ratio=1.0),
                   [dense_mean(g) for g in steps], atol=1e-6)


@pytest.mark.parametrize("name", compression.available())
def test_vectors_go_dense(name: str) -> None:
    steps = random_steps((17,), 2, steps=2)
    got = compression.simulate(name, steps)
    assert_outputs(got, [dense_mean(g) for g in steps], atol=1e-6)
    assert [b for _, b in got] == [[32 * 17] * 2] * 2


# ---- Top-K selection on large tensors ----------------------------------------------------
@pytest.mark.parametrize("ratio", [0.99, 0.25, 0.1, 0.02, 1e-5])
@pytest.mark.parametrize("kind", ["normal", "ties", "sample-too-high", "sample-too-low"])
def test_top_k_indices_is_exact(ratio: float, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 6 * SAMPLE + 123
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen).abs()
    if kind == "ties":
        a[a < 1.0] = 0.0                          # many exact zeros
        a[::7] = 0.5                              # and many equal values
    elif kind.startswith("sample"):               # a sample that brackets the wrong values
        order = a.argsort(descending=kind == "sample-too-high")
        monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: order[:SAMPLE])
    k = max(1, math.floor(ratio * n))
    got = top_k_indices(a, k)
    assert got.numel() == k and got.unique().numel() == k
    want = torch.topk(a, k).values
    torch.testing.assert_close(a[got].sort(descending=True).values, want, atol=0, rtol=0)


@pytest.mark.parametrize("n", [1, 7, 1000, 4 * SAMPLE + 77])  # the last: kept_indices samples
def test_on_device_selection_is_kept_indices(n: int) -> None:
    # CUDA's selection (no nonzero: nothing read back to the host) keeps exactly the set and
    # order of kept_indices: the largest keys, the first of the ties at the k-th, ascending.
    gen = torch.Generator().manual_seed(n)
    key = torch.randint(0, 40, (n,), generator=gen, dtype=torch.int32)  # ties everywhere
    for k in sorted({1, max(n // 10, 1), max(n // 2, 1), n // 2 + 1, max(n - 1, 1), n} - {0}):
        got = kept_indices_on_device(key, k)
        assert got.dtype == torch.int64 and torch.equal(got, kept_indices(key, k)), (n, k)


@pytest.mark.parametrize("world", [3, 4])
def test_topk_decode_adds_each_workers_message_in_worker_order(world: int, monkeypatch) -> None:
    # Overlapping supports: elements sum several workers' values. One index_add_ per worker (its
    # indices distinct: deterministic on CUDA too) gives, on the CPU, the bits of the single
    # index_add_ over every message in rank order that it replaced.
    monkeypatch.setattr(topk_kernel, "kernel", lambda: None)  # the eager path, as on CUDA
    gen = torch.Generator().manual_seed(world)
    n, k = 500, 200
    parts = torch.empty(world, 2 * k, dtype=torch.int32)
    for w in range(world):
        parts[w, :k].view(torch.float32).copy_(torch.randn(k, generator=gen))
        parts[w, k:] = torch.randperm(n, generator=gen)[:k].sort().values
    for reduce, alpha in (("mean", 1 / world), ("sum", 1.0)):
        out = torch.full((n,), math.nan)
        TopK(reduce=reduce).decompress(Layer("w", torch.Size([n])), parts, out)
        single = torch.zeros(n).index_add_(0, parts[:, k:].reshape(-1),
                                           parts[:, :k].reshape(-1).view(torch.float32),
                                           alpha=alpha)
        assert torch.equal(bits_of(out), bits_of(single))


@pytest.mark.parametrize("ratio", [0.99, 0.25, 0.02])
def test_topk_large_layer_matches_reference(ratio: float) -> None:
    steps = random_steps((300, 400), 2, steps=3)
    assert_outputs(compression.simulate("topk", steps, ratio=ratio), ref_topk(steps, ratio))


# ---- levels ---------------------------------------------------------------------------------
def test_set_level_changes_bits() -> None:
    shape, (n, m) = (20, 3, 2, 2), (20, 12)
    grads = random_steps(shape, 2, steps=1)[0]
    psgd = compression.Simulation("powersgd", 2, shape, rank=1)
    topk = compression.Simulation("topk", 2, shape, ratio=0.5)
    ada = compression.Simulation("adacomp", 2, shape, conv_bin_size=100)
    before = [s.step(grads)[1][0] for s in (psgd, topk, ada)]
    for sim, level in ((psgd, 3), (topk, 0.25), (ada, 10)):
        sim.set_level(level)
    after = [s.step(grads)[1][0] for s in (psgd, topk, ada)]
    assert before[:2] == [32 * (n + m) * 1, 64 * 120] and after[:2] == [32 * (n + m) * 3, 64 * 60]
    # 16-bit encoding for L_T >= 64, 8-bit below; smaller bins send more elements.
    assert (before[2] - 32) % 16 == 0 and after[2] > before[2] // 2


@pytest.mark.parametrize("new_rank", [1, 3])
def test_powersgd_rank_change_keeps_warm_start(new_rank: int) -> None:
    # Down: P = M Q[:, :r] with the warm Q. Up: the warm columns, then the layer's initial ones.
    shape, seed = (30, 40), 5
    sim = compression.Simulation("powersgd", 2, shape, rank=2, seed=seed)
    steps = random_steps(shape, 2, steps=3)
    sim.step(steps[0])
    sim.step(steps[1])
    warm = sim.layers[0].memory["q"].double()
    errors = [sim.compressor.error(layer).double() for layer in sim.layers]
    sim.set_level(new_rank)
    got = sim.step(steps[2])[0]
    q = torch.cat([warm, initial_q(seed, "layer", 40, 3)[:, 2:].double()], 1)[:, :new_rank]
    want = ref_powersgd_step(steps[2], errors, q)[0]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    assert sim.layers[0].memory["q"].shape == (40, new_rank)
    # Restarting Q from random (the authors' code) would give another result.
    restart = ref_powersgd_step(steps[2], errors, initial_q(seed + 1, "x", 40, new_rank).double())
    assert not torch.allclose(got.double(), restart[0], atol=1e-3)


def test_initial_q_columns_do_not_depend_on_rank() -> None:
    assert initial_q(5, "layer", 40, 3)[:, :2].equal(initial_q(5, "layer", 40, 2))
    assert not initial_q(5, "layer", 40, 2).equal(initial_q(5, "other", 40, 2))


def test_powersgd_pointless_layer_goes_dense_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    steps = random_steps((3, 5), 2, steps=3)
    with caplog.at_level(logging.INFO, logger="compression.powersgd"):
        got = compression.simulate("powersgd", steps, rank=2)  # (3 + 5) 2 >= 15
    assert_outputs(got, [dense_mean(g) for g in steps], atol=1e-6)
    assert [b for _, b in got] == [[32 * 15] * 2] * 3
    assert len([r for r in caplog.records if "uncompressed" in r.getMessage()]) == 1


# ---- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "params", "field"), [
    ("powersgd", {"rank": 0}, "compressor.rank"),
    ("powersgd", {"rank": 1.5}, "compressor.rank"),
    ("powersgd", {"rank": True}, "compressor.rank"),
    ("topk", {"ratio": 0}, "compressor.ratio"),
    ("topk", {"ratio": 1.01}, "compressor.ratio"),
    ("topk", {"ratio": -0.5}, "compressor.ratio"),
    ("adacomp", {"conv_bin_size": 0}, "compressor.conv_bin_size"),
    ("adacomp", {"fc_bin_size": -3}, "compressor.fc_bin_size"),
    ("adacomp", {"soft_threshold": "yes"}, "compressor.soft_threshold"),
    ("adacomp", {"error_feedback": False}, "compressor.error_feedback"),
    ("topk", {"reduce": "max"}, "compressor.reduce"),
    ("topk", {"error_feedback": 1}, "compressor.error_feedback"),
    ("powersgd", {"restart_on_rank_change": "no"}, "compressor.restart_on_rank_change"),
    ("powersgd", {"error_feedback": None}, "compressor.error_feedback"),
    ("ef_signsgd", {"block_size": 0}, "compressor.block_size"),
    ("ef_signsgd", {"error_feedback": "true"}, "compressor.error_feedback"),
    ("topk", {"rank": 2}, "compressor.rank"),
    ("nonesuch", {}, "compressor.name"),
])
def test_bad_config_names_the_field(name: str, params: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        compression.create(name, **params)
    with pytest.raises(ConfigError, match=f"^{field}: "):
        compression.simulate(name, random_steps((4, 5), 1, steps=1), **params)


def test_bad_config_says_the_allowed_range() -> None:
    with pytest.raises(ConfigError, match=r"integer >= 1, got 0"):
        compression.create("powersgd", rank=0)
    with pytest.raises(ConfigError, match=r"in \(0, 1\], got 2"):
        compression.create("topk", ratio=2)


@pytest.mark.parametrize(("name", "level"), [("powersgd", 0), ("topk", 0.0), ("topk", 1.5),
                                             ("adacomp", 0), ("none", 1)])
def test_validate_level(name: str, level: float) -> None:
    with pytest.raises(ConfigError, match="^scheduler.low: "):
        compression.create(name).validate_level(level, "scheduler.low")


def test_levels_are_plain_numbers() -> None:
    assert type(compression.create("topk").validate_level(1)) is float
    assert type(compression.create("powersgd").validate_level(4)) is int


def test_build_compressor_reads_the_config_node() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"seed": 7, "compressor": {"name": "powersgd", "rank": 4,
                                                        "seed": "${seed}"}})
    c = compression.build_compressor(cfg.compressor)
    assert (c.rank, c.seed) == (4, 7)
    with pytest.raises(ConfigError, match="^compressor.rank: "):
        compression.build_compressor(OmegaConf.create({"name": "powersgd", "rank": 0}))


def test_simulate_rejects_ragged_steps() -> None:
    with pytest.raises(ValueError, match="^steps: "):
        compression.simulate("topk", [])
    with pytest.raises(ValueError, match="^steps: "):
        compression.simulate("topk", [[torch.ones(3, 4)], [torch.ones(3, 5)]])
    with pytest.raises(ValueError, match="^steps: "):
        compression.simulate("topk", [[torch.ones(3, 4)], [torch.ones(3, 4)] * 2])


# ---- the AdaComp paper's claim, scaled down -------------------------------------------------
def adacomp_descent(soft: bool, steps: int = 300) -> tuple[list[float], list[float]]:
    """Gradient descent on a quadratic through AdaComp with L_T = 5000: two workers, each with
    the full gradient plus a little noise of its own (a mini-batch); returns the largest
    |residue| and the loss after every step."""
    shape, lr, noise = (20, 1000), 0.1, 0.003
    gen = torch.Generator().manual_seed(0)
    curvature = torch.rand(shape, generator=gen) + 0.1
    optimum = torch.randn(shape, generator=gen)
    w = torch.zeros(shape)
    sim = compression.Simulation("adacomp", 2, shape, fc_bin_size=5000, soft_threshold=soft)
    residues, losses = [], []
    for _ in range(steps):
        grads = [curvature * (w - optimum) + noise * torch.randn(shape, generator=gen)
                 for _ in range(2)]
        w -= lr * sim.step(grads)[0]
        residues.append(max(float(sim.memory(worker)["residue"].abs().max())
                            for worker in range(2)))
        losses.append(float((curvature * (w - optimum) ** 2).mean()) / 2)
    return residues, losses


def test_adacomp_soft_threshold_bounds_residues() -> None:
    # Chen et al. Figs. 4-6: with the soft threshold the residues stay bounded even at
    # L_T = 5000; hard Local Selection (one element per bin) lets them grow without bound
    # (positive feedback through the scale s), and training diverges.
    soft_res, soft_loss = adacomp_descent(soft=True)
    hard_res, hard_loss = adacomp_descent(soft=False)
    assert max(soft_res[150:]) <= 1.5 * max(soft_res[:50])
    assert soft_loss[-1] < soft_loss[0] / 10
    assert hard_res[-1] > 3 * hard_res[100] and hard_res[-1] > 50 * max(soft_res)
    assert hard_loss[-1] > 5 * hard_loss[0]
