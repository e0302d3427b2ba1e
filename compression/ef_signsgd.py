"""``compressor=ef_signsgd``: scaled sign with error feedback (Karimireddy et al., ICML 2019).

Alg. 1 (EF-SGD) with the scaled sign C(p) = ||p||_1 / d * sign(p), per layer and per block of
``level`` elements (the paper's: one block per layer; the learning rate stays with the
optimizer, as for the other compressors here)::

    acc = g + e                 Alg. 1 l.4: error feedback
    s_b = mean_{j in b} |acc_j| Alg. 1 l.5: C's scale, per block b
    msg = s, sign(acc)          one fp32 per block + one bit per element (sign(0) = +)
    e = acc - s_b sign(acc)     Alg. 1 l.7: what the message left out
    out = (1/W) sum_w s_w sign_w
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import register
from compression.base import Layer, divisor
from compression.exchange import GatherCompressor, pack_bits, unpack_bits
from compression.memory import ErrorFeedback
from core.errors import check_bool, check_int

MAX_BLOCK = 1 << 24  # largest block_size accepted


@register("ef_signsgd")
class EFSignSGD(GatherCompressor):
    """``block_size`` (the level) elements share a scale; null: the whole layer."""

    level_field = "block_size"
    accordion_levels = (16, 4096)  # ours: 3 bits per element vs about 1
    paper = "Karimireddy et al., ICML 2019"
    wire = "all-gather: fp32 scale per block + 1 sign bit per element"

    def __init__(self, block_size: int | None = None, error_feedback: bool = True) -> None:
        super().__init__()
        self.block_size = None if block_size is None else self.validate_level(block_size)
        self.memory = ErrorFeedback(check_bool(error_feedback, "compressor.error_feedback"))

    def default_level(self, shape: torch.Size) -> int:
        return self.block_size or math.prod(shape)

    def validate_level(self, level: Any, field: str | None = None) -> int:
        # A layer is padded to whole blocks: a block far larger than any layer would allocate
        # its size. (The default, null, is each layer's own size, whatever it is.)
        return check_int(level, field or "compressor.block_size", 1, MAX_BLOCK)

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        return math.prod(shape) + 32 * math.ceil(math.prod(shape) / level)

    def message_size(self, layer: Layer, numel: int) -> int:  # scales, then signs: whole words
        return 4 * math.ceil(math.ceil(numel / layer.level) + numel / 32)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        acc = self.memory.compensate(layer, grad)                  # acc = g + e
        blocks = math.ceil(acc.numel() / layer.level)
        padded = acc.new_zeros(blocks * layer.level)
        padded[:acc.numel()] = acc.abs()
        counts = acc.new_full((blocks,), layer.level)
        counts[-1:].fill_(acc.numel() - (blocks - 1) * layer.level)  # a fill: no copy, no sync
        scale = message[:4 * blocks].view(torch.float32)
        torch.div(padded.view(blocks, -1).sum(1), counts, out=scale)  # s_b
        negative = acc < 0
        message[4 * blocks:].zero_()[:math.ceil(acc.numel() / 8)] = pack_bits(negative)
        if self.memory.enabled:                                     # e = acc - s sign(acc)
            acc.sub_(_signed(scale, negative, layer.level))
        return self.step_bits(layer.shape, layer.level)

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        blocks = math.ceil(out.numel() / layer.level)
        out.zero_()
        for part in parts:                                          # sum_w s_w sign_w
            negative = unpack_bits(part[4 * blocks:], out.numel())
            out.add_(_signed(part[:4 * blocks].view(torch.float32), negative, layer.level))
        out.div_(divisor(out, parts.shape[0]))                      # / W


def _signed(scale: torch.Tensor, negative: torch.Tensor, block: int) -> torch.Tensor:
    """s_b sign: each element's block scale, negated where ``negative``."""
    s = scale.repeat_interleave(block)[:negative.numel()]
    return torch.where(negative, -s, s)
