"""Top-K's CPU kernel: error feedback, exact selection and the message in three passes, in C
(kernels/topk.c).

The eager torch path (in ``TopK._compress``) adds, takes |acc|, selects (a sample, masks,
``nonzero``, a partial ``topk``), gathers and scatters: about a dozen passes per layer. Here the
selection is a radix select on the bit patterns of |acc| (which order as the floats do; a NaN's
are largest)::

    pass 1   acc = g + e (into e); histogram of the top 16 bits of |acc|
    (scan)   the bucket of the k-th largest |acc|
    pass 2   histogram of the low 15 bits of the entries in that bucket (skipped when the whole
             bucket is kept): T = the k-th largest, exactly
    pass 3   S = every entry above T and the first ones equal to T (k in all), in index order:
             their values and indices go to the message, and e = 0 there

    topk_decompress   out = (1/W) sum_w sparse_w, block by block: each block summed in an L1
                      buffer, then streamed out (out is only written: no read for ownership);
                      a list that keeps 9 entries in 10 or more is added a vector at a time
                      where 8 indices in a row are consecutive (AVX2), else entry by entry

A layer of SAMPLED_MIN elements or more skips the histogram of every element (about as costly
as the add itself) and pass 2: a sample of SAMPLE entries of acc (read at fixed pseudo-random
places before pass 1, each prefetched a few reads ahead: every read misses the cache) brackets
the k-th largest |acc| between two buckets, give or take 4
binomial standard deviations; pass 1 then stores acc, counts the entries above the bracket and
keeps the keys inside it (a few percent of the layer), and both histograms run over those
candidates only. Where the sample was off (T outside the bracket, or more candidates than the
workspace holds) a histogram of acc follows, as above. Either way T is exact: the same bits.
Each histogram is scanned from the highest bucket it counted, not from its last one (gradients'
keys sit far below it, and on a small layer that scan cost more than the pass).

Pass 2 and 3 re-read the layer right after pass 1, mostly from the last-level cache. On x86-64
CPUs with AVX2 they run eight lanes at a time (pass 3 packs the kept lanes with a permutation
table); elsewhere portable loops do the same. The results are
bit-identical to the eager path (tested): the same selected set and order, the same float
operations, summed in the same order.
"""

from __future__ import annotations

import ctypes

import torch

from core.native import Library

# The radix select's two histograms: of the top HIGH_BITS bits of |acc| (bits 30..15), and of
# the low LOW_BITS bits of the entries in one high bucket.
HIGH_BITS, LOW_BITS = 16, 15
HISTOGRAM = (1 << HIGH_BITS) + (1 << LOW_BITS)  # int32 words of workspace: both histograms
SAMPLE = 4096             # entries of acc sampled to bracket T
SAMPLED_MIN = 1 << 16     # layers of this many elements or more take the sampled pass

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("topk", {
    "topk_compress": ([_p, _p, _i64, _i64, _p, _p, _p, _i64], None),
    "topk_decompress": ([_p, _i64, _i64, _p, _i64, _i64, ctypes.c_float, _p], ctypes.c_int),
}, defines={"HIGH_BITS": HIGH_BITS, "LOW_BITS": LOW_BITS, "SAMPLE": SAMPLE,
            "SAMPLED_MIN": SAMPLED_MIN})


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    return LIBRARY.get()


def workspace_size(n: int) -> int:
    """int32 words of workspace for a layer of ``n`` elements: both histograms, and room for
    the sampled pass's candidates (an eighth of the layer; more fall back to a histogram)."""
    return HISTOGRAM + n // 8 + 64


def compress(lib: ctypes.CDLL, error: torch.Tensor, grad: torch.Tensor, k: int,
             message: torch.Tensor, workspace: torch.Tensor) -> None:
    """acc = ``grad`` + ``error``; the k largest |acc| (ties: the first) as fp32 values then
    int32 indices, in index order, into ``message`` (2k int32); ``error`` = acc, 0 at them.
    ``workspace``: at least :func:`workspace_size` int32."""
    lib.topk_compress(error.data_ptr(), grad.data_ptr(), error.numel(), k, message.data_ptr(),
                      message[k:].data_ptr(), workspace.data_ptr(),
                      workspace.numel() - HISTOGRAM)


def decompress(lib: ctypes.CDLL, out: torch.Tensor, parts: torch.Tensor, k: int,
               alpha: float) -> None:
    """``out`` = ``alpha`` times the sum over workers of their sparse tensors (alpha = 1/W: the
    mean): ``parts`` (world, >= 2k int32, rows contiguous) holds each worker's k values then k
    ascending indices."""
    world = parts.shape[0]
    cursors = torch.empty(world, dtype=torch.int64)
    if lib.topk_decompress(out.data_ptr(), out.numel(), world, parts.data_ptr(), parts.stride(0),
                           k, alpha, cursors.data_ptr()):
        raise ValueError("Top-K: a received index is out of range, or a worker's indices are "
                         "not ascending")
