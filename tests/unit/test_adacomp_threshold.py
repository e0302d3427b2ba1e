"""AdaComp's soft threshold at an exact tie, |H| == g_max: the element is sent (Chen et al.,
Alg. 2: |H| >= g_max), in the eager torch path and in the C kernel (its AVX2 path where the CPU
has one; ``tests/unit/test_adacomp_kernel.py`` reruns this file with the portable loops). Values are
small binary fractions, so every float below is exact; the expected results are worked out by
hand. Also the wire bits of a message padded to whole words.
"""

from __future__ import annotations

import pytest
import torch

import compression
from compression import _adacomp_kernel as adacomp_kernel
from compression.base import Sent
from tests.references import require_kernel

# Two bins of 4 (L_T = 4). Step 1, residue 0: G = dW, H = G + dW = 2 dW.
#   bin 0: G = [4, 2, 1, -2], g_max 4, |H| = [8, 4, 2, 4]: sent 0, 1 (tie), 3 (tie)
#   bin 1: G = [3, -1.5, 0, 1], g_max 3, |H| = [6, 3, 0, 2]: sent 4, 5 (tie)
# s = mean(4, 3) = 3.5; G_q = sign(G) s where sent; residue = G - G_q.
GRAD = torch.tensor([[4.0, 2.0, 1.0, -2.0], [3.0, -1.5, 0.0, 1.0]])
SENT_OUT = torch.tensor([[3.5, 3.5, 0.0, -3.5], [3.5, -3.5, 0.0, 0.0]])
RESIDUE = torch.tensor([0.5, -1.5, 1.0, 1.5, -0.5, 2.0, 0.0, 1.0])
# Step 2, dW = [0.5, 0, 0, 0, 0, 0, 0, 0.5]: G = residue + dW = [1, -1.5, 1, 1.5, -0.5, 2, 0, 1.5],
#   bin 0: g_max 1.5, H = [1.5, -1.5, 1, 1.5]: sent 0 (tie), 1 (tie), 3 (tie)
#   bin 1: g_max 2, H = [-0.5, 2, 0, 2]: sent 5 (tie), 7 (tie); s = 1.75
GRAD_2 = torch.tensor([[0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]])
SENT_OUT_2 = torch.tensor([[1.75, -1.75, 0.0, 1.75], [0.0, 1.75, 0.0, 1.75]])
RESIDUE_2 = torch.tensor([-0.75, 0.25, 1.0, -0.25, -0.5, 0.25, 0.0, -0.25])


def run_ties() -> list:
    sim = compression.Simulation("adacomp", 1, (2, 4), fc_bin_size=4)
    first = sim.step([GRAD])
    residue_1 = sim.memory(0)["residue"][:8].clone()
    second = sim.step([GRAD_2])
    return [first, residue_1, second, sim.memory(0)["residue"][:8].clone()]


def check_ties(result: list) -> None:
    (out, bits), residue, (out_2, bits_2), residue_2 = result
    assert torch.equal(out, SENT_OUT) and bits == [5 * 8 + 32]
    assert torch.equal(residue, RESIDUE)
    assert torch.equal(out_2, SENT_OUT_2) and bits_2 == [5 * 8 + 32]
    assert torch.equal(residue_2, RESIDUE_2)


def test_a_tie_is_sent_by_the_eager_path(monkeypatch):
    monkeypatch.setattr(adacomp_kernel, "kernel", lambda: None)
    check_ties(run_ties())


def test_a_tie_is_sent_by_the_kernel():
    require_kernel(adacomp_kernel.LIBRARY)
    check_ties(run_ties())


def test_hard_local_selection_sends_one_per_bin(monkeypatch):
    # the paper's ablation: only each bin's largest |G| (bin 0: 4, bin 1: 3), whatever ties
    for eager in (True, False):
        if eager:
            monkeypatch.setattr(adacomp_kernel, "kernel", lambda: None)
        else:
            monkeypatch.undo()
            require_kernel(adacomp_kernel.LIBRARY)
        sim = compression.Simulation("adacomp", 1, (2, 4), fc_bin_size=4, soft_threshold=False)
        out, bits = sim.step([GRAD])
        assert torch.equal(out, torch.tensor([[3.5, 0.0, 0.0, 0.0], [3.5, 0.0, 0.0, 0.0]]))
        assert bits == [2 * 8 + 32]


@pytest.mark.parametrize(("shape", "bin_size", "wire_bytes"), [
    ((3, 1), 50, 8),    # s (4 bytes), 1 sent byte, 1 sign byte, 2 bytes of padding
    ((2, 8), 8, 8),     # s, 2 bins of 1 byte each for sent and for sign: no padding
    ((5, 20), 64, 4 + 2 * 13 + 2),  # bins 64 and 36: 8 + 5 bytes of bits each, 2 of padding
])
def test_wire_bits_are_the_message_with_its_padding(shape, bin_size, wire_bytes):
    sim = compression.Simulation("adacomp", 2, shape, fc_bin_size=bin_size)
    gen = torch.Generator().manual_seed(0)
    sim.step([torch.randn(shape, generator=gen) for _ in range(2)])
    for sent in sim.sent:
        (layer,) = sent
        assert layer.wire_bits == 8 * wire_bytes
        assert isinstance(layer, Sent) and (layer.bits - 32) % (8 if bin_size < 64 else 16) == 0
