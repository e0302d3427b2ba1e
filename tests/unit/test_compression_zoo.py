"""The field's compressors (issue 26) on simulated workers: naive references for the
deterministic ones, statistical tests for the stochastic ones.

The contract over the registry (tests/ranks/test_compressor_contract.py) already runs each of them
in a real 2-rank DDP job, through error feedback, checkpoints and level changes. Here: their math.
The statistical tests draw T quantizations of one fixed gradient (one step of a simulation whose
layer is T copies of it, a row each: each row its own bucket or block) and check their mean against
the gradient within Z standard errors, computed element by element from the exact variance, and the
mean squared error against its exact value and the paper's bound. """

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import compression
from benchmarks.ranks import run_ranks
from compression import _qsgd_kernel, _sign_kernel, rng
from compression.base import Layer
from compression.natural import natural_round
from compression.qsgd import MAX_LEVELS, code_bits, omega_bits
from compression.table import lines_of_code
from compression.table import main as table_main
from core.errors import ConfigError
from tests.ranks.test_compression_ddp import batch, make_ddp, make_plain, plain
from tests.references import random_steps, require_kernel

Z = 5.0        # standard errors allowed per element (P(|z| > 5) ~ 6e-7: none of 256 elements)
DRAWS = 2000   # quantizations per statistical test
MSE_TOL = 0.1  # relative tolerance of the mean squared error (its own spread is ~ 3% here)


def draws(name: str, grads: list[torch.Tensor], count: int = DRAWS, **params: object
          ) -> torch.Tensor:
    """``count`` independent outputs (float64, one row each) of workers with the gradients
    ``grads``: one step of a simulation whose layer holds ``count`` copies of each worker's
    gradient, row after row (a bucket or block of a row's length keeps the rows apart)."""
    n = grads[0].numel()
    sim = compression.Simulation(name, len(grads), (count, n), **params)
    return sim.step([g.reshape(1, n).expand(count, n) for g in grads])[0].double()


def assert_unbiased(samples: torch.Tensor, expected: torch.Tensor, variance: torch.Tensor
                    ) -> None:
    """The mean of ``samples`` is ``expected`` within Z standard errors, element by element;
    where the variance is 0, exactly."""
    error = (samples.mean(0) - expected).abs()
    stderr = (variance / samples.shape[0]).sqrt()
    assert bool((error[variance == 0] < 1e-6).all()), "a deterministic element varied"
    z = error[variance > 0] / stderr[variance > 0]
    assert float(z.max()) < Z, f"biased: max z = {float(z.max()):.1f}"


def assert_mse(samples: torch.Tensor, expected: torch.Tensor, variance: torch.Tensor,
               bound: float) -> None:
    """E ||Q - x||^2 measured matches sum(variance) within MSE_TOL and stays under ``bound``."""
    mse = float(((samples - expected) ** 2).sum(-1).mean())
    exact = float(variance.sum())
    assert abs(mse - exact) <= MSE_TOL * exact, (mse, exact)
    assert exact <= bound and mse <= bound, (mse, exact, bound)


def gradient(shape: tuple[int, ...] = (8, 32), seed: int = 0) -> torch.Tensor:
    """A fixed gradient with a few exact zeros and elements of very different sizes."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen) * torch.rand(shape, generator=gen) ** 2
    g.view(-1)[::37] = 0.0
    return g


@pytest.mark.parametrize(("name", "params"), [("qsgd", {"bucket_size": 256}), ("natural", {}),
                                            ("terngrad", {"clip": None, "block_size": 256})])
def test_workers_draw_independently(name: str, params: dict) -> None:
    # Two workers with the same gradient: their draws are independent (each its own stream), so
    # the mean of their messages has half the squared error of one message.
    g = gradient()
    one = draws(name, [g], 500, **params)
    two = draws(name, [g, g], 500, **params)
    flat = g.view(-1).double()
    ratio = float(((two - flat) ** 2).sum(1).mean() / ((one - flat) ** 2).sum(1).mean())
    assert abs(ratio - 0.5) < 0.1, ratio


# ---- QSGD -------------------------------------------------------------------------------------
def elias_omega(n: int) -> str:
    """Elias omega code of n >= 1, written out."""
    code = "0"
    while n > 1:
        digits = bin(n)[2:]
        code, n = digits + code, len(digits) - 1
    return code


def test_omega_bits_match_the_written_code() -> None:
    k = torch.arange(1, 5000)
    assert omega_bits(k).tolist() == [len(elias_omega(int(n))) for n in k]
    big = torch.tensor([2**20, 2**20 - 1, 2**31 - 1])
    assert omega_bits(big).tolist() == [len(elias_omega(int(n))) for n in big]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])  # the torch ops; the C kernel
def test_code_bits_count_code_s_bucket_by_bucket(dtype: torch.dtype) -> None:
    if dtype == torch.int32:
        require_kernel(_qsgd_kernel.LIBRARY)
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 4, (300,), generator=gen) * (torch.rand(300, generator=gen) < 0.3)
    codes = codes.to(dtype)
    for bucket in (7, 64, 300):
        want = 0
        for start in range(0, 300, bucket):
            previous = start - 1
            for i in range(start, min(start + bucket, 300)):
                if codes[i]:
                    want += len(elias_omega(i - previous)) + 1 + len(elias_omega(int(codes[i])))
                    previous = i
        assert code_bits(codes, bucket) == want


def test_the_code_bits_kernel_counts_as_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long gaps (sparse levels), the highest levels, buckets of one element up to the whole
    layer, and a short last bucket."""
    require_kernel(_qsgd_kernel.LIBRARY)
    gen = torch.Generator().manual_seed(2)
    n = 200_003
    levels = torch.randint(1, MAX_LEVELS + 1, (n,), generator=gen, dtype=torch.int32)
    dense, sparse = levels % 3, levels * (torch.rand(n, generator=gen) < 0.001)
    cases = [(c.to(torch.int32), bucket) for c in (dense, sparse, levels)
             for bucket in (1, 512, 70_000, n)]
    kernel = [code_bits(c, bucket) for c, bucket in cases]
    monkeypatch.setattr(_qsgd_kernel, "code_bits", lambda codes, bucket: None)
    assert kernel == [code_bits(c, bucket) for c, bucket in cases]


@pytest.mark.parametrize(("shape", "levels", "bucket"), [
    ((3, 5), 1, 4), ((7, 13), 4, 512), ((40, 37), 256, 64), ((40, 37), 256, None),
    ((1, 9), 5, 1), ((64, 3, 3, 3), MAX_LEVELS, 100)])
def test_qsgd_kernel_is_bitwise_the_torch_ops(shape: tuple[int, ...], levels: int,
                                              bucket: int | None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Three workers, three steps (the same random streams): every output and bit count of the
    C kernel's path equals the torch ops', and so does a message, byte for byte; zeros, -0 and
    a short last byte included."""
    require_kernel(_qsgd_kernel.LIBRARY)
    steps = random_steps(shape, 3, 3, seed=7)
    for step in steps:
        for g in step:
            g.view(-1)[::5] = 0.0
            g.view(-1)[1::7] = -0.0

    def run() -> list:
        sim = compression.Simulation("qsgd", 3, shape, levels=levels, bucket_size=bucket)
        return [sim.step([g.clone() for g in step]) for step in steps]

    def message() -> list[int]:                            # one worker's, as sent
        qsgd = compression.create("qsgd", levels=levels, bucket_size=bucket)
        layer = Layer("w", torch.Size(shape), levels)
        rng.start(layer, "rounding", 0, 0)
        sent = torch.full((qsgd.message_size(layer, steps[0][0].numel()),), 0xAB,
                          dtype=torch.uint8)
        qsgd.compress(layer, steps[0][0].view(-1).clone(), sent)
        return sent.tolist()

    kernel, sent = run(), message()
    monkeypatch.setattr(_qsgd_kernel, "kernel", lambda: None)
    monkeypatch.setattr(_qsgd_kernel, "code_bits", lambda codes, bucket: None)
    assert message() == sent
    eager = run()
    for (out_k, bits_k), (out_e, bits_e) in zip(kernel, eager, strict=True):
        assert bits_k == bits_e
        assert [o.view(torch.int32).tolist() for o in out_k] == \
            [o.view(torch.int32).tolist() for o in out_e]


@pytest.mark.parametrize(("levels", "bucket"), [(4, 64), (1, None), (256, 64)])
def test_qsgd_is_unbiased_within_its_variance_bound(levels: int, bucket: int | None) -> None:
    # Lemma 3.1: E Q_s(v) = v and E ||Q_s(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 per
    # bucket of d; exactly, sum_i (||v|| / s)^2 p_i (1 - p_i), p_i = s |v_i| / ||v|| - l_i.
    g = gradient()
    flat = g.view(-1).double()
    d = bucket or flat.numel()
    norms = flat.view(-1, d).norm(dim=1).repeat_interleave(d)
    ratio = levels * flat.abs() / norms
    p = ratio - ratio.floor()
    variance = (norms / levels) ** 2 * p * (1 - p)
    samples = draws("qsgd", [g], levels=levels, bucket_size=d)
    assert_unbiased(samples, flat, variance)
    bound = sum(min(d / levels**2, math.sqrt(d) / levels) * float(v.norm()) ** 2
                for v in flat.view(-1, d))
    assert_mse(samples, flat, variance, bound)


def test_qsgd_bits_are_code_s_and_the_wire_its_planes() -> None:
    g = gradient((4, 100))
    sim = compression.Simulation("qsgd", 1, g.shape, levels=5, bucket_size=64)
    out, bits = sim.step([g])
    flat = out.view(-1)
    d, n = 64, 400
    norms = g.view(-1).double()
    norms = torch.cat([norms, norms.new_zeros(448 - n)]).view(-1, d).norm(dim=1)
    codes = (flat.double() / norms.repeat_interleave(d)[:n] * 5).abs().round().long()
    assert bits == [32 * 7 + code_bits(codes, d)]
    assert sim.sent[0][-1].wire_bits == 8 * (4 * 7 + 4 * math.ceil(4 * 50 / 4))  # 1 + 3 planes


# ---- TernGrad ---------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [None, 16])
def test_terngrad_is_unbiased_with_the_shared_scaler(block: int | None) -> None:
    # Two workers whose scalers differ: both ternarize with s = max_w s_w (scaler sharing), so
    # Var(out_k) = sum_w (s |g_wk| - g_wk^2) / W^2 and E ||g~_w||^2 = s ||g_w||_1 (Sec. 3).
    g0, g1 = gradient(seed=2), 3 * gradient(seed=3)
    flats = [g0.view(-1).double(), g1.view(-1).double()]
    d = block or flats[0].numel()
    samples = draws("terngrad", [g0, g1], block_size=d, clip=None)
    s = torch.maximum(*[f.abs().view(-1, d).amax(1) for f in flats]).repeat_interleave(d)
    variance = sum(s * f.abs() - f**2 for f in flats) / 4
    mean = (flats[0] + flats[1]) / 2
    assert_unbiased(samples, mean, variance)
    assert_mse(samples, mean, variance, float(sum(s @ f.abs() for f in flats)) / 4)


def test_terngrad_clips_to_c_sigma_and_sends_ternary_values() -> None:
    g = gradient()
    g.view(-1)[5] = 40.0  # far beyond 2.5 sigma: clipped
    out = draws("terngrad", [g], 50, clip=2.5, block_size=g.numel())  # sigma: of a row too
    bound = 2.5 * float(g.std(correction=0))
    sent = out.abs()[out != 0]
    torch.testing.assert_close(sent, torch.full_like(sent, bound))  # s = max |clipped g| = c sigma
    assert float(out[:, 5].mean()) == pytest.approx(bound, rel=1e-6)  # |g_k| = s: always sent


# ---- natural compression ------------------------------------------------------------------------
def natural_variance(t: torch.Tensor) -> torch.Tensor:
    """Var C_nat(t) = (2^(e+1) - |t|)(|t| - 2^e) for 2^e <= |t| < 2^(e+1)."""
    a = t.abs()
    low = torch.where(a > 0, 2.0 ** torch.floor(torch.log2(a)), 0.0)
    return (2 * low - a) * (a - low)


def test_natural_compression_is_unbiased_within_one_eighth() -> None:
    # Theorem 1: E C_nat(t) = t and E (C_nat(t) - t)^2 <= t^2 / 8.
    g = gradient()
    flat = g.view(-1).double()
    samples = draws("natural", [g])
    variance = natural_variance(flat)
    assert_unbiased(samples, flat, variance)
    assert_mse(samples, flat, variance, float(flat @ flat) / 8)


def test_natural_round_gives_the_neighbouring_powers_of_two() -> None:
    gen = torch.Generator().manual_seed(0)
    t = torch.cat([torch.randn(1000, generator=gen) * 10.0 ** torch.randint(-30, 30, (1000,),
                                                                             generator=gen),
                   torch.tensor([0.0, -0.0, 1.0, -0.25, 2.0**-140, -(2.0**-149)])])
    out = natural_round(t, gen)
    a = t.double().abs()
    low = torch.where(a >= 2.0**-126, 2.0 ** torch.floor(torch.log2(a)), 0.0)
    high = torch.where(a >= 2.0**-126, 2 * low, 2.0**-126)
    got = out.double().abs()
    assert bool(((got == low) | (got == high)).all())
    assert bool((torch.sign(out) * torch.sign(t) >= 0).all())
    assert out[-6:-2].tolist() == [0.0, -0.0, 1.0, -0.25]  # powers of two stay


def test_natural_sends_nine_bits_per_element() -> None:
    sim = compression.Simulation("natural", 2, (10, 30))
    _, bits = sim.step(random_steps((10, 30), 2, 1)[0])
    assert bits == [9 * 300] * 2 and sim.sent[0][-1].wire_bits == 8 * (300 + 38)


# ---- Random-K -----------------------------------------------------------------------------------
def test_randomk_workers_share_indices_drawn_uniformly() -> None:
    # Without error feedback, out is nonzero exactly on S (gradients with no zeros): S is the
    # same for all workers (one all-reduce of values) and each index is drawn w.p. k / n.
    n, k, steps = 64, 16, 1000
    sim = compression.Simulation("randomk", 3, (8, 8), ratio=k / n, error_feedback=False, seed=5)
    gen = torch.Generator().manual_seed(0)
    hits = torch.zeros(n)
    for _ in range(steps):
        grads = [torch.rand(8, 8, generator=gen) + 1 for _ in range(3)]
        out, bits = sim.step(grads)
        chosen = out.view(-1) != 0
        assert int(chosen.sum()) == k and bits == [32 * k] * 3
        mean = torch.stack(grads).mean(0).view(-1)
        torch.testing.assert_close(out.view(-1)[chosen], mean[chosen])
        hits += chosen
    p = k / n
    z = (hits - steps * p) / math.sqrt(steps * p * (1 - p))
    assert float(z.abs().max()) < Z


def test_randomk_matches_reference_with_memory() -> None:
    # mem-SGD: acc = g + e; out = mean acc on S; e = acc off S. The reference draws S from the
    # same shared stream (rank left out), through the same rng module.
    shape, steps, ratio, seed = (6, 40), random_steps((6, 40), 2, 4), 0.1, 3
    got = compression.simulate("randomk", steps, ratio=ratio, seed=seed)
    probe = Layer("layer", torch.Size(shape))
    rng.start(probe, "indices", seed, None)
    errors = [torch.zeros(240, dtype=torch.float64) for _ in range(2)]
    for (out, _), grads in zip(got, steps, strict=True):
        index = torch.randperm(240, generator=rng.draw(probe, "indices", torch.device("cpu")))[:24]
        want = torch.zeros(240, dtype=torch.float64)
        for w, g in enumerate(grads):
            acc = g.double().view(-1) + errors[w]
            want[index] += acc[index] / 2
            acc[index] = 0
            errors[w] = acc
        torch.testing.assert_close(out.double().view(-1), want, atol=1e-6, rtol=1e-5)


# ---- DGC ----------------------------------------------------------------------------------------
def ref_dgc(steps: list[list[torch.Tensor]], ratio: float, m: float, clip: float | None
            ) -> list[torch.Tensor]:
    """Lin et al. on small layers (the threshold from all of |v|: the top-k), float64:
    clip, u = m u + g, v = v + u, send the k largest |v|, mask u and v there; the optimizer
    gets o_t - m o_{t-1}."""
    workers, n = len(steps[0]), steps[0][0].numel()
    k = max(1, math.floor(ratio * n))
    u = [torch.zeros(n, dtype=torch.float64) for _ in range(workers)]
    v = [torch.zeros(n, dtype=torch.float64) for _ in range(workers)]
    previous, outs = torch.zeros(n, dtype=torch.float64), []
    for grads in steps:
        o = torch.zeros(n, dtype=torch.float64)
        for w, g in enumerate(grads):
            g = g.double().view(-1)
            if clip is not None:
                g = g * min(1.0, clip / math.sqrt(workers) / float(g.norm()))
            u[w] = m * u[w] + g
            v[w] = v[w] + u[w]
            chosen = torch.argsort(v[w].abs(), descending=True)[:k]
            o[chosen] += v[w][chosen] / workers
            v[w][chosen] = 0
            u[w][chosen] = 0
        outs.append((o - m * previous).view(steps[0][0].shape))
        previous = o
    return outs


@pytest.mark.parametrize(("m", "clip"), [(0.0, None), (0.9, None), (0.9, 1.0)])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_dgc_matches_reference_on_small_layers(m: float, clip: float | None, workers: int
                                               ) -> None:
    steps = random_steps((6, 40), workers, 5, seed=4)
    got = compression.simulate("dgc", steps, ratio=0.1, momentum=m, clip_norm=clip)
    for (out, bits), want in zip(got, ref_dgc(steps, 0.1, m, clip), strict=True):
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
        assert bits == [64 * 24] * workers


def test_dgc_sampled_threshold_sends_the_largest_at_most_k() -> None:
    # A large layer: the threshold comes from a 1% sample, so |S| varies; S is always the
    # largest |v| (every element sent is at least every element kept back), at most k.
    shape, k = (300, 400), 120
    sim = compression.Simulation("dgc", 1, shape, ratio=0.001)
    counts = []
    for grads in random_steps(shape, 1, 5, seed=6):
        v = sim.memory(0).get("v", torch.zeros(120000)) + grads[0].view(-1)
        out, bits = sim.step(grads)
        sent = out.view(-1) != 0
        counts.append(int(sent.sum()))
        assert bits == [64 * counts[-1]]
        assert float(v[sent].abs().min()) >= float(v[~sent].abs().max())
        torch.testing.assert_close(out.view(-1)[sent], v[sent])
    assert all(0 < c <= k for c in counts), counts
    assert len(set(counts)) > 1, "the sample never changed the count: is it sampled?"


def test_dgc_natural_values_are_powers_of_two_and_nothing_is_lost() -> None:
    # C_nat o DGC: the values sent are powers of two (9 bits each), and the memory keeps
    # v - C_nat(v[S]), so the applied sum plus the memories is the gradients' sum.
    shape, steps = (6, 40), random_steps((6, 40), 2, 6, seed=7)
    alone = compression.Simulation("dgc", 1, shape, ratio=0.2, natural=True)
    sent = alone.step(steps[0][:1])[0].view(-1)
    assert torch.equal(torch.frexp(sent[sent != 0]).mantissa.abs(), torch.full((48,), 0.5))
    sim = compression.Simulation("dgc", 2, shape, ratio=0.2, natural=True)
    applied = torch.zeros(shape, dtype=torch.float64)
    for grads in steps:
        out, bits = sim.step(grads)
        assert bits == [(32 + 9) * 48] * 2
        applied += out.double()
    memory = sum(sim.memory(w)["v"].double() for w in range(2)) / 2
    total = sum(torch.stack([g.double() for g in grads]).mean(0) for grads in steps)
    torch.testing.assert_close(applied + memory.view(shape), total, atol=1e-5, rtol=0)
    assert float(memory.abs().max()) > 0.1  # the memory holds something: not a blind test


def test_dgc_warmup_is_a_switchable_plan_of_levels(compose_cfg) -> None:  # noqa: ANN001
    cfg = compose_cfg("method=dgc_warmup", "benchmark=cifar10", "scale=tiny")
    assert cfg.compressor.name == "dgc" and cfg.scheduler.name == "plan"
    assert list(cfg.scheduler.epochs) == [0, 1, 2, 3, 4]
    assert [1 - x for x in cfg.scheduler.levels] == pytest.approx(
        [0.75, 0.9375, 0.984375, 0.996, 0.999])
    dgc = compression.build_compressor(cfg.compressor)
    assert [dgc.validate_level(x) for x in cfg.scheduler.levels] == list(cfg.scheduler.levels)
    assert dgc.momentum == cfg.optimizer.momentum  # momentum correction's m is the optimizer's


# ---- signSGD / Signum ---------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", [True, False])  # the C kernel; the torch ops (as on CUDA)
@pytest.mark.parametrize(("shape", "workers"), [((6, 40), 1), ((6, 40), 2), ((5, 13), 3),
                                                ((5, 13), 4)])
@pytest.mark.parametrize("name", ["signsgd", "signum"])
def test_sign_majority_vote_matches_reference(name: str, shape: tuple[int, int], workers: int,
                                              kernel: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if kernel:
        require_kernel(_sign_kernel.LIBRARY)
    else:
        monkeypatch.setattr(_sign_kernel.LIBRARY, "get", lambda: None)
    beta = 0.9 if name == "signum" else 0.0
    n = math.prod(shape)
    steps = random_steps(shape, workers, 5, seed=8)
    for step in steps[::2]:                              # ties of an even vote; -0 is positive
        step[0].view(-1)[::3] = -0.0
        step[-1].view(-1)[1::3] = -step[0].view(-1)[1::3]
    got = compression.simulate(name, steps)
    v = [torch.zeros(n, dtype=torch.float64) for _ in range(workers)]
    for (out, bits), grads in zip(got, steps, strict=True):
        votes = torch.zeros(n, dtype=torch.float64)
        for w, g in enumerate(grads):
            v[w] = (1 - beta) * g.double().view(-1) + beta * v[w]
            votes += torch.where(v[w] < 0, -1.0, 1.0)
        assert torch.equal(out.double().view(-1), torch.sign(votes))
        assert not torch.signbit(out[out == 0]).any()   # a tie is +0, as torch's
        assert bits == [n] * workers


# ---- 1-bit SGD ----------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [None, 7, 16])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_onebit_matches_reference(block: int | None, workers: int) -> None:
    shape = (6, 40)
    steps = random_steps(shape, workers, 5, seed=9)
    got = compression.simulate("onebit", steps, block_size=block)
    size = block or 40
    errors = [torch.zeros(240, dtype=torch.float64) for _ in range(workers)]
    for (out, bits), grads in zip(got, steps, strict=True):
        want = torch.zeros(240, dtype=torch.float64)
        for w, g in enumerate(grads):
            acc = g.double().view(-1) + errors[w]
            decoded = torch.zeros(240, dtype=torch.float64)
            for start in range(0, 240, size):
                block_acc = acc[start:start + size]
                positive = block_acc >= 0
                for side in (positive, ~positive):
                    if side.any():
                        decoded[start:start + size][side] = block_acc[side].mean()
            errors[w] = acc - decoded
            want += decoded / workers
        torch.testing.assert_close(out.double().view(-1), want, atol=1e-5, rtol=1e-5)
        assert bits == [240 + 64 * math.ceil(240 / size)] * workers


# ---- fp16 / bf16 --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_casts_send_the_rounded_mean(name: str) -> None:
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    steps = random_steps((6, 40), 2, 2, seed=10)
    for (out, bits), grads in zip(compression.simulate(name, steps), steps, strict=True):
        want = sum(g.to(dtype) / 2 for g in grads).float()  # exact for two workers
        assert torch.equal(out, want) and bits == [16 * 240] * 2


def _casts_and_pytorch_hooks(rank: int, world: int) -> dict[str, dict[str, dict]]:
    """One step's aggregated matrix gradients with our fp16 / bf16 and PyTorch's hooks."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooks = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
    out: dict[str, dict[str, dict]] = {}
    for name, hook in hooks.items():
        out[name] = {}
        for which in ("ours", "pytorch"):
            if which == "ours":
                model, ddp, _, _ = make_ddp(OmegaConf.create({"name": name}))
            else:
                model, ddp, _, _ = make_plain()
                ddp.register_comm_hook(None, hook)
            x, y = batch(rank, 0)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            out[name][which] = plain({n: p.grad for n, p in model.named_parameters()
                                      if p.ndim > 1})
    return out


@pytest.mark.slow
def test_casts_equal_pytorch_hooks_in_a_2_rank_run() -> None:
    # PyTorch casts the bucket whole (biases too); on the matrix-shaped layers ours must give
    # the same bits: cast, divide by W, all-reduce in 16 bits, cast back.
    for rank_result in run_ranks(_casts_and_pytorch_hooks, 2):
        for name, result in rank_result.items():
            assert result["ours"].keys() == result["pytorch"].keys()
            for layer, ours in result["ours"].items():
                assert np.array_equal(ours, result["pytorch"][layer]), (name, layer)


# ---- bad levels and parameters: one line naming the field ----------------------------------------
@pytest.mark.parametrize(("name", "params", "field"), [
    ("qsgd", {"levels": 0}, "compressor.levels"),
    ("qsgd", {"levels": 2.5}, "compressor.levels"),
    ("qsgd", {"bucket_size": 0}, "compressor.bucket_size"),
    ("terngrad", {"block_size": 0}, "compressor.block_size"),
    ("terngrad", {"clip": -1.0}, "compressor.clip"),
    ("dgc", {"ratio": 0.0}, "compressor.ratio"),
    ("dgc", {"momentum": 1.0}, "compressor.momentum"),
    ("dgc", {"sample_ratio": 0}, "compressor.sample_ratio"),
    ("dgc", {"natural": "yes"}, "compressor.natural"),
    ("dgc", {"clip_norm": 0}, "compressor.clip_norm"),
    ("randomk", {"ratio": 1.5}, "compressor.ratio"),
    ("randomk", {"seed": -1}, "compressor.seed"),
    ("signum", {"momentum": -0.1}, "compressor.momentum"),
    ("onebit", {"block_size": True}, "compressor.block_size"),
    ("natural", {"seed": 1.5}, "compressor.seed"),
    ("fp16", {"level": 2}, "compressor.level"),
])
def test_bad_parameters_name_the_field(name: str, params: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: ") as info:
        compression.create(name, **params)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "level"), [("qsgd", 0), ("terngrad", 0), ("dgc", 1.5),
                                             ("randomk", 0), ("onebit", -4), ("signsgd", 1),
                                             ("natural", 1), ("bf16", 1)])
def test_bad_levels_are_refused_in_one_line(name: str, level: float) -> None:
    with pytest.raises(ConfigError, match="^scheduler.high: [^\n]*$"):
        compression.create(name).validate_level(level, "scheduler.high")


def test_stochastic_state_is_in_the_memory_as_tensors() -> None:
    # Everything a resumed run needs is in Layer.memory, as tensors (weights_only checkpoints);
    # a run restarted without it draws other numbers.
    for name in ("qsgd", "terngrad", "natural", "dgc", "randomk"):
        steps = random_steps((6, 40), 2, 3, seed=11)
        sim = compression.Simulation(name, 2, (6, 40))
        for grads in steps[:2]:
            sim.step(grads)
        assert all(isinstance(t, torch.Tensor) for w in range(2) for t in sim.memory(w).values())
        saved = [{k: t.clone() for k, t in sim.memory(w).items()} for w in range(2)]
        restored, blank = (compression.Simulation(name, 2, (6, 40)) for _ in range(2))
        for w in range(2):
            restored.layers[w].memory = saved[w]
        want = sim.step(steps[2])[0]
        assert torch.equal(restored.step(steps[2])[0], want), name
        assert not torch.equal(blank.step(steps[2])[0], want), name


# ---- the Compressors table of docs/compressors.md -----------------------------------------------
def test_lines_of_code_leave_out_docstrings_comments_and_blanks(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "m.py"
    path.write_text('"""Module.\n\nMore."""\n\nimport math  # why\n\n\nclass A:\n    """Doc."""\n'
                    '\n    # a comment\n    x = """not a\n    docstring"""\n\n    def f(self):\n'
                    '        """One line."""\n        return math.pi\n')
    assert lines_of_code(path) == 6  # import, class, x = ... (two lines), def, return


@pytest.mark.slow
def test_the_compressors_table_is_current(capsys: pytest.CaptureFixture) -> None:
    # The table in docs/compressors.md is what `python -m compression.table` writes now.
    assert table_main(["--check"]) == 0, capsys.readouterr().err
