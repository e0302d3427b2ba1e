"""Blocks of consecutive elements that share one scale (QSGD's buckets, TernGrad's and 1-bit
SGD's blocks): a flat layer of n elements is ceil(n / size) blocks, the last one maybe shorter.
"""

from __future__ import annotations

import math

import torch


def count(n: int, size: int) -> int:
    """How many blocks of ``size`` elements a layer of ``n`` elements has."""
    return math.ceil(n / size)


def rows(x: torch.Tensor, size: int) -> torch.Tensor:
    """The flat ``x`` as one row per block, the last row zero-padded (a copy where padding is
    needed). A block larger than the layer is the layer: no padding to ``size``."""
    n = x.numel()
    width = min(size, n)
    blocks = count(n, width)
    if blocks * width == n:
        return x.view(blocks, width)
    padded = x.new_zeros(blocks * width)
    padded[:n] = x
    return padded.view(blocks, width)


def spread(values: torch.Tensor, size: int, n: int) -> torch.Tensor:
    """Each of the ``n`` elements' block value (``values``: one per block, in order)."""
    return values.repeat_interleave(min(size, n))[:n]
