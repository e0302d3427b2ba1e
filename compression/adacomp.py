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

Wire format (ours): per layer the fp32 scale s, then two bits per element as two byte arrays,
sent (bit set: sent) and sign (bit set: G < 0), a byte per group of 8 elements of a bin
(:func:`~compression._adacomp_kernel.group_bytes`). The ternary values are dense, so every
worker's message has the same length: all layers of a bucket go in one all-gather, with no
length exchange, and the decompress is a streaming pass with no scatter.

Accounting. ``bits``: the paper's encoding, n_sent x (8 if L_T < 64 else 16) bits (sparse
indexed ternary values) + 32 for the scale, per layer per step. ``wire_bits``: our message, 32
+ 16 x group_bytes per layer (about 2 bits per element: less than the paper's encoding above
1/4 (L_T < 64) or 1/8 of the elements sent, more below), the padding of the bucket's message
to whole words counted with its first layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import _adacomp_kernel as _kernel
from compression import register
from compression._adacomp_kernel import GROUP, group_bytes
from compression.base import Compressor, Layer, Scratch, Sent, divisor
from compression.comm import Comm, Steps
from compression.exchange import gather, layout, outbox, pack_bits, unpack_bits
from compression.memory import ErrorFeedback
from core.errors import check_bool, check_int
from core.native import usable

WORD_BITS = 32  # the fp32 scale of our wire format
MAX_BIN = 1 << 24  # largest bin size L_T accepted


def _grouped(n: int, bin_size: int) -> tuple[int, int]:
    """Bins of a layer of ``n`` elements, and bytes (groups of GROUP = 8) per bin."""
    return math.ceil(n / bin_size), math.ceil(bin_size / GROUP)


def pack_groups(mask: torch.Tensor, n: int, bin_size: int) -> torch.Tensor:
    """The bits of the flat bool ``mask`` (``n`` elements, maybe padded to whole bins), a byte
    per group of 8 elements of a bin: :func:`~compression._adacomp_kernel.group_bytes` bytes."""
    bins, per_bin = _grouped(n, bin_size)
    padded = mask.new_zeros(bins, per_bin * GROUP)
    elements = mask.new_zeros(bins * bin_size)
    elements[:n] = mask[:n]
    padded[:, :bin_size] = elements.view(bins, bin_size)
    return pack_bits(padded.view(-1))[:group_bytes(n, bin_size)]


def unpack_groups(packed: torch.Tensor, n: int, bin_size: int) -> torch.Tensor:
    """The flat bool mask of ``n`` elements whose bits :func:`pack_groups` packed."""
    bins, per_bin = _grouped(n, bin_size)
    whole = packed.new_zeros(bins * per_bin)
    whole[:packed.numel()] = packed
    bits = unpack_bits(whole, bins * per_bin * GROUP)
    return bits.view(bins, per_bin * GROUP)[:, :bin_size].reshape(-1)[:n]


def pairwise_mean(x: torch.Tensor) -> torch.Tensor:
    """The mean of the 1-D ``x``, summed pairwise level by level (x[i] = x[2i] + x[2i + 1], an
    odd last element plus 0): an order that every device and the C kernel follow alike."""
    n, total = x.numel(), x
    while total.numel() > 1:
        if total.numel() % 2:
            total = torch.cat([total, total.new_zeros(1)])
        total = total[0::2] + total[1::2]
    return total.sum() / divisor(total, n)


@register("adacomp")
class AdaComp(Compressor):
    """AdaComp with bin size ``conv_bin_size`` (conv kernels) / ``fc_bin_size`` (matrices)."""

    level_field = "bin_size"
    accordion_levels = (50, 500)  # ours: the paper's conv bin vs its FC bin (no paper tried it)
    paper = "Chen et al., AAAI 2018"
    wire = "all-gather: fp32 scale + 2 bits (sent, sign) per element"

    def __init__(self, conv_bin_size: int = 50, fc_bin_size: int = 500,
                 soft_threshold: bool = True) -> None:
        self.conv_bin_size = self.validate_level(conv_bin_size, "compressor.conv_bin_size")
        self.fc_bin_size = self.validate_level(fc_bin_size, "compressor.fc_bin_size")
        self.soft_threshold = check_bool(soft_threshold, "compressor.soft_threshold")
        self.memory = ErrorFeedback(key="residue")  # Alg. 2's residue: the algorithm itself
        self._scratch = Scratch()

    def default_level(self, shape: torch.Size) -> int:
        return self.conv_bin_size if len(shape) >= 3 else self.fc_bin_size

    def validate_level(self, level: Any, field: str | None = None) -> int:
        # A layer's residue is padded to whole bins: a bin far larger than any layer would
        # allocate its size.
        return check_int(level, field or "level (AdaComp bin size L_T)", 1, MAX_BIN)

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        grads = [g.view(-1) for g in grads]
        sizes = [group_bytes(g.numel(), x.level) for x, g in zip(layers, grads, strict=True)]
        # The message (the same length on every worker): s per layer (fp32), then each
        # layer's sent bytes and sign bytes, padded to whole fp32 words.
        offsets, length = layout([2 * size for size in sizes], header=4 * len(layers), align=4)
        message = outbox(self._scratch, layers[0], length, torch.uint8, grads[0])
        message[offsets[-1] + 2 * sizes[-1]:].zero_()  # the padding
        counts = self._compress(layers, grads, message, offsets, sizes)
        parts = yield from gather(comm, self._scratch, layers[0], message)
        self._decompress(layers, grads, parts, offsets, sizes)
        sent = [Sent(c * (8 if layer.level < 64 else 16) + WORD_BITS, WORD_BITS + 16 * size, c)
                for layer, c, size in zip(layers, counts, sizes, strict=True)]
        padding = 8 * (length - 4 * len(layers) - 2 * sum(sizes))  # counted with the first layer
        sent[0] = sent[0]._replace(wire_bits=sent[0].wire_bits + padding)
        return sent

    def _compress(self, layers: list[Layer], grads: list[torch.Tensor], message: torch.Tensor,
                  offsets: list[int], sizes: list[int]) -> list[int | torch.Tensor]:
        """Update every layer's residue; write its s to the ``message``'s l-th float32 word,
        its sent bytes and sign bytes (``sizes[l]`` each, see
        :func:`~compression._adacomp_kernel.group_bytes`) from ``offsets[l]``; return how many
        each layer sent (on CUDA as 0-d tensors on the device, which the hook sums there).

        On contiguous float32 CPU tensors the C kernel does it in one pass per bin (:mod:`
        compression._adacomp_kernel`), leaving the sent elements' G_q owed until the next step
        (see :meth:`settle`); elsewhere, or without a C compiler, the eager torch ops of
        :meth:`_select_eager` do, with bit-identical results.
        """
        residues = [self._residue(layer, grad) for layer, grad in zip(layers, grads, strict=True)]
        lib = (_kernel.kernel() if usable(torch.float32, *grads, *residues)
               and message.device.type == "cpu" else None)
        if lib is None:
            counts, scales = [], []
            for layer, g, grad, at, size in zip(layers, residues, grads, offsets, sizes,
                                                strict=True):
                self.settle(layer)
                sent, negative, scale = self._select_eager(g, grad, layer.level)
                message[at:at + size] = pack_groups(sent, grad.numel(), layer.level)
                message[at + size:at + 2 * size] = pack_groups(negative, grad.numel(),
                                                               layer.level)
                count = sent.count_nonzero()        # on CUDA kept there: no sync per step
                counts.append(count if count.is_cuda else int(count))
                scales.append(scale)
            message[:4 * len(layers)].view(torch.float32).copy_(torch.stack(scales))
            return counts
        bins = max(math.ceil(grad.numel() / layer.level) for layer, grad in zip(layers, grads,
                                                                                strict=True))
        owed = [self._owed(layer) for layer in layers]
        # Alg. 2: G = residue + dW, g_max(i), s, the sent elements' bits; G_q owed
        return _kernel.compress(lib, residues, grads, [x.level for x in layers],
                                self.soft_threshold, owed, [x.memory["scale"] for x in layers],
                                self._scratch.take("g_max", bins, grads[0]), message, offsets,
                                sizes)

    @staticmethod
    def _decompress(layers: list[Layer], outs: list[torch.Tensor], parts: torch.Tensor,
                    offsets: list[int], sizes: list[int]) -> None:
        """Every layer's ``outs[l]`` (flat) = (1/W) sum_w G_q,w, from the workers' messages
        (rows of ``parts``)."""
        world, n_layers = parts.shape[0], len(layers)
        lib = (_kernel.kernel() if usable(torch.float32, *outs) and parts.device.type == "cpu"
               and parts.is_contiguous() else None)
        if lib is not None:                         # out = sum_w sign s_w / W, in one pass
            _kernel.decompress(lib, outs, [x.level for x in layers], parts, offsets, sizes)
            return
        scales = parts[:, :4 * n_layers].contiguous().view(torch.float32)
        values = (scales / divisor(scales, world)).T  # s_w / W
        for layer, out, at, size, value in zip(layers, outs, offsets, sizes, values,
                                               strict=True):
            n = out.numel()
            out.zero_()
            for w in range(world):                  # (1/W) sum_w G_q,w, in worker order
                sent = unpack_groups(parts[w, at:at + size], n, layer.level)
                negative = unpack_groups(parts[w, at + size:at + 2 * size], n, layer.level)
                g_q = torch.where(negative, -value[w], value[w]).to(out.dtype)
                out.add_(torch.where(sent, g_q, 0.0))

    def layer_stats(self, layer: Layer) -> dict[str, torch.Tensor]:
        """The residue's range (the paper's Figs. 4-6: bounded under the soft threshold, growing
        under hard LS), as 0-d tensors: the hook reads every layer's at once."""
        residue = self.error(layer)
        if residue is None:
            return {}
        return {"residue_min": residue.min(), "residue_max": residue.max()}

    def settle(self, layer: Layer) -> None:
        """Take the owed G_q off the residue (residue = G - sign(G) s where last sent): the
        kernel defers that to the next step, which reads the element anyway."""
        owed = layer.memory.pop("owed", None)
        bin_size = layer.memory.pop("owed_bin_size", None)
        scale = layer.memory.pop("scale", None)
        if owed is None:
            return
        residue, n = layer.memory["residue"], math.prod(layer.shape)
        lib = (_kernel.kernel() if usable(torch.float32, residue) and usable(torch.uint8, owed)
               else None)
        if lib is not None:
            _kernel.settle(lib, residue, n, int(bin_size), owed, scale.item())
            return
        # Where the kernel cannot take them (a CPU-written state loaded on CUDA, or no C
        # compiler here): the kernel's own float operation, residue - (sign(G) s or +0), in
        # torch ops; never a CUDA pointer handed to C.
        mask = unpack_groups(owed, n, int(bin_size)).to(residue.device)
        g = residue[:n]
        g.sub_(torch.where(mask, torch.copysign(scale.to(g), g), 0.0))

    def _owed(self, layer: Layer) -> torch.Tensor:
        """The layer's owed bits for its bin size (zeros, and s = 0, at first)."""
        if "owed" in layer.memory and int(layer.memory["owed_bin_size"]) != layer.level:
            self.settle(layer)                      # owed bits are laid out by bin
        if "owed" not in layer.memory:
            size = group_bytes(math.prod(layer.shape), layer.level)
            layer.memory["owed"] = torch.zeros(size, dtype=torch.uint8)
            layer.memory["owed_bin_size"] = torch.tensor(layer.level)
            layer.memory["scale"] = torch.zeros((), dtype=torch.float32)  # the kernel's s
        return layer.memory["owed"]

    def _select_eager(self, g: torch.Tensor, grad: torch.Tensor, bin_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Alg. 2 for one layer in torch ops (any device): ``g`` is its residue, padded to
        whole bins; returns the sent elements and those with G < 0 (bool, as ``g``), and s."""
        n, bins = grad.numel(), g.numel() // bin_size
        g[:n] += grad                               # G = residue + dW
        abs_g = torch.abs(g, out=self._scratch.take("h", g.numel(), g)).view(bins, bin_size)
        g_max = abs_g.amax(dim=1)                   # g_max(i) = max_{j in bin i} |G(j)|
        scale = pairwise_mean(g_max)                # s = mean_i g_max(i)
        if self.soft_threshold:
            h = abs_g.view(-1)                      # |G| no longer needed: reuse it for |H|
            torch.add(g[:n], grad, out=h[:n])       # H = G + dW (padding: H = G = 0)
            threshold = g_max.masked_fill(g_max == 0, math.inf)  # a bin of zeros sends none
            sent = torch.ge(h.abs_().view(bins, bin_size), threshold[:, None]).view(-1)
        else:                                       # hard Local Selection: each bin's first
            sent = torch.zeros_like(g, dtype=torch.bool)  # argmax |G|, where g_max > 0
            sent.view(bins, bin_size).scatter_(1, abs_g.argmax(dim=1, keepdim=True),
                                               (g_max > 0)[:, None])
        sent &= g != 0                              # G = 0 quantizes to 0: nothing to send
        negative = sent & (g < 0)
        g_q = torch.where(negative, -scale, scale)  # G_q = sign(G) s
        g.sub_(torch.where(sent, g_q, 0.0))         # residue = G - G_q where sent
        return sent, negative, scale

    def _residue(self, layer: Layer, grad: torch.Tensor) -> torch.Tensor:
        """The layer's residue (zeros at first), flat and zero-padded to whole bins (stored
        with ``_kernel.SLACK`` more elements, for the kernel); a bin size change keeps it."""
        padded = math.ceil(grad.numel() / layer.level) * layer.level
        if self.memory.key in layer.memory and \
                layer.memory[self.memory.key].numel() != padded + _kernel.SLACK:
            self.settle(layer)                      # owed bits are laid out by bin
        return self.memory.buffer(layer, padded + _kernel.SLACK, grad)[:padded]
