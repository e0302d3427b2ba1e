"""``compressor=onebit``: 1-bit SGD with error feedback.

Seide, Fu, Droppo, Li, Yu, "1-Bit Stochastic Gradient Descent and its Application to
Data-Parallel Distributed Training of Speech DNNs" (Interspeech 2014): 1-bit quantization
with error feedback (their Sec. 3), per block of ``block_size`` elements::

    acc = g + e                             error feedback: add the last quantization error
    q_i = [acc_i >= 0]                      one bit per element, threshold 0
    a+ = mean {acc_i : q_i}, a- = mean {acc_i : not q_i}   per block: the two reconstruction
                                            values that minimize the squared error
    e = acc - (q_i ? a+ : a-)               the quantization error, fed back next step
    out = (1/W) sum_w (q_w ? a+_w : a-_w)   every worker decodes and averages

Seide et al. share the two values per column of a weight matrix; our default (null) shares them
per row of the layer viewed as (shape[0], -1). Levels: the block size; Accordion switches
16 <-> 4096 (ours). Bits: one per element and 64 per block, as the paper's message and ours
(an all-gather: fp32 a+, a- per block, then the bits; padded to 32-bit words).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import blocks, register
from compression.base import Layer, divisor
from compression.exchange import GatherCompressor, pack_bits, unpack_bits
from compression.memory import ErrorFeedback
from core.errors import check_int

MAX_BLOCK = 1 << 24


@register("onebit")
class OneBitSGD(GatherCompressor):
    """1-bit quantization with error feedback, two reconstruction values per block."""

    level_field = "block_size"
    accordion_levels = (16, 4096)  # ours: 5 bits per element vs about 1
    paper = "Seide et al., Interspeech 2014"
    wire = "all-gather: 2 fp32 values per block + 1 bit per element"

    def __init__(self, block_size: int | None = None) -> None:
        super().__init__()
        self.block_size = None if block_size is None else self.validate_level(block_size)
        self.memory = ErrorFeedback()

    def default_level(self, shape: torch.Size) -> int:
        return self.block_size or math.prod(shape[1:])

    def validate_level(self, level: Any, field: str | None = None) -> int:
        return check_int(level, field or "compressor.block_size", 1, MAX_BLOCK)

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        n = math.prod(shape)
        return n + 64 * blocks.count(n, level)

    def message_size(self, layer: Layer, numel: int) -> int:
        return 8 * blocks.count(numel, layer.level) + 4 * math.ceil(numel / 32)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        acc = self.memory.compensate(layer, grad)                        # acc = g + e
        n, count = acc.numel(), blocks.count(acc.numel(), layer.level)
        q = acc >= 0                                                     # q_i
        values = message[:8 * count].view(torch.float32).view(2, count)  # a+, a-
        for row, side in zip(values, (q, ~q), strict=True):
            total = blocks.rows(torch.where(side, acc, 0.0), layer.level).sum(1)
            hits = blocks.rows(side.float(), layer.level).sum(1)
            torch.div(total, hits.clamp_(min=1), out=row)               # mean of each side
        message[8 * count:].zero_()[:math.ceil(n / 8)] = pack_bits(q)
        acc.sub_(_decoded(values, q, layer.level))                       # e = acc - decoded
        return self.step_bits(layer.shape, layer.level)

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        n, count = out.numel(), blocks.count(out.numel(), layer.level)
        out.zero_()
        for part in parts:                                               # sum_w decoded_w
            values = part[:8 * count].view(torch.float32).view(2, count)
            out.add_(_decoded(values, unpack_bits(part[8 * count:], n), layer.level))
        out.div_(divisor(out, parts.shape[0]))                           # / W


def _decoded(values: torch.Tensor, q: torch.Tensor, block: int) -> torch.Tensor:
    """Each element's reconstruction: its block's a+ where q, a- elsewhere."""
    n = q.numel()
    return torch.where(q, blocks.spread(values[0], block, n), blocks.spread(values[1], block, n))
