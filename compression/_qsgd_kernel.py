"""QSGD's bit count and bit planes in C (kernels/qsgd.c), each in one pass.

The torch ops count Code_s (:func:`compression.qsgd.code_bits`) with about a dozen int64 passes
over the layer (a running maximum of the non-zeros' positions for the gaps, two Elias lengths
through ``frexp`` and a table, a sum), and pack and unpack the message a bit plane at a time (a
shift, a mask and a pack per level bit: nine passes at s = 256); in the zoo's QSGD runs that
cost several times the quantization itself. Here::

    qsgd_code_bits   each bucket once, keeping the last non-zero's position: per non-zero the
                     Elias omega lengths of gap and level and a sign bit (integers: exact)
    qsgd_pack        the sign plane and every level plane, eight elements (a byte) at a time
    qsgd_add         one worker's Q_s(v) read from its planes and added to out, with the float
                     operations of the torch ops in their order (bit-identical; tested)

The stochastic rounding stays in torch (the same random stream on every path).
"""

from __future__ import annotations

import ctypes

import torch

from core.native import Library, usable

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("qsgd", {
    "qsgd_code_bits": ([_p, _i64, _i64], _i64),
    "qsgd_pack": ([_p, _p, _i64, _i64, _p, _i64], None),
    "qsgd_add": ([_p, _i64, _i64, _p, ctypes.c_float, _p, _i64, _i64, ctypes.c_int], None),
})


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    return LIBRARY.get()


def code_bits(codes: torch.Tensor, bucket: int) -> int | None:
    """Code_s's bits of the levels ``codes`` (contiguous int32 on the CPU) in buckets of
    ``bucket``, norms left out; None where the kernel cannot take them (another device or
    dtype, or no C compiler)."""
    if not usable(torch.int32, codes):
        return None
    lib = kernel()
    if lib is None:
        return None
    return int(lib.qsgd_code_bits(codes.data_ptr(), codes.numel(), bucket))


def pack(lib: ctypes.CDLL, codes: torch.Tensor, grad: torch.Tensor, planes: torch.Tensor,
         bits: int) -> None:
    """``planes`` (uint8, (1 + ``bits``) planes of ceil(n / 8) bytes) = the signs of ``grad``
    (set where < 0), then bit b of the levels ``codes`` (int32) for b < ``bits``."""
    width = -(-codes.numel() // 8)
    lib.qsgd_pack(codes.data_ptr(), grad.data_ptr(), codes.numel(), bits, planes.data_ptr(),
                  width)


def add(lib: ctypes.CDLL, out: torch.Tensor, bucket: int, norms: torch.Tensor, s: int,
        planes: torch.Tensor, bits: int, first: bool) -> None:
    """``out`` (float32; ``first``: its contents ignored) += one worker's Q_s(v): its ``norms``
    (float32, one per bucket of ``bucket``) and its ``planes`` as :func:`pack` wrote them."""
    lib.qsgd_add(out.data_ptr(), out.numel(), bucket, norms.data_ptr(), float(s),
                 planes.data_ptr(), -(-out.numel() // 8), bits, int(first))
