"""``compressor=randomk``: Random-K sparsification with error feedback and a shared seed.

Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018): Algorithm 1 (mem-SGD)
with the compressor rand_k (k coordinates drawn uniformly without replacement), per layer of n
elements, k = max(1, floor(ratio n)), W workers::

    acc = g + e                 Alg. 1: add the memory (the learning rate stays with the optimizer)
    S = rand_k                  the same S on every worker: drawn from a stream whose seed all
                                workers share, so only the k values travel, not the indices
    o_S = (1/W) sum_w acc_w[S]  one all-reduce of the bucket's values; out = 0 off S
    e = acc, e[S] = 0           Alg. 1: the memory keeps what was not sent

Levels: the fraction ``ratio`` kept; Accordion switches 0.99 <-> 0.10 (Accordion's Top-K pair,
for a like-for-like comparison with Top-K). Bits: 32 per value sent, as the paper counts and
our all-reduce sends. ``error_feedback: false`` drops what is not sent.
"""

from __future__ import annotations

from typing import Any

import torch

from compression import register, rng
from compression.base import Compressor, Layer, Sent, divisor
from compression.comm import Comm, Steps
from compression.memory import ErrorFeedback
from compression.topk import kept
from core.errors import check_bool, check_int, check_ratio


@register("randomk")
class RandomK(rng.Stochastic, Compressor):
    """Keep ``ratio`` of each layer's elements, chosen at random alike on every worker."""

    level_field = "ratio"
    accordion_levels = (0.99, 0.10)  # Accordion's Top-K pair (Agarwal et al., Table 3)
    streams = {"indices": True}      # shared by every worker
    paper = "Stich et al., NeurIPS 2018"
    wire = "all-reduce of k fp32 values (indices from the shared seed)"

    def __init__(self, ratio: float = 0.1, error_feedback: bool = True, seed: int = 0) -> None:
        self.ratio = check_ratio(ratio, "compressor.ratio")
        self.memory = ErrorFeedback(check_bool(error_feedback, "compressor.error_feedback"))
        self.seed = check_int(seed, "compressor.seed", 0)

    def default_level(self, shape: torch.Size) -> float:
        return self.ratio

    def validate_level(self, level: Any, field: str | None = None) -> float:
        return check_ratio(level, field or "compressor.ratio")

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        return 32 * kept(shape.numel(), level)

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        self.start_streams(layers, comm)
        ks = [kept(g.numel(), x.level) for x, g in zip(layers, grads, strict=True)]
        values = grads[0].new_empty(sum(ks))
        chosen, at = [], 0
        for x, g, k in zip(layers, grads, ks, strict=True):
            acc = self.memory.compensate(x, g)                             # acc = g + e
            gen = rng.draw(x, "indices", g.device)
            index = torch.randperm(g.numel(), generator=gen, device=g.device)[:k]  # S
            torch.index_select(acc, 0, index, out=values[at:at + k])
            if self.memory.enabled:
                acc.index_fill_(0, index, 0)                               # e[S] = 0
            chosen.append(index)
            at += k
        yield comm.all_reduce(values)
        values.div_(divisor(values, comm.world_size))                         # o_S
        at = 0
        for g, index, k in zip(grads, chosen, ks, strict=True):
            g.view(-1).zero_().index_copy_(0, index, values[at:at + k])
            at += k
        return [Sent(32 * k, 32 * k, k) for k in ks]
