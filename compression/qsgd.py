"""``compressor=qsgd``: QSGD, stochastic quantization of each bucket to s levels.

Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding" (NeurIPS 2017): Algorithm 1 (each worker quantizes its gradient and
sends it; every worker applies the mean of the decoded messages) with the quantizer Q_s of
Sec. 3.1, applied to each bucket v of d = ``bucket_size`` consecutive elements of a layer::

    l_i = floor(s |v_i| / ||v||_2)                    Sec. 3.1: the level below, 0 <= l_i <= s
    xi_i = (l_i + 1) / s  w.p.  s |v_i| / ||v||_2 - l_i,  else  l_i / s          Sec. 3.1
    Q_s(v_i) = ||v||_2 sgn(v_i) xi_i                  Sec. 3.1
    out = (1/W) sum_w Q_s(v_w)                        Alg. 1: decode, average

Q_s is unbiased and E ||Q_s(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 (Lemma 3.1). No
error feedback. Levels: s = ``levels`` (>= 1); Accordion switches 256 <-> 4 (the pair issue 26
names). Buckets: the paper's analysis quantizes the whole vector (``bucket_size: null``) and its
experiments quantize buckets, which keeps the variance bound small at low s; ours: d = 512.

Bits. ``bits``: the paper's Code_s (Sec. 3.1, bounded in Theorem 3.2): per bucket 32 bits for
||v||_2, then per non-zero level one Elias (omega, "recursive") code of its distance from the
previous non-zero of the bucket (for the first, its position, from 1), a sign bit and the Elias
code of the level s xi_i. ``wire_bits``: our fixed-length message, per bucket the fp32 norm, per
element a sign bit and ceil(log2(s + 1)) level bits (bit planes, each in whole bytes),
padded to 32-bit words.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import _qsgd_kernel as _kernel
from compression import blocks, register, rng
from compression.base import Layer, divisor
from compression.exchange import GatherCompressor, pack_bits, unpack_bits
from core.errors import check_int
from core.native import usable

MAX_LEVELS = 1 << 16
MAX_BUCKET = 1 << 24


def _omega_lengths(top: int) -> list[int]:
    """Elias omega code lengths of 0 (unused) .. top, by the recursion of :func:`omega_bits`."""
    lengths = [1, 1]
    for k in range(2, top + 1):
        lengths.append(k.bit_length() + lengths[k.bit_length() - 1])
    return lengths


OMEGA = {torch.device("cpu"): torch.tensor(_omega_lengths(64))}  # per device, copied once
# (a copy to the GPU waits for it): every length of a digit count - 1 (int64: <= 63)


def omega_bits(k: torch.Tensor) -> torch.Tensor:
    """Length of the Elias omega code of each integer k >= 1 (Elias 1975): a final 0, and while
    k > 1 the binary digits of k, then k = (their count) - 1. So for k > 1 it is the digits of
    k plus the length for (digits - 1), at most 63: one table look-up."""
    digits = torch.frexp(k.double()).exponent.long()  # floor(log2 k) + 1
    if k.device not in OMEGA:
        OMEGA[k.device] = OMEGA[torch.device("cpu")].to(k.device)
    return torch.where(k > 1, digits + OMEGA[k.device][(digits - 1).clamp_(min=0)], 1)


def code_bits(codes: torch.Tensor, bucket: int) -> int | torch.Tensor:
    """Code_s's bits for the flat levels ``codes`` (s xi_i) in buckets of ``bucket``, norms
    left out: per non-zero, Elias(gap) + 1 sign bit + Elias(level). On CUDA a 0-d tensor on the
    device (no host sync per step: the hook reads it once an epoch), else an int.

    The gap is to the previous non-zero of the bucket (the running maximum of the non-zeros'
    positions, a scan without ``nonzero``), or from the bucket's start for its first one. On
    contiguous int32 CPU codes the C kernel counts the same in one pass
    (:mod:`compression._qsgd_kernel`)."""
    counted = _kernel.code_bits(codes, bucket)
    if counted is not None:
        return counted
    at = torch.arange(codes.numel(), device=codes.device)
    kept = codes != 0
    last = torch.where(kept, at, -1).cummax(0).values                  # last non-zero <= i
    previous = torch.cat([last.new_full((1,), -1), last[:-1]])          # last non-zero < i
    start = at - at % bucket
    gap = torch.where(previous >= start, at - previous, at - start + 1)
    each = omega_bits(gap) + 1 + omega_bits(codes.long().clamp(min=1))
    total = torch.where(kept, each, 0).sum()
    return total if total.is_cuda else int(total)


@register("qsgd")
class QSGD(rng.Stochastic, GatherCompressor):
    """Q_s per bucket of ``bucket_size`` elements (null: the whole layer), s = ``levels``."""

    level_field = "levels"
    accordion_levels = (256, 4)  # issue 26's pair: about 10 bits per element vs 4 on our wire
    paper = "Alistarh et al., NeurIPS 2017"
    wire = "all-gather: fp32 norm per bucket, sign + ceil(log2(s+1)) level bits per element"

    def __init__(self, levels: int = 256, bucket_size: int | None = 512, seed: int = 0) -> None:
        super().__init__()
        self.levels = self.validate_level(levels)
        self.bucket_size = (None if bucket_size is None
                            else check_int(bucket_size, "compressor.bucket_size", 1, MAX_BUCKET))
        self.seed = check_int(seed, "compressor.seed", 0)

    def default_level(self, shape: torch.Size) -> int:
        return self.levels

    def validate_level(self, level: Any, field: str | None = None) -> int:
        return check_int(level, field or "compressor.levels", 1, MAX_LEVELS)

    def message_size(self, layer: Layer, numel: int) -> int:
        planes = 1 + layer.level.bit_length()  # the sign, then the level's bits
        return 4 * blocks.count(numel, self._bucket(numel)) + 4 * math.ceil(
            planes * math.ceil(numel / 8) / 4)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        n, s, d = grad.numel(), layer.level, self._bucket(grad.numel())
        v = blocks.rows(grad, d)
        norms = message[:4 * v.shape[0]].view(torch.float32)
        torch.linalg.vector_norm(v, dim=1, out=norms)                   # ||v||_2
        scale = torch.where(norms > 0, s / norms, 0.0)
        ratio = (v.abs() * scale[:, None]).view(-1)[:n]                 # s |v_i| / ||v||_2
        low = ratio.floor()                                             # l_i
        up = torch.rand(n, generator=rng.draw(layer, "rounding", grad.device),
                        device=grad.device) < ratio - low               # w.p. s|v_i|/||v|| - l_i
        codes = (low + up).clamp_(max=s).to(torch.int32)                # s xi_i
        width, planes = math.ceil(n / 8), message[4 * v.shape[0]:]
        planes[width * (1 + s.bit_length()):].zero_()                   # padding
        lib = _kernel.kernel() if _kernel_takes(grad, message) else None
        if lib is not None:                                             # the same planes, in C
            _kernel.pack(lib, codes, grad, planes, s.bit_length())
            return 32 * v.shape[0] + code_bits(codes, d)
        planes[:width] = pack_bits(grad < 0)                            # sgn(v_i)
        for bit in range(s.bit_length()):                               # the level, bit by bit
            planes[width * (1 + bit):width * (2 + bit)] = pack_bits((codes >> bit) & 1 == 1)
        return 32 * v.shape[0] + code_bits(codes, d)

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        n, s = out.numel(), layer.level
        d = self._bucket(n)
        count, width = blocks.count(n, d), math.ceil(n / 8)
        lib = _kernel.kernel() if _kernel_takes(out, *parts) else None
        if lib is not None:                                             # the same sum, in C
            for w, part in enumerate(parts):                            # sum_w Q_s(v_w)
                _kernel.add(lib, out, d, part[:4 * count].view(torch.float32), s,
                            part[4 * count:], s.bit_length(), w == 0)
            out.div_(divisor(out, parts.shape[0]))                      # / W
            return
        codes = torch.empty(n, dtype=torch.int32, device=out.device)
        out.zero_()
        for part in parts:                                              # sum_w Q_s(v_w)
            planes = part[4 * count:]
            codes.zero_()
            for bit in range(s.bit_length()):                           # s xi_i
                codes.bitwise_or_(unpack_bits(planes[width * (1 + bit):width * (2 + bit)],
                                              n).int() << bit)
            value = blocks.spread(part[:4 * count].view(torch.float32) / s, d, n) * codes
            out.add_(torch.where(unpack_bits(planes[:width], n), -value, value))  # sgn(v_i)
        out.div_(divisor(out, parts.shape[0]))                          # / W

    def _bucket(self, numel: int) -> int:
        return min(self.bucket_size or numel, numel)


def _kernel_takes(floats: torch.Tensor, *messages: torch.Tensor) -> bool:
    """Whether the C kernel can take a step's float32 tensor and its messages (each contiguous,
    on the CPU: this worker's, or each worker's received)."""
    return usable(torch.float32, floats) and usable(torch.uint8, *messages)
