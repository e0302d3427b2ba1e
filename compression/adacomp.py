"""``compressor=adacomp``: Adaptive Residual Gradient Compression.

Chen, Choi, Brand, Agrawal, Zhang, Gopalakrishnan, "AdaComp: Adaptive Residual Gradient
Compression for Data-Parallel Distributed Training" (AAAI 2018), Algorithm 2. For every
matrix-shaped layer, flattened row-major into bins of L_T elements (the last bin may be
shorter)::

    G = residue + dW                       Alg. 2: accumulate the new gradient
    H = G + dW                             Alg. 2: the soft-threshold probe (= residue + 2 dW)
    g_max(i) = max_{j in bin i} |G(j)|     Alg. 2: each bin's local maximum
    s = mean_i g_max(i)                    Alg. 2: one scale per layer
    send j  iff  |H(j)| >= g_max(bin of j) Alg. 2: the soft threshold
    G_q(j) = sign(G(j)) s                  Alg. 2: ternary quantization of what is sent
    residue = G - G_q (sent), G (not sent) Alg. 2: keep what was not transmitted
    out = (1/W) sum_w G_q,w                what every worker applies: the mean

``soft_threshold=false`` is the paper's hard Local Selection ablation: each bin sends only its
element of largest |G|. An element with G = 0 quantizes to 0 and is never sent (identical
result, no wasted bits).

Levels: the bin size L_T of the layer (an int >= 1); by default ``conv_bin_size`` for
convolution kernels (ndim >= 3) and ``fc_bin_size`` for fully-connected, embedding and
recurrent weights (ndim 2), the paper's 50 and 500.

Accounting. ``bits``: the paper's encoding, n_sent x (8 if L_T < 64 else 16) bits (sparse
indexed ternary values) + 32 for the scale, per layer per step. ``wire_bits``: our own message,
which is simpler: per layer an int32 count, the fp32 scale, and one int32 per sent element (its
index + 1, negated when the sign is negative), all layers of a bucket in one variable-length
all-gather (exchange the lengths, then a gather padded to the longest message); the length word
and the padding are counted with the bucket's first layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import _adacomp_kernel as _kernel
from compression import register
from compression.base import Compressor, Layer, Scratch, Sent
from compression.comm import Comm, Steps, all_gather_varlen
from engine.errors import check_bool, check_int

WORD_BITS = 32  # int32 / fp32 words of our wire format


@register("adacomp")
class AdaComp(Compressor):
    """AdaComp with bin size ``conv_bin_size`` (conv kernels) / ``fc_bin_size`` (matrices)."""

    level_field = "bin_size"

    def __init__(self, conv_bin_size: int = 50, fc_bin_size: int = 500,
                 soft_threshold: bool = True) -> None:
        self.conv_bin_size = check_int(conv_bin_size, "compressor.conv_bin_size", 1)
        self.fc_bin_size = check_int(fc_bin_size, "compressor.fc_bin_size", 1)
        self.soft_threshold = check_bool(soft_threshold, "compressor.soft_threshold")
        self._scratch = Scratch()

    def default_level(self, shape: torch.Size) -> int:
        return self.conv_bin_size if len(shape) >= 3 else self.fc_bin_size

    def validate_level(self, level: Any, field: str | None = None) -> int:
        return check_int(level, field or "level (AdaComp bin size L_T)", 1)

    def aggregate(self, layers: list[Layer], comm: Comm) -> Steps[list[Sent]]:
        world = comm.world_size
        counts, scales, signed = [], [], []
        for layer in layers:
            index, scale = self._select(layer)
            counts.append(index.numel())
            scales.append(scale)
            signed.append(index)
        header = torch.tensor(counts, dtype=torch.int32)
        scale_words = torch.stack(scales).to(torch.float32).view(torch.int32)
        message = torch.cat([header, scale_words, *signed])

        parts = yield from all_gather_varlen(comm, message)

        n_layers = len(layers)
        heads = torch.stack([p[:2 * n_layers] for p in parts])   # (W, 2 * layers)
        all_counts = heads[:, :n_layers]
        all_scales = heads[:, n_layers:].contiguous().view(torch.float32) / world
        starts = (2 * n_layers + all_counts.cumsum(1) - all_counts).tolist()
        count_list = all_counts.tolist()
        for j, layer in enumerate(layers):
            out = layer.grad.view(-1)
            lib = _kernel.kernel() if _kernel.usable(out) else None
            if lib is not None:                     # out = sum_w sign s_w / W, in one pass
                _kernel.decompress(lib, out, [p[starts[w][j]:] for w, p in enumerate(parts)],
                                   all_counts[:, j], all_scales[:, j])
                continue
            out.zero_()
            received = torch.cat([parts[w][starts[w][j]:starts[w][j] + count_list[w][j]]
                                  for w in range(world)])
            scale = torch.repeat_interleave(all_scales[:, j], all_counts[:, j])
            values = received.sign().to(layer.grad.dtype) * scale   # G_q / W of each worker
            out.index_add_(0, received.abs() - 1, values)           # (1/W) sum_w G_q,w

        longest = max(p.numel() for p in parts)
        sent = [Sent(c * (8 if layer.level < 64 else 16) + WORD_BITS, WORD_BITS * (2 + c))
                for layer, c in zip(layers, counts, strict=True)]
        overhead = WORD_BITS * (1 + longest - message.numel())  # length word + padding
        sent[0] = Sent(sent[0].bits, sent[0].wire_bits + overhead)
        return sent

    def _select(self, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """Update the layer's residue; return the sent elements (signed index + 1) and s.

        On contiguous float32 CPU tensors the C kernel does it (:mod:`compression.
        _adacomp_kernel`); elsewhere, or without a C compiler, the eager torch ops below do,
        with bit-identical results.
        """
        grad = layer.grad.view(-1)
        n, bin_size = grad.numel(), layer.level
        bins = math.ceil(n / bin_size)
        g = self._residue(layer, bins * bin_size)   # padded with zeros to whole bins
        lib = _kernel.kernel() if _kernel.usable(g, grad) else None
        if lib is None:
            return self._select_eager(g, grad, bins, bin_size)
        g_max = grad.new_empty(bins)
        lib.adacomp_max(g.data_ptr(), grad.data_ptr(), n, bin_size, g_max.data_ptr())  # g_max(i)
        scale = g_max.mean()                        # s = mean_i g_max(i), as the eager path
        sent = self._scratch.take("sent", n, grad, torch.int32)
        # G = residue + dW, the sent elements' signed indices, residue = G - G_q
        count = lib.adacomp_select(g.data_ptr(), grad.data_ptr(), n, bin_size,
                                   int(self.soft_threshold), g_max.data_ptr(), scale.item(),
                                   sent.data_ptr())
        return sent[:count].clone(), scale

    def _select_eager(self, g: torch.Tensor, grad: torch.Tensor, bins: int, bin_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_select` in torch ops (any device): ``g`` is the padded residue."""
        n = grad.numel()
        g[:n] += grad                               # G = residue + dW
        abs_g = torch.abs(g, out=self._scratch.take("h", g.numel(), g)).view(bins, bin_size)
        g_max = abs_g.amax(dim=1)                   # g_max(i) = max_{j in bin i} |G(j)|
        scale = g_max.mean()                        # s = mean_i g_max(i)
        if self.soft_threshold:
            h = abs_g.view(-1)                      # |G| no longer needed: reuse it for |H|
            torch.add(g[:n], grad, out=h[:n])       # H = G + dW (padding: H = G = 0)
            threshold = g_max.masked_fill(g_max == 0, math.inf)  # a bin of zeros sends none
            mask = self._scratch.take("mask", g.numel(), g, torch.bool)
            torch.ge(h.abs_().view(bins, bin_size), threshold[:, None],
                     out=mask.view(bins, bin_size))  # |H| >= g_max(i)
            index = mask.nonzero().squeeze(1)
        else:
            start = torch.arange(bins, device=grad.device) * bin_size
            index = (start + abs_g.argmax(dim=1))[g_max > 0]  # hard Local Selection
        sign = torch.index_select(g, 0, index).sign_()
        if not bool(sign.all()):                    # G = 0 quantizes to 0: nothing to send
            keep = sign != 0
            index, sign = index[keep], sign[keep]
        signed = (index.to(torch.int32) + 1) * sign.to(torch.int32)
        g.index_add_(0, index, sign.mul_(scale), alpha=-1)  # residue = G - G_q where sent
        return signed, scale

    @staticmethod
    def _residue(layer: Layer, padded: int) -> torch.Tensor:
        """The layer's residue (zeros at first), flat and zero-padded to ``padded`` elements."""
        residue = layer.memory.get("residue")
        if residue is None or residue.numel() != padded:
            n = layer.grad.numel()
            fresh = layer.grad.new_zeros(padded)
            if residue is not None:                 # bin size changed: keep the residue
                fresh[:n] = residue[:n]
            layer.memory["residue"] = residue = fresh
        return residue
