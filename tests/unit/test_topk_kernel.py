"""Top-K's C kernel (compression/kernels/topk.c) against the eager torch path: bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import compression
from compression import _topk_kernel as topk_kernel
from compression.base import Layer
from compression.comm import SimComm
from compression.topk import TopK
from tests.references import (
    assert_same_bits,
    bits_of,
    kernel_and_eager,
    require_kernel,
    simulate_run,
)

SHAPES = ((6, 40), (8, 3, 3, 3), (300, 400))  # 120000 > 4 * SAMPLE: the sampled path
# 0.005: the AVX2 message pass skips the vectors that keep nothing; 1e-7: k = 1
RATIOS = (1.0, 0.99, 0.5, 0.25, 0.1, 0.02, 0.005, 1e-7)


@pytest.fixture(autouse=True)
def _kernel_built() -> None:
    # Every test here needs the kernel: skipped without a C compiler, failed if it will not build.
    require_kernel(topk_kernel.LIBRARY)


def eager_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make Top-K use its eager torch path (as on CUDA or without a C compiler)."""
    monkeypatch.setattr(topk_kernel, "kernel", lambda: None)


def grads_with_ties(shape: tuple[int, ...], workers: int, steps: int, seed: int = 0
                    ) -> list[list[torch.Tensor]]:
    """Random gradients with many equal magnitudes: all equal at step 0 (e = 0 there), and
    +-0.25, +0 and -0 at steps 1, 4, ..."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        grads = [torch.randn(shape, generator=gen) for _ in range(workers)]
        for g in grads:
            flat = g.view(-1)
            if t == 0:
                flat.fill_(-1.5)
            elif t % 3 == 1:
                flat[flat.abs() < 0.5] = 0.0
                flat[2::7] = -0.0
                flat[::3] = 0.25
                flat[1::5] = -0.25
        out.append(grads)
    return out


def ref_kept(acc: torch.Tensor, k: int) -> torch.Tensor:
    """The rule: the k largest |acc|, of those equal to the k-th largest the first, ascending."""
    magnitude = acc.abs().double().tolist()
    order = sorted(range(len(magnitude)), key=lambda i: (-magnitude[i], i))
    return torch.tensor(sorted(order[:k]), dtype=torch.int32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ratio", RATIOS)
def test_kernel_message_and_error_are_bitwise_the_eager_path(
        shape: tuple[int, ...], ratio: float, monkeypatch: pytest.MonkeyPatch) -> None:
    grads = [g for (g,) in grads_with_ties(shape, 1, steps=6)]
    n = math.prod(shape)
    k = max(1, math.floor(ratio * n))

    def run() -> list[tuple[torch.Tensor, torch.Tensor]]:
        compressor, layer, out = TopK(ratio), Layer("layer", torch.Size(shape), ratio), []
        for g in grads:
            before = layer.memory.get("error", torch.zeros(n)) + g.view(-1)  # acc = g + e
            message = torch.empty(2 * k, dtype=torch.int32)
            compressor.compress(layer, g.clone().view(-1), message)
            assert torch.equal(message[k:], ref_kept(before, k))
            out.append((message, layer.memory["error"].clone()))
        return out

    fused = run()
    eager_topk(monkeypatch)
    for (message, error), (message_e, error_e) in zip(fused, run(), strict=True):
        assert torch.equal(message, message_e)
        assert torch.equal(bits_of(error), bits_of(error_e))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(("shape", "ratio"), [((6, 40), 1.0), ((8, 3, 3, 3), 0.99),
                                              ((100, 130), 0.99), ((300, 400), 0.25),
                                              ((300, 400), 0.02), ((30, 7), 1e-7)])
def test_kernel_aggregate_is_bitwise_the_eager_path(
        workers: int, shape: tuple[int, ...], ratio: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Three workers: 1/3 is inexact, so the sums must be rounded and ordered as index_add_'s.
    steps = grads_with_ties(shape, workers, steps=5, seed=workers)
    fused = simulate_run("topk", shape, steps, "error", ratio=ratio)
    eager_topk(monkeypatch)
    assert_same_bits(fused, simulate_run("topk", shape, steps, "error", ratio=ratio))


@pytest.mark.parametrize("workers", [2, 3])
def test_kernel_authors_variant_is_bitwise_the_eager_path(
        workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # No memory (acc = g + 0 in a scratch buffer) and the workers' sum (alpha = 1).
    steps = grads_with_ties((300, 400), workers, steps=3, seed=workers)
    params = {"ratio": 0.25, "error_feedback": False, "reduce": "sum"}

    def run() -> list[tuple[torch.Tensor, list[int]]]:
        return compression.simulate("topk", steps, **params)

    fused = run()
    eager_topk(monkeypatch)
    for (out, bits), (out_e, bits_e) in zip(fused, run(), strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e)) and bits == bits_e


def test_kernel_keeps_inf_and_nan_first(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = grads_with_ties((50, 20), 2, steps=2)
    steps[0][0].view(-1)[[3, 500]] = torch.tensor([math.inf, -math.inf])
    steps[0][1].view(-1)[7] = math.nan

    def run() -> list[torch.Tensor]:
        return [out for out, _ in compression.simulate("topk", steps, ratio=0.01)]

    fused = run()
    assert math.isnan(fused[0].view(-1)[7]) and fused[0].view(-1)[3] == math.inf
    eager_topk(monkeypatch)
    for out, out_e in zip(fused, run(), strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e))


def sampled_places(n: int) -> list[int]:
    """Where the kernel samples acc to bracket T in a layer of n elements (kernels/topk.c)."""
    x, places = n, []
    for _ in range(topk_kernel.SAMPLE):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        places.append((x >> 32) * n >> 32)
    return places


def assert_one_step_is_the_rule_and_the_eager_path(grad: torch.Tensor, ratio: float,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One step of Top-K ``ratio`` on the 1-D ``grad`` (a fresh layer, e = 0): the kernel keeps
    the rule's entries, and its message and error memory are bitwise the eager path's."""
    n, k = grad.numel(), max(1, math.floor(ratio * grad.numel()))

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        compressor, layer = TopK(ratio), Layer("layer", torch.Size([n // 8, 8]), ratio)
        message = torch.empty(2 * k, dtype=torch.int32)
        compressor.compress(layer, grad.clone(), message)
        return message, layer.memory["error"]

    message, error = run()
    assert torch.equal(message[k:], ref_kept(grad, k))
    eager_topk(monkeypatch)
    message_e, error_e = run()
    assert torch.equal(message, message_e) and torch.equal(bits_of(error), bits_of(error_e))


@pytest.mark.parametrize("off", ["high", "low"])
@pytest.mark.parametrize("ratio", [0.25, 0.02])
def test_kernel_is_exact_when_the_sample_is_off(off: str, ratio: float,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The sampled places hold the layer's largest (or smallest) magnitudes: the sample's bracket
    # misses T, and the histogram of every entry must take over.
    n = topk_kernel.SAMPLED_MIN + 1024
    grad = torch.randn(n, generator=torch.Generator().manual_seed(5))
    places = torch.tensor(sampled_places(n))
    grad[places] = 1e3 + torch.arange(len(places), dtype=torch.float32) if off == "high" \
        else 1e-30 * torch.ones(len(places))

    assert_one_step_is_the_rule_and_the_eager_path(grad, ratio, monkeypatch)


@pytest.mark.parametrize("ratio", [0.5, 0.25, 0.02])
def test_kernel_keeps_the_first_ties_at_t_on_the_sampled_path(
        ratio: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # A few entries tied with the k-th largest |acc|, on both sides of the cut, and no other
    # ties: the sample brackets T and the candidates decide which ties are kept (the first).
    n = topk_kernel.SAMPLED_MIN + 1000
    grad = torch.randn(n, generator=torch.Generator().manual_seed(6))
    k = max(1, math.floor(ratio * n))
    order = grad.abs().argsort(descending=True)
    tied = order[k - 12:k + 9]
    grad[tied] = grad[order[k - 1]].abs() * torch.where(tied % 2 == 0, 1.0, -1.0)

    assert_one_step_is_the_rule_and_the_eager_path(grad, ratio, monkeypatch)


def test_buffers_are_per_worker_and_bucket() -> None:
    # Two buckets in flight at once (the second compressed before the first one's gather is
    # read, as when the hook's buckets overlap) must not share the message or gather buffers.
    compressor, comm = TopK(0.5), SimComm.group(1)[0]
    grads = [torch.randn(20, 10), torch.randn(20, 10)]
    layers = [Layer(f"l{i}", g.shape, 0.5) for i, g in enumerate(grads)]
    outs = [g.clone() for g in grads]
    buckets = [compressor.aggregate([layer], [out], comm) for layer, out in zip(layers, outs,
                                                                                strict=True)]
    gathers = [next(steps) for steps in buckets]
    for steps, gather in zip(buckets, gathers, strict=True):
        with pytest.raises(StopIteration):
            steps.send(gather.result)
    for out, g in zip(outs, grads, strict=True):
        kept = out != 0
        assert int(kept.sum()) == 100 and torch.equal(out[kept], g[kept])


def test_decompress_rejects_an_out_of_range_index() -> None:
    out = torch.empty(10)
    parts = torch.tensor([[0, 0, 3, 10]], dtype=torch.int32)  # values 0.0, 0.0; indices 3, 10
    with pytest.raises(ValueError, match="out of range"):
        topk_kernel.decompress(topk_kernel.kernel(), out, parts, 2, 1.0)


def test_decompress_rejects_indices_out_of_order() -> None:
    """Each block is summed in a buffer of its own: an index below the block being summed (a
    list not ascending, never what compress sends) is refused, not written outside it."""
    n = 3 * 4096
    out = torch.empty(n)
    parts = torch.tensor([[0, 0, 5000, 3]], dtype=torch.int32)  # indices 5000, then 3
    with pytest.raises(ValueError, match="not ascending"):
        topk_kernel.decompress(topk_kernel.kernel(), out, parts, 2, 1.0)


def test_without_a_compiler_warns_once_and_runs_eager(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    steps = grads_with_ties((50, 20), 2, steps=3)
    fused, eager = kernel_and_eager(topk_kernel.LIBRARY, "topk", steps, tmp_path, monkeypatch,
                                    ratio=0.1)
    for (out, _), (out_e, _) in zip(fused, eager, strict=True):
        assert torch.equal(bits_of(out), bits_of(out_e))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ratio", [0.99, 0.1, 1e-7])
@pytest.mark.parametrize("workers", [2, 4])
def test_cuda_eager_path_is_bitwise_the_kernel(ratio: float, workers: int) -> None:
    # Any number of workers: the decode adds one worker's message at a time (no two atomic adds
    # meet), in worker order, as the kernel does; the selection reads nothing back to the host.
    steps = grads_with_ties((300, 400), workers, steps=4)
    cuda = compression.simulate("topk", [[g.cuda() for g in grads] for grads in steps],
                                ratio=ratio)
    for (out, bits), (out_c, bits_c) in zip(compression.simulate("topk", steps, ratio=ratio),
                                            cuda, strict=True):
        assert out_c.is_cuda and bits == bits_c
        assert torch.equal(bits_of(out), bits_of(out_c.cpu()))
