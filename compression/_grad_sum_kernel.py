"""The hook's epoch sum Delta_e with a finiteness check fused into its one pass, in C
(kernels/grad_sum.c).

``acc.add_(g)`` followed by a check of ``acc`` would read the layer twice (``torch.isfinite(acc)
.all()`` costs several times the add on CPU); the kernel adds and tests the exponent bits of each
sum as it stores it, eight lanes at a time on x86-64 CPUs with AVX2. ``acc`` gets the bits
``add_`` would give (one float add per element; tested).
"""

from __future__ import annotations

import ctypes

import torch

from core.native import Library, usable

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("grad_sum", {"grad_sum_add": ([_p, _p, _i64], ctypes.c_int)})


def add_finite(acc: torch.Tensor, grad: torch.Tensor) -> bool | None:
    """``acc += grad`` and whether every element of ``acc`` is then finite; None (nothing done)
    where the kernel cannot take the tensors (not contiguous float32 on the CPU, no compiler)."""
    if not usable(torch.float32, acc, grad):
        return None
    lib = LIBRARY.get()
    if lib is None:
        return None
    return bool(lib.grad_sum_add(acc.data_ptr(), grad.data_ptr(), acc.numel()))
