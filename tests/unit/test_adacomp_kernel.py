"""AdaComp's C kernel (compression/kernels/adacomp.c) against the eager torch path: bit for bit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import compression
from compression import _adacomp_kernel as adacomp_kernel
from compression.adacomp import AdaComp, pack_groups, unpack_groups
from compression.base import Layer
from core.native import NO_AVX512_ENV, PORTABLE_ENV, STALE_S
from tests.conftest import ROOT
from tests.references import (
    assert_outputs,
    assert_same_bits,
    bits_of,
    random_steps,
    ref_adacomp,
    require_kernel,
    simulate_run,
    without_a_compiler,
)


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


@pytest.mark.parametrize("ramp", [1.0, -1.0])
def test_adacomp_kernel_long_bins_are_bitwise_the_eager_path(
        ramp: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # Long bins (the kernel selects them whole, not pipelined with the next) with |dW| growing
    # along each bin (ramp 1: g_max at its end, many sent late) or shrinking (ramp -1); two
    # workers, five steps.
    require_kernel(adacomp_kernel.LIBRARY)
    shape, bin_size = (3, 4000), 3000
    steps = random_steps(shape, 2, 5, seed=5)
    rise = torch.linspace(0.0, 100.0, math.prod(shape)).view(shape)
    for step in steps:
        for g in step:
            sign = torch.where(g < 0, -1.0, 1.0)
            g.copy_((g.abs() + (rise if ramp > 0 else rise.flip(1))) * sign)
    params = {"fc_bin_size": bin_size}
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


BITWISE = ["tests/unit/test_adacomp_kernel.py::" + name for name in (
    "test_adacomp_kernel_is_bitwise_the_eager_path",
    "test_adacomp_kernel_aggregate_is_bitwise_the_eager_path",
    "test_adacomp_kernel_level_change_is_bitwise_the_eager_path",
    "test_adacomp_kernel_long_bins_are_bitwise_the_eager_path",
    "test_adacomp_decompress_sums_workers_in_order")] + ["tests/unit/test_adacomp_threshold.py"]


@pytest.mark.slow
@pytest.mark.parametrize(("env", "tests"), [
    (PORTABLE_ENV, [*BITWISE, "tests/unit/test_topk_kernel.py"]),
    (NO_AVX512_ENV, BITWISE)], ids=["portable", "avx2"])
def test_other_kernel_loops_are_bitwise_the_eager_path(env: str, tests: list[str]) -> None:
    # Where the CPU has AVX2 the kernels take their AVX2 paths, and AdaComp's decompress its
    # AVX-512 one where the CPU has that; with NO_AVX512_ENV set it takes the AVX2 one, with
    # PORTABLE_ENV the kernels take their portable loops, which must pass the same bit-for-bit
    # tests.
    require_kernel(adacomp_kernel.LIBRARY)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, env: "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_adacomp_kernel_builds_into_the_cache(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    require_kernel(adacomp_kernel.LIBRARY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "accordion-bench"
    cache.mkdir()
    stale, recent = cache / "adacomp_0123456789abcdef.so", cache / "adacomp_fedcba9876543210.so"
    for old in (stale, recent):  # builds of other sources: one unused for long, one recent
        old.write_bytes(b"")
    os.utime(stale, (time.time() - STALE_S - 60, time.time() - STALE_S - 60))
    adacomp_kernel.LIBRARY.reset()
    try:
        assert adacomp_kernel.kernel() is not None
    finally:
        adacomp_kernel.LIBRARY.reset()
    assert recent.exists() and not stale.exists()
    [built] = set(cache.iterdir()) - {recent}
    assert built.suffix == ".so"


def test_adacomp_without_a_compiler_warns_once_and_runs_eager(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = random_steps((50, 20), 2, steps=3)
    with without_a_compiler(adacomp_kernel.LIBRARY, tmp_path, monkeypatch) as record:
        got = compression.simulate("adacomp", steps, fc_bin_size=50)
    assert len(record) == 1
    assert_outputs(got, ref_adacomp(steps, 50)[0])


@pytest.mark.parametrize("settled", [True, False])
def test_a_state_written_by_the_kernel_resumes_where_it_cannot_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settled: bool) -> None:
    # Memories written where the kernel ran (a CPU run's checkpoint), saved and loaded as a
    # checkpoint is, then continued where it cannot run (CUDA; here, the eager path the kernel
    # leaves to): bit for bit the run that never stopped. settled=False: the memory as the
    # kernel leaves it between steps, its G_q still owed, which settle() must pay in torch ops
    # (on CUDA, handing the residue to the C kernel would pass it a device pointer).
    require_kernel(adacomp_kernel.LIBRARY)
    shape, bin_size, workers = (30, 17), 5, 2
    steps = adacomp_grads(shape, workers, 6, bin_size)

    def run() -> compression.Simulation:
        return compression.Simulation("adacomp", workers, shape, conv_bin_size=bin_size,
                                      fc_bin_size=bin_size)

    whole = run()
    want = [whole.step(grads) for grads in steps]
    final = [whole.memory(w)["residue"] for w in range(workers)]
    first = run()
    for grads in steps[:3]:
        first.step(grads)
    memories = [first.memory(w) if settled else dict(first.layers[w].memory)
                for w in range(workers)]
    assert settled or all("owed" in memory for memory in memories)
    torch.save(memories, tmp_path / "memories.pt")
    eager_adacomp(monkeypatch)
    resumed = run()
    for layer, memory in zip(resumed.layers, torch.load(tmp_path / "memories.pt"), strict=True):
        layer.memory = memory
    got = [resumed.step(grads) for grads in steps[3:]]
    for (out, bits), (out_w, bits_w) in zip(got, want[3:], strict=True):
        assert torch.equal(bits_of(out), bits_of(out_w)) and bits == bits_w
    for w in range(workers):
        assert torch.equal(bits_of(resumed.memory(w)["residue"]), bits_of(final[w]))
