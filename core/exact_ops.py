"""Faster CPU kernels with the same bits, for the ATen ops that portable numerics leave slow.

Portable numerics (:mod:`core.numerics`) pin ATen's DEFAULT kernels, built for the x86-64
baseline. Most cost about what the AVX2 ones do; two cost a tiny CNN a large share of its step
(``make bench-portable-step``, and its GoogLeNet row):

- ``threshold_backward``, ReLU's derivative (``derivatives.yaml``: ``threshold_backward(grad,
  result, 0)``), ten times slower than ATen's AVX2 build: about a tenth of a step;
- ``max_pool2d_with_indices``, a scalar loop with a branch per element in every build: about a
  fifth of a GoogLeNet step (its inception branches pool 3x3 at stride 1).

Neither computes anything: each output element is a copy of an input element (or +0), chosen
by comparisons. So C loops (``kernels/exact_ops.c``) give the same bits on any machine,
indices and ties included, and replace ATen's kernels for the CPU dispatch key
(``torch.library.Library("aten", "IMPL")``: a library of kind "IMPL" overrides operators of an
existing one, https://pytorch.org/docs/stable/library.html) in every process that
:func:`install` runs in: :func:`core.numerics.apply` calls it for portable runs. Nothing in a
run record changes (its fingerprint names the machine and software that can change a number;
these loops cannot).

Inputs a loop does not take (other dtypes, layouts, shapes that broadcast, settings ATen
refuses) go to ATen's own kernel through the op's ``out=`` overload, which the override leaves
in place (and which raises ATen's errors). Without a C compiler nothing is replaced (one
warning, from :class:`core.native.Library`). The tests compare both ways bit for bit,
edge cases included (NaN, +-0, +-inf, ties, padding, dilation, ceil mode).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch

from core.native import Library, usable

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("exact_ops", {
    "threshold_backward": ([_p, _p, _p, ctypes.c_float, _i64], None),
    "max_pool2d": ([_p, _p, _p, *[_i64] * 13], None),
}, directory=Path(__file__).with_name("kernels"))
MAX_ROW = 1 << 16  # outputs per row the C loop takes (its row of int32 indices is on the stack)
_REGISTRATION: list[torch.library.Library] = []  # kept alive: the override lasts as long


def threshold_backward(grad: torch.Tensor, self: torch.Tensor, threshold: Any) -> torch.Tensor:
    """ATen's ``threshold_backward`` (``self <= threshold ? 0 : grad``), by the C loop for
    float32 tensors of one shape with ``self`` contiguous, else by ATen's own kernel. ATen's
    output takes the layout of ``self`` whatever that of ``grad`` (a slice, say, of the gradient
    torch.cat's backward hands each input): here ``grad`` is copied to that layout first."""
    lib = LIBRARY.get()
    if lib is None or not (usable(torch.float32, self) and grad.dtype == torch.float32
                           and grad.shape == self.shape):
        out = grad.new_empty(0, dtype=torch.result_type(grad, self))
        return torch.ops.aten.threshold_backward.grad_input(grad, self, threshold,
                                                            grad_input=out)
    grad = grad.contiguous()
    out = torch.empty_like(self)
    lib.threshold_backward(out.data_ptr(), grad.data_ptr(), self.data_ptr(), float(threshold),
                           grad.numel())
    return out


def _pair(values: list[int], default: list[int]) -> tuple[int, int]:
    """An int[2] argument as ATen reads it: one value for both, none for the default."""
    values = list(values) or list(default)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _pooled(size: int, k: int, d: int, pad: int, dil: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: the output size along one dimension."""
    out = (size + 2 * pad - dil * (k - 1) - 1 + (d - 1 if ceil_mode else 0)) // d + 1
    return out - 1 if ceil_mode and (out - 1) * d >= size + pad else out


def max_pool2d_with_indices(self: torch.Tensor, kernel_size: list[int], stride: list[int] = (),
                            padding: list[int] = (0,), dilation: list[int] = (1,),
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's ``max_pool2d_with_indices``, by the C loop for contiguous 4-d float32 input with
    settings ATen accepts, else by ATen's own kernel (which also raises its errors)."""
    (kh, kw), (ph, pw), (lh, lw) = (_pair(kernel_size, []), _pair(padding, [0]),
                                    _pair(dilation, [1]))
    dh, dw = _pair(stride, [kh, kw])
    lib = LIBRARY.get()
    if lib is not None and usable(torch.float32, self) and self.dim() == 4 and self.numel() > 0 \
            and min(kh, kw, dh, dw, lh, lw) > 0 and 0 <= ph <= kh // 2 and 0 <= pw <= kw // 2:
        n, c, h, w = self.shape
        oh, ow = _pooled(h, kh, dh, ph, lh, ceil_mode), _pooled(w, kw, dw, pw, lw, ceil_mode)
        if oh > 0 and 0 < ow <= MAX_ROW and h * w < 2**31:
            out = self.new_empty((n, c, oh, ow))
            index = torch.empty((n, c, oh, ow), dtype=torch.int64)
            lib.max_pool2d(self.data_ptr(), out.data_ptr(), index.data_ptr(), n * c, h, w, oh,
                           ow, kh, kw, dh, dw, ph, pw, lh, lw)
            return out, index
    out, index = self.new_empty(0), torch.empty(0, dtype=torch.int64)
    return torch.ops.aten.max_pool2d_with_indices.out(self, kernel_size, stride, padding,
                                                      dilation, ceil_mode, out=out,
                                                      indices=index)


def install() -> bool:
    """Replace the ops' CPU kernels in this process (once); whether they are replaced (False
    where the C loop cannot be built)."""
    if not _REGISTRATION and LIBRARY.get() is not None:
        registration = torch.library.Library("aten", "IMPL")
        registration.impl("threshold_backward", threshold_backward, "CPU")
        registration.impl("max_pool2d_with_indices", max_pool2d_with_indices, "CPU")
        _REGISTRATION.append(registration)
    return bool(_REGISTRATION)


def installed() -> bool:
    """Whether :func:`install` replaced the kernels in this process."""
    return bool(_REGISTRATION)
