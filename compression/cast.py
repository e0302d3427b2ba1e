"""``compressor=fp16`` and ``compressor=bf16``: the gradient cast to 16 bits, the baselines.

Each bucket's matrix-shaped layers are cast to float16 (IEEE half) or bfloat16, divided by the
number of workers W and all-reduced in that type; every worker casts the sum back to float32
(PyTorch's ``fp16_compress_hook`` and ``bf16_compress_hook`` do the same, to the bucket whole:
``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``; dividing first keeps the sum
in range). 16 bits per element on the wire and in the count; no levels, no error feedback.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from compression import register
from compression.base import Compressor, Layer, Sent
from compression.comm import Comm, Steps


class Cast(Compressor):
    """All-reduce the layers in ``dtype``."""

    dtype: ClassVar[torch.dtype]
    paper = "baseline (as PyTorch's fp16 / bf16 DDP hooks)"

    def step_bits(self, shape: torch.Size, level: object) -> int:
        return self.dtype.itemsize * 8 * shape.numel()

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        flat = _flatten_dense_tensors(grads).to(self.dtype).div_(comm.world_size)
        yield comm.all_reduce(flat)                        # sum_w g_w / W, in dtype
        torch._foreach_copy_(grads, _unflatten_dense_tensors(flat, grads))
        bits = [self.step_bits(g.shape, None) for g in grads]
        return [Sent(b, b) for b in bits]


@register("fp16")
class FP16(Cast):
    """IEEE half precision."""

    dtype = torch.float16
    wire = "all-reduce in float16"


@register("bf16")
class BF16(Cast):
    """bfloat16."""

    dtype = torch.bfloat16
    wire = "all-reduce in bfloat16"
