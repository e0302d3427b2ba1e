"""``compressor=natural``: natural compression, stochastic rounding to a power of two.

Horvath, Ho, Horvath, Sahu, Canini, Richtarik, "Natural Compression for Distributed Deep
Learning" (2019), the natural compression operator C_nat of their Sec. 3::

    2^e <= |t| < 2^(e+1)
    C_nat(t) = sign(t) 2^e        w.p. (2^(e+1) - |t|) / 2^e
               sign(t) 2^(e+1)    otherwise
    out = (1/W) sum_w C_nat(g_w)  every worker sends C_nat(g); all apply the mean

C_nat is unbiased with E (C_nat(t) - t)^2 <= t^2 / 8 (Theorem 1: omega = 1/8). A power of two
needs only its sign and exponent: 9 bits per element, which is how the paper counts it and how
our message sends it (an all-gather of the float32 exponent bytes and a sign bit plane). On the
float32 bits of t (exponent field e, fraction m / 2^23) the rounding is: the exponent goes up by
one with probability m / 2^23 and the fraction is dropped; for a subnormal t the same rule
rounds to 0 or 2^-126, also unbiased.

C_nat composes with other compressors (C_nat o C, their Sec. 3): :func:`natural_round` is the
operator and :func:`encode` / :func:`decode` its 9-bit values, which DGC's ``natural: true``
uses for the values it sends. A compressor that all-reduces (Random-K, PowerSGD) would sum
powers of two in flight into values that are not, so it would save no bits on our wire.
"""

from __future__ import annotations

import math

import torch

from compression import register, rng
from compression.base import Layer, divisor
from compression.exchange import GatherCompressor, pack_bits, unpack_bits
from core.errors import check_int

BITS = 9           # sign and exponent
FRACTION = 23      # float32 fraction bits
TOP_EXPONENT = 254  # the largest finite float32 exponent field


def natural_round(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """C_nat(t) for every element of the float32 tensor ``t`` (a new tensor)."""
    bits = t.view(torch.int32)
    fraction = (bits & ((1 << FRACTION) - 1)).float() / (1 << FRACTION)    # m / 2^23
    up = torch.rand(t.shape, generator=generator, device=t.device) < fraction
    exponent = (((bits >> FRACTION) & 0xFF) + up).clamp_(max=TOP_EXPONENT)  # e or e + 1
    return ((bits & -(1 << 31)) | (exponent << FRACTION)).view(torch.float32)


def size(k: int) -> int:
    """Bytes of :func:`encode`'s 9-bit form of ``k`` values."""
    return k + math.ceil(k / 8)


def encode(values: torch.Tensor, out: torch.Tensor) -> None:
    """Write the powers of two ``values`` (float32, flat) to the bytes ``out``: the exponent
    bytes, then the sign bit plane."""
    k = values.numel()
    bits = values.view(torch.int32)
    out[:k] = (bits >> FRACTION) & 0xFF
    out[k:] = pack_bits(bits < 0)


def decode(part: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` values that :func:`encode` wrote to the bytes ``part``."""
    exponent = part[:k].int() << FRACTION
    sign = unpack_bits(part[k:], k).int() << 31
    return (sign | exponent).view(torch.float32)


@register("natural")
class NaturalCompression(rng.Stochastic, GatherCompressor):
    """C_nat of every element: 9 bits each, no levels, no error feedback."""

    paper = "Horvath et al., 2019"
    wire = "all-gather: exponent byte + sign bit per element"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = check_int(seed, "compressor.seed", 0)

    def step_bits(self, shape: torch.Size, level: object) -> int:
        return BITS * math.prod(shape)

    def message_size(self, layer: Layer, numel: int) -> int:
        return size(numel)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        encode(natural_round(grad, rng.draw(layer, "rounding", grad.device)), message)  # C_nat(g)
        return BITS * grad.numel()

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        out.zero_()
        for part in parts:                                             # sum_w C_nat(g_w)
            out.add_(decode(part, out.numel()))
        out.div_(divisor(out, parts.shape[0]))                         # / W
