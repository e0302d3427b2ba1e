"""EF-signSGD against a naive reference (Karimireddy et al., ICML 2019, Alg. 1): the scale of
each block is the mean magnitude of its own elements (the last, partial block's over its own
count), the message is that scale times the sign, and the memory keeps what it left out."""

from __future__ import annotations

import math

import pytest
import torch

import compression


def reference(steps: list[list[torch.Tensor]], block: int) -> list[torch.Tensor]:
    """Each step's aggregate, computed element by element in float64."""
    workers = len(steps[0])
    errors = [torch.zeros(steps[0][0].numel(), dtype=torch.float64) for _ in range(workers)]
    out = []
    for grads in steps:
        total = torch.zeros_like(errors[0])
        for w, g in enumerate(grads):
            acc = g.reshape(-1).double() + errors[w]                       # Alg. 1 l.4
            sent = torch.empty_like(acc)
            for start in range(0, acc.numel(), block):
                part = acc[start:start + block]
                scale = sum(abs(float(x)) for x in part) / len(part)       # Alg. 1 l.5
                sent[start:start + block] = torch.where(part < 0, -scale, scale)
            errors[w] = acc - sent                                         # Alg. 1 l.7
            total += sent
        out.append((total / workers).view(grads[0].shape))
    return out


@pytest.mark.parametrize("shape, block", [((7, 10), 16), ((7, 10), 70), ((3, 2, 3, 3), 5),
                                          ((7, 10), 100)])
def test_ef_signsgd_matches_the_naive_reference(shape, block):
    # 70 elements in blocks of 16: a last block of 6, which must be averaged over 6, not 16
    gen = torch.Generator().manual_seed(3)
    scale = torch.linspace(0.1, 3.0, math.prod(shape)).view(shape)  # blocks of other magnitudes
    steps = [[torch.randn(shape, generator=gen) * scale for _ in range(3)] for _ in range(4)]
    got = compression.simulate("ef_signsgd", steps, block_size=block)
    for (aggregate, bits), want in zip(got, reference(steps, block), strict=True):
        torch.testing.assert_close(aggregate.double(), want, rtol=1e-5, atol=1e-6)
        n = math.prod(shape)
        assert bits == [n + 32 * math.ceil(n / block)] * 3
