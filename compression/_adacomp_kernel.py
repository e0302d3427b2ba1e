"""AdaComp's CPU kernel: Algorithm 2 in one streaming pass per layer, in C (kernels/adacomp.c).

The eager torch path (``AdaComp._select_eager``) makes about a dozen passes over a layer (add,
abs, amax, add, abs, ge, nonzero, index_select, index_add_, ...). Here::

    adacomp_compress    bin by bin (each bin is read from memory once, then again from cache;
                        with the soft threshold, while the next bin is read):
                        G = residue + dW, g_max(i) = max |G| over the bin; H = G + dW, sent
                        where |H| >= g_max(i) > 0 and G != 0 (hard LS: the bin's first
                        argmax |G|); the message's sent and sign bits written straight out
                        s = the mean of g_max, summed pairwise (as the eager path)
    adacomp_decompress  out = sum_w sign s_w / W where worker w sent, a group of 8 at a time

Bits are laid out by group: a byte per group of 8 elements of a bin (bit l: the group's element
l; a bin of L_T elements has ceil(L_T / 8) groups, the last one maybe short), bin after bin
(:func:`group_bytes` of them per layer). The message of a layer is its sent bytes, then its sign
bytes (bit set: G < 0); see :mod:`compression.adacomp`.

The one thing a single pass cannot do is Alg. 2's residue = G - sign(G) s for the sent
elements: s is the mean over all of the layer's bins, known only at the end. So it is owed: the
pass stores G and keeps the sent bits (``owed``, laid out as above), and the next step's pass
takes sign(G) s off as it reads the element, with the same float operation the eager path does
at once, so every later value has the same bits. :func:`settle` pays what is owed (before a
checkpoint, a bin size change, or the eager path).

On x86-64 CPUs with AVX2 both run eight lanes at a time, without branches, the decompress with
AVX-512 (F and BW) sixteen, a pair of groups' bytes one mask register (where AVX2 spreads a
byte's bits over eight lanes through a table); elsewhere portable loops do the same. The
decompress builds the output in an L1 block and streams it out (AVX2).
The results are bit-identical to the eager path (tested): the same float operations, rounded
alike and summed in the same order; the max is exact (taken on the bit patterns of |G|, which
order as the floats do).
"""

from __future__ import annotations

import ctypes
import math

import torch

from core.native import Library, int64s, pointers

# Elements per group: the group's sent (and sign) bits are one byte of the message.
GROUP = 8
# The residue needs this many floats past its last bin: the AVX2 path reads a bin's last group
# as a whole vector of 8.
SLACK = 8


def group_bytes(n: int, bin_size: int) -> int:
    """Bytes of bits (one per :data:`GROUP` elements of each bin) of a layer of ``n`` elements."""
    bins = math.ceil(n / bin_size)
    last = n - (bins - 1) * bin_size
    return (bins - 1) * math.ceil(bin_size / GROUP) + math.ceil(last / GROUP) if n else 0


_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("adacomp", {
    "adacomp_compress": ([_i64, _p, _p, _p, _p, ctypes.c_int, _p, _p, _p, _p, _p, _p, _p], None),
    "adacomp_settle": ([_p, _i64, _i64, _p, ctypes.c_float], None),
    "adacomp_decompress": ([_i64, _p, _p, _p, _i64, _p, _i64, _p, _p, _p, _p], None),
}, defines={"GROUP": GROUP, "SLACK": SLACK})


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    return LIBRARY.get()


def compress(lib: ctypes.CDLL, residues: list[torch.Tensor], grads: list[torch.Tensor],
             bin_sizes: list[int], soft: bool, owed: list[torch.Tensor],
             scales: list[torch.Tensor], g_max: torch.Tensor, message: torch.Tensor,
             offsets: list[int], sizes: list[int]) -> list[int]:
    """One pass per bin over each layer (see the module docstring): layer l's s (float32) goes
    to the message's l-th word and to ``scales[l]`` (a float32 scalar: last step's s before),
    its sent bytes (``sizes[l]``, its :func:`group_bytes`) to ``message[offsets[l]:]`` and its
    sign bytes right after. ``g_max``: float32 room for the largest layer's bins. Returns how
    many each layer sent."""
    numels = [g.numel() for g in grads]
    counts = int64s([0] * len(grads))
    lib.adacomp_compress(len(grads), pointers(residues), pointers(grads), int64s(numels),
                         int64s(bin_sizes), int(soft), pointers(owed), pointers(scales),
                         g_max.data_ptr(), message.data_ptr(), int64s(offsets), int64s(sizes),
                         counts)
    return list(counts)


def settle(lib: ctypes.CDLL, residue: torch.Tensor, n: int, bin_size: int, owed: torch.Tensor,
           scale: float) -> None:
    """Pay what :func:`compress` left owed on a layer of ``n`` elements in bins of ``bin_size``:
    ``residue`` = G - sign(G) ``scale`` where ``owed`` (its bits, laid out as the message's sent
    bits) is set, and ``owed`` cleared."""
    lib.adacomp_settle(residue.data_ptr(), n, bin_size, owed.data_ptr(), scale)


def decompress(lib: ctypes.CDLL, outs: list[torch.Tensor], bin_sizes: list[int],
               messages: torch.Tensor, offsets: list[int], sizes: list[int]) -> None:
    """Each ``outs[l]`` = the sum over workers w of sign s_w / W where w sent: row w of
    ``messages`` (uint8, rows contiguous) holds layer l's s_w (float32) at ``4 l``, its sent
    bytes (``sizes[l]``) from ``offsets[l]`` and its sign bytes right after."""
    world = messages.shape[0]
    numels = [o.numel() for o in outs]
    lib.adacomp_decompress(len(outs), pointers(outs), int64s(numels), int64s(bin_sizes), world,
                           messages.data_ptr(), messages.stride(0), int64s(offsets),
                           int64s(sizes), (ctypes.c_void_p * world)(), (ctypes.c_float * world)())
