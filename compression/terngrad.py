"""``compressor=terngrad``: TernGrad, stochastic ternary gradients with a shared scaler.

Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: Ternary Gradients to Reduce Communication in
Distributed Deep Learning" (NeurIPS 2017): Algorithm 1 with the ternarize function and scaler
sharing of Sec. 3, and the two techniques the paper derives from its gradient bound, layer-wise
ternarizing and gradient clipping. Per layer, with its scaler shared per block of
``block_size`` elements (the level; null: the layer, the paper's)::

    g = clip(g, -c sigma, c sigma)      gradient clipping (sigma: the std of the layer's g;
                                        ``clip``: c, the paper's 2.5; null: no clipping)
    s_w = max_{k in block} |g_k|        Sec. 3, ternarize: the scaler ||g||_inf, per block
    s = max_w s_w                       Sec. 3, scaler sharing (an all-gather of the scalers)
    b_k ~ Bernoulli(|g_k| / s)          Sec. 3, ternarize
    g~ = s sign(g) o b                  Alg. 1 l.3: ternarize; l.4: push b and sign(g)
    out = (1/W) sum_w g~_w              Alg. 1 l.7: the server's average; l.5: pull it

E[g~] = g (after clipping): s >= |g_k|, so P(b_k = 1) <= 1; E ||g~||^2 = s ||g||_1 (the bound of
the paper's Sec. 3 with s = ||g||_inf). No error feedback. Levels: the block size; Accordion
switches 16 <-> 4096 (ours: the paper has one scaler per layer).

Bits. ``bits``: the paper's count, 2 bits per element and 32 per scaler. ``wire_bits``: ours, two
collectives: an all-gather of the fp32 scalers, then one of two bit planes (b, sign) per layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import blocks, register, rng
from compression.base import Compressor, Layer, Scratch, Sent, divisor
from compression.comm import Comm, Steps
from compression.exchange import gather, layout, outbox, pack_bits, unpack_bits
from core.errors import check_int, check_number

MAX_BLOCK = 1 << 24


@register("terngrad")
class TernGrad(rng.Stochastic, Compressor):
    """Ternary ``s sign(g) o b`` with the scaler shared per block of ``block_size``."""

    level_field = "block_size"
    accordion_levels = (16, 4096)  # ours: about 4 bits per element vs 2
    paper = "Wen et al., NeurIPS 2017"
    wire = "all-gather of fp32 scalers, then all-gather of 2 bit planes per element"

    def __init__(self, block_size: int | None = None, clip: float | None = 2.5,
                 seed: int = 0) -> None:
        self.block_size = None if block_size is None else self.validate_level(block_size)
        self.clip = None if clip is None else check_number(clip, "compressor.clip", 0,
                                                           low_open=True)
        self.seed = check_int(seed, "compressor.seed", 0)
        self._scratch = Scratch()

    def default_level(self, shape: torch.Size) -> int:
        return self.block_size or math.prod(shape)

    def validate_level(self, level: Any, field: str | None = None) -> int:
        return check_int(level, field or "compressor.block_size", 1, MAX_BLOCK)

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        n = math.prod(shape)
        return 2 * n + 32 * blocks.count(n, level)

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        self.start_streams(layers, comm)
        flats = [self._clipped(g.view(-1)) for g in grads]
        counts = [blocks.count(g.numel(), x.level) for x, g in zip(layers, flats, strict=True)]
        own = torch.cat([blocks.rows(g, x.level).abs().amax(1)           # s_w per block
                         for x, g in zip(layers, flats, strict=True)])
        scalers = (yield comm.all_gather(own)).view(comm.world_size, -1).amax(0)  # s = max_w
        widths = [math.ceil(g.numel() / 8) for g in flats]
        offsets, length = layout([2 * w for w in widths])
        message = outbox(self._scratch, layers[0], length, torch.uint8, grads[0])
        shared = []
        for x, g, at, width, s in zip(layers, flats, offsets, widths,
                                      scalers.split(counts), strict=True):
            s = blocks.spread(s, x.level, g.numel())
            p = torch.where(s > 0, g.abs() / s, 0.0)                     # |g_k| / s
            gen = rng.draw(x, "rounding", g.device)
            b = torch.rand(g.numel(), generator=gen, device=g.device) < p  # b_k ~ Bernoulli
            message[at:at + width] = pack_bits(b)
            message[at + width:at + 2 * width] = pack_bits(g < 0)
            shared.append(s)
        parts = yield from gather(comm, self._scratch, layers[0], message)
        for grad, at, width, s in zip(grads, offsets, widths, shared, strict=True):
            out, n = grad.view(-1), grad.numel()
            votes = torch.zeros(n, device=out.device)
            for part in parts:                                          # sum_w sign_w o b_w
                negative = unpack_bits(part[at + width:at + 2 * width], n)
                b = unpack_bits(part[at:at + width], n).float()
                votes += torch.where(negative, -b, b)
            torch.mul(votes, s / divisor(s, comm.world_size), out=out)  # s / W sum_w ...
        return [Sent(self.step_bits(x.shape, x.level), 32 * count + 16 * width)
                for x, count, width in zip(layers, counts, widths, strict=True)]

    def _clipped(self, g: torch.Tensor) -> torch.Tensor:
        """g clipped to +-c sigma (a copy; the gradient itself unless ``clip`` is set)."""
        if self.clip is None:
            return g
        # c sigma in float64 on the device, as float(sigma) * c on the host gave (no host sync)
        bound = (g.std(correction=0).double() * self.clip).to(g.dtype)
        return g.clamp(-bound, bound)
