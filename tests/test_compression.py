"""Compressors on simulated workers (``compression.simulate``) against naive references.

The references below are written from the papers' algorithms, element by element where that is
clearer, in float64; the compressors run in float32, hence the tolerances.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compression
from compression import _adacomp_kernel as adacomp_kernel
from compression._native import PORTABLE_ENV
from compression.adacomp import AdaComp, pack_groups, unpack_groups
from compression.base import Layer
from compression.comm import SimComm, Steps, all_gather_varlen, drive
from compression.powersgd import initial_q
from compression.topk import SAMPLE, top_k_indices
from core.errors import ConfigError
from tests.conftest import (
    ROOT,
    assert_same_bits,
    bits_of,
    require_kernel,
    simulate_run,
    without_a_compiler,
)

WORKERS = (1, 2, 3)
SHAPES = ((6, 40), (8, 3, 3, 3), (50, 20), (30, 7))


def random_steps(shape: tuple[int, ...], workers: int, steps: int, seed: int = 0
                 ) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=gen) for _ in range(workers)] for _ in range(steps)]


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


def ref_adacomp(steps: list[list[torch.Tensor]], bin_size: int, soft: bool = True
                ) -> tuple[list[torch.Tensor], list[list[int]], list[torch.Tensor]]:
    """Chen et al. Alg. 2, bin by bin, element by element (float64).

    Returns the mean outputs, the paper's bits per worker per step, and the final residues.
    """
    n = steps[0][0].numel()
    residues = [torch.zeros(n, dtype=torch.float64) for _ in steps[0]]
    outs, bits = [], []
    for grads in steps:
        quantized, step_bits = [], []
        for w, g in enumerate(grads):
            dw = g.double().reshape(-1)
            big_g = residues[w] + dw
            h = big_g + dw
            bins = [range(i, min(i + bin_size, n)) for i in range(0, n, bin_size)]
            g_max = [max(abs(float(big_g[j])) for j in b) for b in bins]
            s = sum(g_max) / len(g_max)
            g_q = torch.zeros(n, dtype=torch.float64)
            for b, gm in zip(bins, g_max, strict=True):
                if soft:
                    chosen = [j for j in b if abs(float(h[j])) >= gm]
                else:
                    chosen = [max(b, key=lambda j: abs(float(big_g[j])))]
                for j in chosen:
                    g_q[j] = math.copysign(s, float(big_g[j])) if big_g[j] != 0 else 0.0
            residues[w] = big_g - g_q
            sent = int((g_q != 0).sum())
            step_bits.append(sent * (8 if bin_size < 64 else 16) + 32)
            quantized.append(g_q)
        outs.append(torch.stack(quantized).mean(0).reshape(grads[0].shape))
        bits.append(step_bits)
    return outs, bits, residues


def assert_outputs(got: list[tuple[torch.Tensor, list[int]]], want: list[torch.Tensor],
                   atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for (out, _), ref in zip(got, want, strict=True):
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=1e-4)


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


# ---- AdaComp's C kernel: bit-identical to the eager torch path -----------------------------
def adacomp_grads(shape: tuple[int, ...], workers: int, steps: int, bin_size: int
                  ) -> list[list[torch.Tensor]]:
    """Gradients with the awkward cases: ties (small integers, so |H| = g_max often), exact
    zeros and -0.0, a whole bin of zeros, and plain random values."""
    grads = random_steps(shape, workers, steps, seed=11)
    for t, step in enumerate(grads):
        for g in step:
            flat = g.view(-1)
            if t % 2 == 0:                                  # ties, and many exact zeros
                flat.copy_(flat.mul(2).round())
            flat[bin_size:2 * bin_size] = 0.0               # the second bin: all zeros
            flat[bin_size::3] = -0.0
    return grads


def eager_adacomp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make AdaComp use its eager torch path (as on CUDA or without a C compiler)."""
    monkeypatch.setattr(adacomp_kernel, "kernel", lambda: None)


@pytest.mark.parametrize(("shape", "bin_size"), [
    ((7, 13), 5), ((50, 20), 50), ((64, 3, 3, 3), 50), ((300, 41), 500), ((10, 10), 1),
    ((10, 10), 1000), ((120, 301), 5000)])
@pytest.mark.parametrize("soft", [True, False])
def test_adacomp_kernel_is_bitwise_the_eager_path(shape: tuple[int, ...], bin_size: int,
                                                  soft: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernel(adacomp_kernel.LIBRARY)
    grads = adacomp_grads(shape, 1, steps=6, bin_size=bin_size)
    compressor = AdaComp(soft_threshold=soft)

    def run() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        layer = Layer("layer", torch.Size(shape), bin_size)
        layer.memory["residue"] = torch.zeros(math.ceil(math.prod(shape) / bin_size) * bin_size)
        out = []
        for t, (g,) in enumerate(grads):
            grad = g.clone().view(-1)
            layer.memory["residue"][1] = 100.0            # G = 0, |H| = 100 >= g_max: not sent
            grad[1] = -100.0
            message = torch.full((4 + 2 * size,), 0xAA, dtype=torch.uint8)
            [count] = compressor._compress([layer], [grad], message, [4], [size])
            scale = message[:4].view(torch.float32).clone()
            residue = None
            if t in (2, len(grads) - 1):                  # the steps between: G_q stays owed
                compressor.settle(layer)
                residue = layer.memory["residue"].clone()
            out.append((message, count, scale, residue))
        return out

    size = adacomp_kernel.group_bytes(math.prod(shape), bin_size)
    fused = run()
    eager_adacomp(monkeypatch)
    for (message, count, scale, residue), (message_e, count_e, scale_e, residue_e) in zip(
            fused, run(), strict=True):
        assert torch.equal(message, message_e) and count == count_e
        sent = unpack_groups(message[4:4 + size], math.prod(shape), bin_size)
        assert int(sent.sum()) == count and not sent[1]   # the G = 0 element is not sent
        assert torch.equal(bits_of(scale), bits_of(scale_e))
        assert (residue is None) == (residue_e is None)
        if residue is not None:
            assert torch.equal(bits_of(residue), bits_of(residue_e))


@pytest.mark.parametrize(("shape", "bin_size", "soft"), [((30, 7), 4, True), ((6, 40), 50, True),
                                                         ((50, 20), 7, False)])
def test_adacomp_kernel_aggregate_is_bitwise_the_eager_path(
        shape: tuple[int, ...], bin_size: int, soft: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Three workers: the received elements are summed in the same order as index_add_ does.
    require_kernel(adacomp_kernel.LIBRARY)
    steps = adacomp_grads(shape, 3, steps=5, bin_size=bin_size)
    params = {"fc_bin_size": bin_size, "soft_threshold": soft}
    fused = simulate_run("adacomp", shape, steps, "residue", **params)
    eager_adacomp(monkeypatch)
    assert_same_bits(fused, simulate_run("adacomp", shape, steps, "residue", **params))


@pytest.mark.parametrize("new_bin_size", [4, 64, 30])
def test_adacomp_kernel_level_change_is_bitwise_the_eager_path(
        new_bin_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bin size change while G_q is owed: the owed bits are laid out by bin, so they are
    # settled first (30 -> 30: same padding, same layout; 4 and 64: new ones).
    require_kernel(adacomp_kernel.LIBRARY)
    shape = (12, 20)
    steps = adacomp_grads(shape, 2, steps=6, bin_size=30)

    def run() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        sim = compression.Simulation("adacomp", 2, shape, fc_bin_size=30)
        outs = []
        for t, grads in enumerate(steps):
            if t == 3:
                sim.set_level(new_bin_size)
            outs.append(sim.step(grads)[0])
        return outs, [sim.memory(w)["residue"] for w in range(2)]

    fused, fused_res = run()
    eager_adacomp(monkeypatch)
    eager, eager_res = run()
    for out, out_e in zip(fused + fused_res, eager + eager_res, strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e))


@pytest.mark.parametrize(("n", "bin_size"), [(9000, 50), (9000, 4096), (3, 500), (77, 7)])
def test_adacomp_decompress_sums_workers_in_order(n: int, bin_size: int) -> None:
    # Two workers, two layers each: the group-byte layout (packed by the torch code) read by
    # the kernel, with blocks, bins and short groups of several sizes.
    require_kernel(adacomp_kernel.LIBRARY)
    gen = torch.Generator().manual_seed(n + bin_size)
    sent = [torch.rand(2, n, generator=gen) < 0.3 for _ in range(2)]   # [layer][worker]
    negative = [torch.rand(2, n, generator=gen) < 0.5 for _ in range(2)]
    scale = torch.tensor([[1.0, 0.5], [2.0, 6.0]])                      # [layer, worker]
    value = scale / 2                                                   # s_w / W
    size = adacomp_kernel.group_bytes(n, bin_size)
    offsets = [8, 8 + 2 * size]
    messages = torch.zeros(2, 8 + 4 * size, dtype=torch.uint8)
    for layer, at in enumerate(offsets):
        for w in range(2):
            messages[w, 4 * layer:4 * layer + 4] = scale[layer, w:w + 1].view(torch.uint8)
            messages[w, at:at + size] = pack_groups(sent[layer][w], n, bin_size)
            messages[w, at + size:at + 2 * size] = pack_groups(negative[layer][w], n, bin_size)
    outs = [torch.full((n,), 7.0), torch.full((n,), 7.0)]
    adacomp_kernel.decompress(adacomp_kernel.kernel(), outs, [bin_size, bin_size], messages,
                              offsets, [size, size])
    for layer in range(2):
        expected = torch.zeros(n)
        for w in range(2):
            g_q = torch.where(negative[layer][w], -value[layer, w], value[layer, w])
            expected += torch.where(sent[layer][w], g_q, 0.0)
        assert torch.equal(bits_of(outs[layer]), bits_of(expected))


@pytest.mark.parametrize(("n", "bin_size"), [(100, 50), (101, 50), (5, 500), (64, 8), (9, 3)])
def test_adacomp_group_bytes_round_trip(n: int, bin_size: int) -> None:
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.5
    packed = pack_groups(mask, n, bin_size)
    assert packed.numel() == adacomp_kernel.group_bytes(n, bin_size)
    assert torch.equal(unpack_groups(packed, n, bin_size), mask)


@pytest.mark.slow
def test_portable_kernel_loops_are_bitwise_the_eager_path() -> None:
    # Where the CPU has AVX2 the kernels take their AVX2 paths; with PORTABLE_ENV set they take
    # their portable loops, which must pass the same bit-for-bit tests.
    require_kernel(adacomp_kernel.LIBRARY)
    tests = ["tests/test_compression.py::" + name for name in (
        "test_adacomp_kernel_is_bitwise_the_eager_path",
        "test_adacomp_kernel_aggregate_is_bitwise_the_eager_path",
        "test_adacomp_kernel_level_change_is_bitwise_the_eager_path",
        "test_adacomp_decompress_sums_workers_in_order")] + ["tests/test_topk_kernel.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, PORTABLE_ENV: "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_adacomp_kernel_builds_into_the_cache(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernel(adacomp_kernel.LIBRARY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stale = tmp_path / "accordion-bench" / "adacomp_0123456789abcdef.so"  # an older build
    stale.parent.mkdir()
    stale.write_bytes(b"")
    adacomp_kernel.LIBRARY.reset()
    try:
        assert adacomp_kernel.kernel() is not None
    finally:
        adacomp_kernel.LIBRARY.reset()
    [built] = (tmp_path / "accordion-bench").iterdir()
    assert built.suffix == ".so" and built != stale


def test_adacomp_without_a_compiler_warns_once_and_runs_eager(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = random_steps((50, 20), 2, steps=3)
    with without_a_compiler(adacomp_kernel.LIBRARY, tmp_path, monkeypatch) as record:
        got = compression.simulate("adacomp", steps, fc_bin_size=50)
    assert len(record) == 1
    assert_outputs(got, ref_adacomp(steps, 50)[0])


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
    ("topk", {"rank": 2}, "compressor.rank"),
    ("qsgd", {}, "compressor.name"),
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
