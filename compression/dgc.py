"""``compressor=dgc``: Deep Gradient Compression.

Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the Communication Bandwidth for
Distributed Training" (ICLR 2018): Algorithm 1 (sparsification with local accumulation) with the
techniques of Sec. 3: momentum correction and local gradient clipping (Sec. 3.2), momentum factor
masking (Sec. 3.3), and the sampled threshold of Sec. 5. Per layer of n elements, with
k = max(1, floor(ratio n)) and W workers::

    g = g min(1, C W^-1/2 / ||g||)   Sec. 3.2, local gradient clipping (C = ``clip_norm``;
                                     per layer: the hook sees a bucket, not the whole model)
    u = m u + g                      Sec. 3.2, momentum correction (m = ``momentum``)
    v = v + u                        Sec. 3.2 / Alg. 1 l.6: accumulate locally
    thr = the top ratio of |v| on a random sample of ``sample_ratio`` n elements (at least
          2 / ratio; layers of up to 16384 elements: all of them, an exact top-k)   Sec. 5
    S = {i : |v_i| >= thr}, cut to its k largest if larger   Alg. 1 l.9-10, Sec. 5
    send v[S] and S                  Alg. 1 l.11 (``natural: true``: C_nat(v[S]), 9 bits each)
    v[S] -= sent, u[S] = 0           Alg. 1 l.12; Sec. 3.3, momentum factor masking
    o = (1/W) sum_w sparse_w         Alg. 1 l.14, averaged

With momentum correction the message already carries the momentum, and the authors' optimizer
adds momentum to the weight decay only. Ours is plain SGD with momentum m, so the hook hands it
``o_t - m o_{t-1}``: its momentum buffer then holds exactly o_t (plus momentum on the weight
decay), which is their update (conf/compressor/dgc.yaml takes m from ``optimizer.momentum``;
without Nesterov). ``momentum: 0`` is sparsification with error feedback alone.

The warm-up of the sparsity (Sec. 3.3: 75%, 93.75%, 98.4375%, 99.6%, 99.9% over the first
epochs) is a schedule of the level, not part of the compressor: ``method=dgc_warmup`` runs it
(``scheduler=plan``), ``scheduler=accordion`` switches between its ends instead.

Levels: the fraction ``ratio`` of each layer's elements kept; Accordion switches 0.25 (the
warm-up's first level) <-> 0.001 (the paper's 99.9% sparsity). Bits: ``bits`` counts 32-bit
values (9 with ``natural``) and 32-bit indices of the elements sent, as the paper; our message
has k slots whatever |S| (an all-gather of fixed length), so ``wire_bits`` counts k.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import natural as nat
from compression import register, rng
from compression.base import Layer, Sent, divisor
from compression.comm import Comm, Steps
from compression.exchange import GatherCompressor
from compression.memory import ErrorFeedback
from compression.topk import kept
from core.errors import check_bool, check_int, check_number, check_ratio

EXACT = 1 << 14  # layers up to this size take the exact top-k: sampling would not pay


@register("dgc")
class DGC(rng.Stochastic, GatherCompressor):
    """Sparsify the locally accumulated velocity v with a sampled threshold."""

    level_field = "ratio"
    accordion_levels = (0.25, 0.001)  # the warm-up's first level and the final one (Sec. 3.3)
    streams = {"sample": False}  # the threshold's sample (and C_nat's rounding), per worker
    paper = "Lin et al., ICLR 2018"
    wire = "all-gather: k int32 indices + k fp32 values (natural: 9-bit values)"

    def __init__(self, ratio: float = 0.001, momentum: float = 0.0,
                 clip_norm: float | None = None, sample_ratio: float = 0.01,
                 natural: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.ratio = check_ratio(ratio, "compressor.ratio")
        self.momentum = check_number(momentum, "compressor.momentum", 0, 1, high_open=True)
        self.clip_norm = None if clip_norm is None else check_number(
            clip_norm, "compressor.clip_norm", 0, low_open=True)
        self.sample_ratio = check_ratio(sample_ratio, "compressor.sample_ratio")
        self.natural = check_bool(natural, "compressor.natural")
        self.seed = check_int(seed, "compressor.seed", 0)
        self.memory = ErrorFeedback(key="v")          # v: what was accumulated, not yet sent
        self._u = ErrorFeedback(key="u")               # u: the local momentum
        self._previous = ErrorFeedback(key="previous")  # o_{t-1}: the last step's mean

    def default_level(self, shape: torch.Size) -> float:
        return self.ratio

    def validate_level(self, level: Any, field: str | None = None) -> float:
        return check_ratio(level, field or "compressor.ratio")

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        if self.clip_norm is not None:                 # local gradient clipping
            bound = self.clip_norm / math.sqrt(comm.world_size)
            for g in grads:
                g.mul_(min(1.0, bound / (float(g.norm()) + 1e-12)))
        return (yield from super().aggregate(layers, grads, comm))

    def message_size(self, layer: Layer, numel: int) -> int:
        k = kept(numel, layer.level)
        return 4 * k + 4 * math.ceil(self._value_bytes(k) / 4)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        n, k = grad.numel(), kept(grad.numel(), layer.level)
        u = grad
        if self.momentum:
            u = self._u.buffer(layer, n, grad).mul_(self.momentum).add_(grad)  # u = m u + g
        v = self.memory.compensate(layer, u)                                  # v = v + u
        gen = rng.draw(layer, "sample", grad.device)
        index = self._select(v.abs(), k, layer.level, gen)                    # S
        values = v[index]
        if self.natural:
            values = nat.natural_round(values, gen)
        slots = message[:4 * k].view(torch.int32)
        slots.zero_()[:index.numel()] = index
        self._write_values(values, k, message[4 * k:])
        v.index_add_(0, index, values, alpha=-1)                              # v[S] -= sent
        if self.momentum:
            u.index_fill_(0, index, 0)                                         # u[S] = 0
        return index.numel() * (32 + (nat.BITS if self.natural else 32))

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        k = kept(out.numel(), layer.level)
        out.zero_()
        for part in parts:                                                     # sum_w sparse_w
            values = (nat.decode(part[4 * k:], k) if self.natural
                      else part[4 * k:8 * k].view(torch.float32))
            out.index_add_(0, part[:4 * k].view(torch.int32), values)
        out.div_(divisor(out, parts.shape[0]))                                 # o = mean
        if self.momentum:                                                      # o_t - m o_{t-1}
            previous = self._previous.buffer(layer, out.numel(), out)
            current = out.clone()
            out.sub_(previous, alpha=self.momentum)
            previous.copy_(current)

    def _select(self, magnitude: torch.Tensor, k: int, ratio: float,
                gen: torch.Generator) -> torch.Tensor:
        """S in ascending order: the elements at or above the threshold of a random sample of
        |v| (all of |v| for small layers), at most the k largest."""
        n = magnitude.numel()
        samples = max(math.ceil(n * self.sample_ratio), math.ceil(2 / ratio))
        if n <= EXACT or samples >= n:
            threshold = torch.topk(magnitude, k, sorted=False).values.min()
        else:
            sample = magnitude[torch.randint(n, (samples,), generator=gen,
                                             device=magnitude.device)]
            top = max(1, math.ceil(samples * ratio))
            threshold = torch.topk(sample, top, sorted=False).values.min()
        index = (magnitude >= threshold).nonzero().squeeze(1)
        if index.numel() > k:                                                  # hierarchical
            index = index[torch.topk(magnitude[index], k, sorted=False).indices].sort().values
        return index

    def _value_bytes(self, k: int) -> int:
        return nat.size(k) if self.natural else 4 * k

    def _write_values(self, values: torch.Tensor, k: int, out: torch.Tensor) -> None:
        """The sent values in k slots (zeros after them), fp32 or 9-bit natural; padding 0."""
        padded = values.new_zeros(k)
        padded[:values.numel()] = values
        out.zero_()
        if self.natural:
            nat.encode(padded, out[:nat.size(k)])
        else:
            out[:4 * k].view(torch.float32).copy_(padded)
