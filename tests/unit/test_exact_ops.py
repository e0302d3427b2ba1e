"""core/exact_ops.py: the C loops that replace ATen's ``threshold_backward`` and
``max_pool2d_with_indices`` under portable numerics give ATen's bits (values, indices, shapes,
strides and errors), edge cases included, and portable runs take them."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from core import exact_ops
from tests.conftest import ROOT

# Values a comparison with the threshold can get wrong: NaNs, signed zeros, infinities,
# subnormals, and each threshold itself and its neighbours.
THRESHOLDS = (0.0, 0.5, -1.0)
EDGES = [float("nan"), -float("nan"), 0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45,
         *THRESHOLDS, *(torch.nextafter(torch.tensor(t), torch.tensor(s)).item()
                        for t in THRESHOLDS for s in (-2.0, 2.0))]


def _aten(grad: torch.Tensor, self: torch.Tensor, threshold: float) -> torch.Tensor:
    """ATen's own kernel: the out= overload, which install() leaves in place."""
    out = grad.new_empty(0, dtype=torch.result_type(grad, self))
    return torch.ops.aten.threshold_backward.grad_input(grad, self, threshold, grad_input=out)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The elements as integers of their width (so NaNs and signed zeros compare too)."""
    kinds = {torch.float32: torch.int32, torch.float64: torch.int64}
    return t.view(kinds[t.dtype]) if t.dtype in kinds else t


def _assert_same(ours: tuple[torch.Tensor, ...], aten: tuple[torch.Tensor, ...]) -> None:
    """Each pair of outputs: the same shape, dtype, strides and bits."""
    for a, b in zip(ours, aten, strict=True):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
        assert torch.equal(_bits(a), _bits(b))


def _pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grad and self of n elements: every edge value against every edge gradient, then random."""
    gen = torch.Generator().manual_seed(n)
    edges = torch.tensor(EDGES)
    self = torch.cat([edges.repeat_interleave(len(EDGES)), torch.randn(n, generator=gen)])
    grad = torch.cat([edges.repeat(len(EDGES)), torch.randn(n, generator=gen)])
    return grad, self


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_threshold_backward_gives_atens_bits(threshold, n):
    assert exact_ops.LIBRARY.get() is not None, "the C loop must build here"
    grad, self = _pairs(n)
    assert torch.equal(_bits(exact_ops.threshold_backward(grad, self, threshold)),
                       _bits(_aten(grad, self, threshold)))


@pytest.mark.parametrize("case", ["broadcast", "float64", "mixed dtypes", "strided",
                                  "channels last", "size-1 dimensions", "a slice of torch.cat's",
                                  "expanded", "self a slice", "grad alone permuted"])
def test_threshold_backward_on_other_layouts_gives_atens_result(case):
    grad, self = _pairs(40)
    grad, self = grad[:120].reshape(2, 3, 4, 5), self[:120].reshape(2, 3, 4, 5)
    if case == "broadcast":
        self = self[0]
    elif case == "float64":
        grad, self = grad.double(), self.double()
    elif case == "mixed dtypes":
        grad = grad.double()
    elif case == "strided":
        grad, self = grad.transpose(1, 3), self.transpose(1, 3)
    elif case == "a slice of torch.cat's":  # the gradient cat's backward hands an input
        grad = torch.cat([grad, grad.flip(1)], dim=1)[:, 1:4]
    elif case == "expanded":
        grad = grad[:, :, :, :1].expand(2, 3, 4, 5)
    elif case == "grad alone permuted":  # ATen's output takes grad's order
        grad = grad.transpose(2, 3).contiguous().transpose(2, 3)
    elif case == "self a slice":
        self = torch.cat([self, self], dim=1)[:, 3:]
    elif case == "size-1 dimensions":  # contiguous and channels last at once: still ATen's strides
        grad, self = grad.reshape(24, 5, 1, 1), self.reshape(24, 5, 1, 1)
    else:
        grad = grad.contiguous(memory_format=torch.channels_last)
        self = self.contiguous(memory_format=torch.channels_last)
    _assert_same((exact_ops.threshold_backward(grad, self, 0.5),), (_aten(grad, self, 0.5),))


def _aten_pool(x: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's own max_pool2d_with_indices: the out= overload."""
    out, index = x.new_empty(0), torch.empty(0, dtype=torch.int64)
    return torch.ops.aten.max_pool2d_with_indices.out(x, *args, out=out, indices=index)


def _pool_input(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random values with ties (ReLU's zeros, repeated values), NaNs and infinities; the first
    plane all -inf (no element wins: each output keeps its window's first index)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).clamp_min(0.0).round(decimals=1)
    flat = x.view(-1)
    for value, step in ((float("nan"), 37), (float("inf"), 53), (-float("inf"), 41)):
        flat[::step] = value
    x[0, 0] = -float("inf")
    return x


# (input height, width), kernel, stride, padding, dilation, ceil_mode: GoogLeNet's and VGG's
# pools, then the settings around them (strides over the kernel, padding at its limit, windows
# cut by the input's edge, dilations, ceil mode's extra window).
POOLS = [((32, 32), [3], [1], [1], [1], False), ((16, 16), [3], [2], [1], [1], True),
         ((8, 8), [2], [2], [0], [1], False), ((7, 9), [2, 3], [], [1], [1], False),
         ((7, 9), [3, 2], [3, 1], [1, 0], [2, 1], True), ((5, 5), [4], [3], [2], [1], True),
         ((9, 6), [3], [2], [0], [2], False), ((5, 7), [3], [1], [1], [2], False),
         ((1, 1), [1], [1], [0], [1], False), ((6, 11), [5], [1], [2], [1], False),
         ((3, 3), [3], [5], [1], [1], True)]


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: "-".join(map(str, p)).replace(" ", ""))
@pytest.mark.parametrize("channels", [1, 3])
def test_max_pool2d_gives_atens_values_indices_and_strides(pool, channels):
    (h, w), *args = pool
    x = _pool_input((2, channels, h, w), seed=h * w)
    _assert_same(exact_ops.max_pool2d_with_indices(x, *args), _aten_pool(x, *args))


@pytest.mark.parametrize("case", ["float64", "3-d", "channels last", "padding over half",
                                  "no output"])
def test_pools_the_loop_does_not_take_go_to_atens_kernel(case):
    x, args = _pool_input((2, 3, 6, 6), seed=1), [[3], [1], [1], [1], False]
    if case == "float64":
        x = x.double()
    elif case == "3-d":
        x = x[0]
    elif case == "channels last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif case == "padding over half":
        args[2] = [2]
    else:
        args[0], args[2] = [7], [0]
    try:
        aten = _aten_pool(x, *args)
    except RuntimeError as exc:  # ATen refuses: so must the override, with ATen's message
        with pytest.raises(RuntimeError, match=re.escape(str(exc).splitlines()[0])):
            exact_ops.max_pool2d_with_indices(x, *args)
        return
    _assert_same(exact_ops.max_pool2d_with_indices(x, *args), aten)


# A portable process: ReLU's backward and a max pool (forward and backward) through the
# replaced kernels, against ATen's.
PORTABLE = """
import torch
from core import exact_ops, numerics
numerics.apply("portable")
ours = [any(l.startswith("CPU:") and "exact_ops.py" in l
            for l in torch._C._dispatch_dump(f"aten::{op}").splitlines())
        for op in ("threshold_backward", "max_pool2d_with_indices")]
x = torch.randn(16, 8, 9, 9)
x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, float("nan"), float("inf")])
x.requires_grad_(True)
g, gp = torch.randn(16, 8, 9, 9), torch.randn(16, 8, 5, 5)
(grad,) = torch.autograd.grad(torch.relu(x), x, g)
ref = torch.ops.aten.threshold_backward.grad_input(g, torch.relu(x.detach()), 0,
                                                   grad_input=torch.empty(0))
pooled = torch.nn.functional.max_pool2d(torch.relu(x), 3, 2, 1, ceil_mode=True)
(pool_grad,) = torch.autograd.grad(pooled, x, gp)
out, index = torch.empty(0), torch.empty(0, dtype=torch.int64)
torch.ops.aten.max_pool2d_with_indices.out(torch.relu(x.detach()), [3], [2], [1], [1], True,
                                           out=out, indices=index)
pool_ref = torch.ops.aten.max_pool2d_with_indices_backward(gp, torch.relu(x.detach()), [3],
                                                           [2], [1], [1], True, index)
pool_ref = torch.ops.aten.threshold_backward.grad_input(pool_ref, torch.relu(x.detach()), 0,
                                                        grad_input=torch.empty(0))
print(exact_ops.installed(), *ours, torch.equal(grad.view(torch.int32), ref.view(torch.int32)),
      torch.equal(pooled.view(torch.int32), out.view(torch.int32)),
      torch.equal(pool_grad.view(torch.int32), pool_ref.view(torch.int32)))
"""


def test_a_portable_process_takes_the_loops_for_relus_backward_and_max_pools():
    proc = subprocess.run([sys.executable, "-c", PORTABLE], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"] * 6


def test_a_native_process_keeps_atens_kernel():
    code = ("import torch; from core import exact_ops, numerics; numerics.apply('native'); "
            "print(exact_ops.installed())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
