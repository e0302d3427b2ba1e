"""signSGD's and Signum's message and majority vote in C (kernels/sign.c), each in one pass.

The torch ops pack a worker's signs through a bool mask and a byte sum, and count the vote with
about five int32 passes per worker (unpack, widen, 1 - 2 x bit, add), then ``sign`` and a copy:
tens of times the work of a plain ``torch.sign``. Here::

    sign_pack   the signs of v, eight elements to a byte, in one read of v
    sign_vote   per element: world - 2 x (the workers whose bit is set), its sign as a float,
                eight elements (a byte of every worker's message) at a time

Bits and small integers only: the same results as the torch ops (tested).
"""

from __future__ import annotations

import ctypes

import torch

from core.native import Library, usable

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("sign", {
    "sign_pack": ([_p, _i64, _p], None),
    "sign_vote": ([_p, _i64, _i64, _p, _i64], None),
})


def kernel(floats: torch.Tensor, *messages: torch.Tensor) -> ctypes.CDLL | None:
    """The compiled library where it can take the float32 tensor and the messages (contiguous,
    on the CPU), else None (another device, or no C compiler: the torch ops)."""
    if not (usable(torch.float32, floats) and usable(torch.uint8, *messages)):
        return None
    return LIBRARY.get()


def pack(lib: ctypes.CDLL, v: torch.Tensor, message: torch.Tensor) -> None:
    """``message`` (ceil(n / 8) bytes) = the signs of ``v``: bit set where v < 0."""
    lib.sign_pack(v.data_ptr(), v.numel(), message.data_ptr())


def vote(lib: ctypes.CDLL, out: torch.Tensor, parts: torch.Tensor) -> None:
    """``out`` = the sign of the workers' vote, each worker's message a row of ``parts``."""
    lib.sign_vote(out.data_ptr(), out.numel(), parts.shape[0], parts.data_ptr(), parts.stride(0))
