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

On float32 CPU tensors a C kernel (:mod:`compression._adacomp_kernel`) does all of it in one
pass per bin; it defers ``residue = G - G_q`` of the sent elements to the next step's pass
(:meth:`AdaComp.settle` applies it at once), with the same bits.

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

import ctypes
import math
from typing import Any

import torch

from compression import _adacomp_kernel as _kernel
from compression import register
from compression._native import usable
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
        world, n_layers = comm.world_size, len(layers)
        owner = layers[0]                           # this worker's bucket
        # The message: [count per layer | s per layer | each layer's signed indices], written
        # in place into a buffer with room for every element of every layer.
        room = self._scratch.take("message", 2 * n_layers + sum(x.grad.numel() for x in layers)
                                  + _kernel.SLACK, layers[0].grad, torch.int32, owner=owner)
        counts, scales = self._compress(layers, room[2 * n_layers:])
        end = 2 * n_layers + sum(counts)
        room[:n_layers].copy_(torch.tensor(counts, dtype=torch.int32))
        room[n_layers:2 * n_layers].copy_(torch.stack(scales).to(torch.float32).view(torch.int32))

        def gathered(numel: int) -> torch.Tensor:  # messages vary: room for 25% more at once
            return self._scratch.take("gathered", numel, room, owner=owner,
                                      reserve=min(numel * 5 // 4, world * room.numel()))

        parts = yield from all_gather_varlen(comm, room[:end], room, gathered)
        self._decompress(layers, parts)

        longest = max(p.numel() for p in parts)
        sent = [Sent(c * (8 if layer.level < 64 else 16) + WORD_BITS, WORD_BITS * (2 + c))
                for layer, c in zip(layers, counts, strict=True)]
        overhead = WORD_BITS * (1 + longest - end)  # length word + padding
        sent[0] = Sent(sent[0].bits, sent[0].wire_bits + overhead)
        return sent

    def _compress(self, layers: list[Layer], into: torch.Tensor
                  ) -> tuple[list[int], list[torch.Tensor]]:
        """Update every layer's residue; write the sent elements' signed indices (index + 1,
        negated when G < 0) to ``into``, layer after layer; return how many each layer sent,
        and each layer's s.

        On contiguous float32 CPU tensors the C kernel does it in one pass per bin (:mod:`
        compression._adacomp_kernel`), leaving the sent elements' G_q owed until the next step
        (see :meth:`settle`); elsewhere, or without a C compiler, the eager torch ops of
        :meth:`_select_eager` do, with bit-identical results. ``into`` has room for every
        element plus ``_kernel.SLACK``.
        """
        grads = [layer.grad.view(-1) for layer in layers]
        residues = [self._residue(layer) for layer in layers]
        lib = (_kernel.kernel() if usable(torch.float32, *grads, *residues)
               and usable(torch.int32, into) else None)
        if lib is None:
            counts, scales, end = [], [], 0
            for layer, g, grad in zip(layers, residues, grads, strict=True):
                self.settle(layer)
                signed, scale = self._select_eager(g, grad, layer.level)
                into[end:end + signed.numel()].copy_(signed)
                end += signed.numel()
                counts.append(signed.numel())
                scales.append(scale)
            return counts, scales
        bins = [math.ceil(grad.numel() / layer.level) for layer, grad in zip(layers, grads,
                                                                             strict=True)]
        g_max = self._scratch.take("g_max", sum(bins), grads[0])
        owed = [self._owed(lib, layer) for layer in layers]
        s_prev = torch.stack([layer.memory["scale"] for layer in layers])
        # Alg. 2: G = residue + dW, g_max(i), the sent elements' signed indices; G_q owed
        counts = _kernel.compress(lib, residues, grads, [x.level for x in layers],
                                  self.soft_threshold, owed, s_prev, g_max, into)
        scales = [m.mean() for m in g_max.split(bins)]  # s = mean_i g_max(i), as eager
        for layer, scale in zip(layers, scales, strict=True):
            layer.memory["scale"] = scale
        return counts, scales

    @staticmethod
    def _decompress(layers: list[Layer], parts: list[torch.Tensor]) -> None:
        """Every ``layer.grad`` = (1/W) sum_w G_q,w, from the workers' messages ``parts``."""
        world, n_layers = len(parts), len(layers)
        heads = torch.stack([p[:2 * n_layers] for p in parts]).cpu()  # (W, 2 * layers)
        all_counts = heads[:, :n_layers]
        all_scales = heads[:, n_layers:].contiguous().view(torch.float32) / world  # s_w / W
        starts = 2 * n_layers + all_counts.cumsum(1) - all_counts
        outs = [layer.grad.view(-1) for layer in layers]
        lib = _kernel.kernel() if usable(torch.float32, *outs) else None
        if lib is not None:                         # out = sum_w sign s_w / W, in one pass
            _kernel.decompress(lib, outs, parts, starts.T, all_counts.T, all_scales.T)
            return
        starts_list, count_list = starts.tolist(), all_counts.tolist()
        for j, out in enumerate(outs):
            out.zero_()
            received = torch.cat([parts[w][starts_list[w][j]:starts_list[w][j] + count_list[w][j]]
                                  for w in range(world)])
            scale = torch.repeat_interleave(all_scales[:, j], all_counts[:, j]).to(out.device)
            values = received.sign().to(out.dtype) * scale        # G_q / W of each worker
            out.index_add_(0, received.abs() - 1, values)         # (1/W) sum_w G_q,w

    def settle(self, layer: Layer) -> None:
        """Take the owed G_q off the residue (residue = G - sign(G) s where last sent): the
        kernel defers that to the next step, which reads the element anyway."""
        owed = layer.memory.pop("owed", None)
        bin_size = layer.memory.pop("owed_bin_size", None)
        scale = layer.memory.pop("scale", None)
        if owed is not None:
            residue = layer.memory["residue"]
            kernel = _kernel.kernel()
            assert kernel is not None, "an owed bitmap exists only where the kernel runs"
            kernel.adacomp_settle(residue.data_ptr(), math.prod(layer.shape), int(bin_size),
                                  owed.data_ptr(), scale.item())

    def _owed(self, lib: ctypes.CDLL, layer: Layer) -> torch.Tensor:
        """The layer's owed bitmap for its bin size (zeros, and s = 0, at first)."""
        if "owed" in layer.memory and int(layer.memory["owed_bin_size"]) != layer.level:
            self.settle(layer)                      # owed bits are laid out by bin
        if "owed" not in layer.memory:
            n = math.prod(layer.shape)
            layer.memory["owed"] = torch.zeros(lib.adacomp_owed_bytes(n, layer.level),
                                               dtype=torch.uint8)
            layer.memory["owed_bin_size"] = torch.tensor(layer.level)
            layer.memory["scale"] = torch.zeros(())
        return layer.memory["owed"]

    def _select_eager(self, g: torch.Tensor, grad: torch.Tensor, bin_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Alg. 2 for one layer in torch ops (any device): ``g`` is its residue, padded to
        whole bins; returns the sent elements' signed indices and s."""
        n, bins = grad.numel(), g.numel() // bin_size
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

    def _residue(self, layer: Layer) -> torch.Tensor:
        """The layer's residue (zeros at first), flat and zero-padded to whole bins (stored
        with ``_kernel.SLACK`` more elements, for the kernel)."""
        padded = math.ceil(math.prod(layer.shape) / layer.level) * layer.level
        residue = layer.memory.get("residue")
        if residue is None or residue.numel() != padded + _kernel.SLACK:
            self.settle(layer)
            n = layer.grad.numel()
            fresh = layer.grad.new_zeros(padded + _kernel.SLACK)
            if residue is not None:                 # bin size changed: keep the residue
                fresh[:n] = residue[:n]
            layer.memory["residue"] = residue = fresh
        return residue[:padded]
