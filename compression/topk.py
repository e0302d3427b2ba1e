"""``compressor=topk``: layer-wise Top-K sparsification with error feedback.

Aji & Heafield, "Sparse Communication for Distributed Gradient Descent" (EMNLP 2017), layer-wise
as Accordion uses it, with the error feedback of Stich et al. 2018 / Karimireddy et al. 2019.
For every matrix-shaped layer with N elements and k = max(1, floor(ratio N))::

    acc = g + e                    error feedback: add this worker's error memory
    S = the k largest |acc|        this worker's message: fp32 values acc[S] + int32 indices S
    out = (1/W) sum_w sparse_w     what every worker applies: the MEAN of all workers' messages
    e = acc - sparse_own           what this worker's message left out

All layers of a bucket travel in one all-gather; each worker sends 64 k bits per layer per step.
Of the entries tied with the k-th largest |acc|, S keeps the first, and the message lists S in
index order: the C kernel (float32 on CPU, :mod:`compression._topk_kernel`) and the torch ops
(elsewhere) send the same bits.

Levels: the fraction ``ratio`` in (0, 1] of each layer's elements kept. The Accordion authors'
code SUMMED the workers' sparse tensors and had no error feedback (``error_feedback=false``,
``reduce=sum``: ``compressor=topk_authors``, to reproduce their tables); ours averages and keeps
an error memory by default. (Their 99% level costs about twice a dense send under this
accounting, as it did in theirs; we keep it sparse to match it.)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compression import _topk_kernel as _kernel
from compression import register
from compression.base import Layer, Scratch
from compression.exchange import GatherCompressor
from compression.memory import ErrorFeedback
from core.errors import check_bool, check_choice, check_ratio
from core.native import usable

VALUE_AND_INDEX_BITS = 64  # fp32 value + int32 index
REDUCTIONS = ("mean", "sum")
SAMPLE = 1 << 14  # sample size for the selection threshold in top_k_indices


def top_k_indices(a: torch.Tensor, k: int, scratch: Scratch | None = None) -> torch.Tensor:
    """Indices (in no particular order) of the ``k`` largest entries of the 1-D tensor ``a``.

    The same set as ``torch.topk(a, k).indices`` (up to ties), in a few linear passes for large
    tensors: quantiles of a random sample give a value ``lo`` just below the k-th largest and
    ``hi`` just above it; the entries >= ``lo`` are the candidates, those above ``hi`` are
    kept, and ``torch.topk`` only ranks the few in between (for k > n/2, the same finds the
    n - k smallest, which are left out). Exact whatever the sample: if fewer than k entries
    reach ``lo`` it falls back to a full ``topk``. ``scratch`` lends the large temporaries.
    """
    n = a.numel()
    if n <= 4 * SAMPLE or k == n:
        return torch.topk(a, k, sorted=False).indices
    if 2 * k > n:  # keeping most: find the n - k smallest, keep the rest
        negated = torch.neg(a, out=scratch.take("neg", n, a)) if scratch else -a
        keep = scratch.take("keep", n, a, torch.bool) if scratch else a.new_empty(n, dtype=bool)
        keep.fill_(True)[top_k_indices(negated, n - k, scratch)] = False
        return keep.nonzero().squeeze(1)
    generator = torch.Generator(device=a.device).manual_seed(n)
    picks = torch.randint(n, (SAMPLE,), generator=generator, device=a.device)
    sample = a[picks].sort().values
    q = k / n
    slack = 4 * math.sqrt(q * (1 - q) / SAMPLE) + 2 / SAMPLE  # > 4 binomial standard deviations
    lo = sample[max(math.floor((1 - q - slack) * SAMPLE), 0)]
    hi = sample[min(math.ceil((1 - q + slack) * SAMPLE), SAMPLE - 1)]
    mask = torch.ge(a, lo, out=scratch.take("mask", n, a, torch.bool)) if scratch else a >= lo
    candidates = mask.nonzero().squeeze(1)
    if candidates.numel() < k:
        return torch.topk(a, k, sorted=False).indices
    values = a[candidates]
    above = values > hi
    n_above = int(above.count_nonzero())
    if n_above > k:
        return candidates[torch.topk(values, k, sorted=False).indices]
    band = (~above).nonzero().squeeze(1)
    rest = band[torch.topk(values[band], k - n_above, sorted=False).indices]
    return torch.cat([candidates[above], candidates[rest]])


def kept_indices(key: torch.Tensor, k: int, scratch: Scratch | None = None) -> torch.Tensor:
    """S in ascending order: the indices of the ``k`` largest entries of the 1-D tensor
    ``key``; of the entries equal to the k-th largest, the first ones (the C kernel's rule)."""
    threshold = key[top_k_indices(key, k, scratch)].min()  # T = the k-th largest
    n = key.numel()
    keep = torch.gt(key, threshold, out=scratch.take("kept", n, key, torch.bool)) if scratch \
        else key > threshold
    tied = (key == threshold).nonzero().squeeze(1)
    keep[tied[:k - int(keep.count_nonzero())]] = True   # the first entries equal to T
    return keep.nonzero().squeeze(1)


def kept_indices_on_device(key: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`kept_indices` without reading anything back to the host (for CUDA, where
    ``nonzero`` waits for the device: its output's size depends on the data; torch.nonzero's
    docs). Every size here is known beforehand: S has k entries.

    T = the k-th largest key (the (n - k + 1)-th smallest when that is the shorter ``topk``);
    S = the keys above T and the first ``k - #(above T)`` keys equal to T (a running count of
    the ties, compared on the device); S's entries are then written to their ranks in S (a
    running count of S), ascending. Positions not in S go to one spare slot past the end,
    written by many and dropped (the only collisions of the ``scatter_``).
    """
    n = key.numel()
    if 2 * k <= n:
        threshold = torch.topk(key, k, sorted=False).values.min()
    else:
        threshold = torch.topk(key, n - k + 1, largest=False, sorted=False).values.max()
    above = key > threshold
    tied = key == threshold
    keep = above | (tied & (tied.cumsum(0) <= k - above.sum()))  # the first ties that fit
    rank = torch.where(keep, keep.cumsum(0) - 1, k)               # position in S, or spare
    index = torch.empty(k + 1, dtype=torch.int64, device=key.device)
    return index.scatter_(0, rank, torch.arange(n, device=key.device))[:k]


@register("topk")
class TopK(GatherCompressor):
    """Keep the ``ratio`` largest-magnitude entries of each layer's error-corrected gradient.

    ``error_feedback=false`` keeps no memory (what a message leaves out is lost) and
    ``reduce=sum`` applies the workers' sum instead of their mean: both as the Accordion
    authors' Top-K ran (``compressor=topk_authors``).
    """

    level_field = "ratio"
    accordion_levels = (0.99, 0.10)  # Accordion's CIFAR-10 pair (CIFAR-100: 0.25, LSTM: 0.02)
    message_dtype = torch.int32      # fp32 values (as their bits) and int32 indices
    paper = "Aji & Heafield, EMNLP 2017"
    wire = "all-gather: k fp32 values + k int32 indices"

    def __init__(self, ratio: float = 0.1, error_feedback: bool = True,
                 reduce: str = "mean") -> None:
        super().__init__()
        self.ratio = check_ratio(ratio, "compressor.ratio")
        self.memory = ErrorFeedback(check_bool(error_feedback, "compressor.error_feedback"))
        self.reduce = check_choice(reduce, "compressor.reduce", REDUCTIONS)

    def default_level(self, shape: torch.Size) -> float:
        return self.ratio

    def validate_level(self, level: Any, field: str | None = None) -> float:
        return check_ratio(level, field or "compressor.ratio")

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        return VALUE_AND_INDEX_BITS * kept(math.prod(shape), level)

    def message_size(self, layer: Layer, numel: int) -> int:
        return 2 * kept(numel, layer.level)

    def compress(self, layer: Layer, grad: torch.Tensor, message: torch.Tensor) -> int:
        """acc = g + e; S = the k largest |acc|; ``message`` (2k int32) = fp32 acc[S], then S
        (ascending); e = acc - sparse_own.

        On contiguous float32 CPU tensors the C kernel does it (:mod:`compression.
        _topk_kernel`); elsewhere, or without a C compiler, the eager torch ops below do, with
        bit-identical results.
        """
        k = message.numel() // 2
        if self.memory.enabled:
            error = self.memory.buffer(layer, grad.numel(), grad)
        else:                                           # no memory: acc = g + 0, e dropped
            error = self._scratch.take("acc", grad.numel(), grad).zero_()
        lib = (_kernel.kernel() if usable(torch.float32, error, grad)
               and usable(torch.int32, message) else None)
        if lib is not None:                             # the same, fused in one pass
            workspace = self._scratch.take("histogram", _kernel.workspace_size(grad.numel()),
                                           grad, torch.int32)
            _kernel.compress(lib, error, grad, k, message, workspace)
            return VALUE_AND_INDEX_BITS * k
        acc = error.add_(grad)                          # acc = g + e
        key = torch.bitwise_and(acc.view(torch.int32), 0x7FFFFFFF,  # |acc| as ordered bits
                                out=self._scratch.take("key", acc.numel(), acc, torch.int32))
        index = (kept_indices_on_device(key, k) if key.is_cuda  # S = the k largest |acc|
                 else kept_indices(key, k, self._scratch))
        torch.index_select(acc, 0, index, out=message[:k].view(acc.dtype))
        message[k:].copy_(index)                        # message: values, then indices
        acc.index_fill_(0, index, 0)                    # e = acc - sparse_own
        return VALUE_AND_INDEX_BITS * k

    def decompress(self, layer: Layer, parts: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` = (1/W) sum_w sparse_w (``reduce=sum``: sum_w sparse_w) from every worker's
        message (rows of ``parts``).

        A worker's indices are distinct, so each ``index_add_`` adds at most one value to an
        element and every element sums its workers' values in worker order, on any device: on
        CUDA, where ``index_add_`` adds atomically in no fixed order (torch.
        use_deterministic_algorithms' docs), one call over all workers' messages would let
        ranks round the same sum differently. On the CPU the single call added in that same
        order, so this is bit for bit what it gave (tested)."""
        world, k = parts.shape[0], parts.shape[1] // 2
        alpha = 1 / world if self.reduce == "mean" else 1.0
        lib = _kernel.kernel() if usable(torch.float32, out) else None
        if lib is not None:
            _kernel.decompress(lib, out, parts, k, alpha)
            return
        out.zero_()
        for part in parts:  # (1/W) sum_w sparse_w: one index_add_ per worker, in worker order
            out.index_add_(0, part[k:], part[:k].view(out.dtype), alpha=alpha)


def kept(numel: int, ratio: float) -> int:
    """k = max(1, floor(ratio N)): the entries a layer of N elements keeps."""
    return max(1, math.floor(ratio * numel))
