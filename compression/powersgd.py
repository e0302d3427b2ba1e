"""``compressor=powersgd``: rank-r PowerSGD with error feedback and warm start.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization" (NeurIPS 2019), Algorithm 1 (one power-iteration step, the compressor) inside
Algorithm 2 (error feedback), as Accordion uses it. For every matrix-shaped layer, with the
gradient viewed as ``(shape[0], -1)`` (n x m) and r = min(rank, n, m)::

    M = g + e                  Alg. 2: add this worker's error memory
    P = M Q                    Alg. 1 l.2, Q: the layer's Q from the previous step (warm start)
    P = all_reduce(P)          Alg. 1 l.3 (a sum: the scale vanishes in the next line)
    P = orthogonalize(P)       Alg. 1 l.4, Gram-Schmidt
    Q = M^T P                  Alg. 1 l.5
    Q = all_reduce(Q) / W      Alg. 1 l.6, the mean over the W workers
    out = P Q^T                Alg. 1 l.10 (decompress): what every worker applies
    e = M - P Q^T              Alg. 2: what this worker's message left out

The P's of all the bucket's layers travel in one all-reduce and the Q's in another. Each
worker sends 32 (n r + m r) bits per layer per step. The layers of a bucket are batched: on
contiguous float32 CPU tensors a C kernel (:mod:`compression._powersgd_kernel`) runs each of
the three passes over the matrices (M and P, Q, out) for all of them in one call, and leaves
the error update e = M - P Q^T owed to the next step's first pass (:meth:`PowerSGD.settle`
pays it at once); elsewhere (CUDA, or without a C compiler) the layers of one shape go through
each line above as one batch (``bmm``), their error memories the rows of one tensor. Both
orthogonalize the P's of one (n, r) as one batch. The two paths sum in different orders, so
they agree within float32 rounding, not bit for bit (tested against each other and against
float64 references). A layer with (n + m) r >= n m would send no fewer numbers compressed, so
it goes dense instead (M all-reduced inside the P message, its error memory emptied); that is
logged once per layer.

Levels: the layer's rank r (an int >= 1). A rank change keeps the warm start: the first r
columns of Q stay, new columns are the layer's initial random columns (drawn from a generator
seeded by ``seed`` and the layer name, so every rank draws the same ones), and the error memory
is kept. ``error_feedback=false`` keeps no error memory. Where this differs from reference code:

* Accordion's authors rebuild the reducer on a rank change, so Q restarts from random (their
  seeded generator: the Q a fresh start has) and the error memory stays:
  ``restart_on_rank_change=true`` (``compressor=powersgd_authors``).
* PyTorch's ``powerSGD_hook`` orthogonalizes Q again before every P = M Q, runs plain all-reduce
  for its first ``start_powerSGD_iter`` (>= 2) steps, and keeps error memory per bucket
  (biases included); it uses QR instead of Gram-Schmidt for rank > 2.
"""

from __future__ import annotations

import logging
import math
import zlib
from itertools import groupby
from typing import Any, NamedTuple

import torch

from compression import _powersgd_kernel as _kernel
from compression import register
from compression.base import Compressor, Layer, Sent, divisor
from compression.comm import Comm, Steps
from compression.memory import ErrorFeedback
from compression.stats import FP32_BITS
from core.errors import check_bool, check_int
from core.native import usable

log = logging.getLogger(__name__)

EPSILON = 1e-8  # keeps Gram-Schmidt finite when a column of P vanishes (zero gradients)


def orthogonalize(p: torch.Tensor, epsilon: float = EPSILON) -> None:
    """Orthonormalize the columns of each matrix in the batch ``p`` (count, n, r), in place.

    Modified Gram-Schmidt: normalize column i, then remove it from the columns after it.
    """
    for i in range(p.shape[2]):
        col = p[:, :, i:i + 1]
        col /= torch.linalg.vector_norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < p.shape[2]:
            rest = p[:, :, i + 1:]
            rest -= torch.bmm(col.transpose(1, 2), rest) * col


def initial_q(seed: int, name: str, m: int, r: int) -> torch.Tensor:
    """Layer ``name``'s random initial Q (m x r), the same on every rank. Column j does not
    depend on r, so a later rank increase draws the columns a fresh start would have had."""
    generator = torch.Generator().manual_seed((seed * 2**32 + zlib.crc32(name.encode())) % 2**63)
    return torch.randn(r, m, generator=generator).T


class Factors(NamedTuple):
    """One low-rank layer of a step: its gradient as n x m, its rank r, and its views into the
    step's P message (n x r) and Q message (Q^T, r x m; filled in the second pass)."""

    layer: Layer
    grad: torch.Tensor
    r: int
    p: torch.Tensor
    qt: torch.Tensor | None = None


@register("powersgd")
class PowerSGD(Compressor):
    """Rank-``rank`` PowerSGD; ``seed`` seeds the initial Q (identical on every rank)."""

    level_field = "rank"
    accordion_levels = (2, 1)  # Accordion's pair (its SENet and VGG-19bn runs use 4 / 1)
    paper = "Vogels et al., NeurIPS 2019"
    wire = "two all-reduces: fp32 P (n x r), then fp32 Q (m x r)"

    def __init__(self, rank: int = 2, seed: int = 0, error_feedback: bool = True,
                 restart_on_rank_change: bool = False) -> None:
        self.rank = check_int(rank, "compressor.rank", 1)
        self.seed = check_int(seed, "compressor.seed", 0)
        self.memory = ErrorFeedback(check_bool(error_feedback, "compressor.error_feedback"))
        self.restart = check_bool(restart_on_rank_change, "compressor.restart_on_rank_change")
        self._noted_dense: set[str] = set()

    def default_level(self, shape: torch.Size) -> int:
        return self.rank

    def validate_level(self, level: Any, field: str | None = None) -> int:
        return check_int(level, field or "compressor.rank", 1)

    def set_level(self, layer: Layer, level: Any) -> None:
        """A new rank; with ``restart_on_rank_change`` Q starts again from the layer's initial
        random Q, as a rebuilt reducer of the authors' code would (the error memory stays)."""
        if level != layer.level:
            self.settle(layer)                    # the owed P Q^T is at the old rank
            if self.restart:
                layer.memory.pop("q", None)
        layer.level = level

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        n, m = shape[0], math.prod(shape[1:])
        r = min(level, n, m)
        return FP32_BITS * ((n + m) * r if (n + m) * r < n * m else n * m)

    def settle(self, layer: Layer) -> None:
        """Pay the error update the kernel left owed: e = e - P Q^T with the last step's P and
        Q (as the next step's first pass would)."""
        p = layer.memory.pop("p", None)
        if p is not None:
            lib = _kernel.kernel()
            assert lib is not None, "an owed P exists only where the kernel runs"
            error = self.memory.peek(layer).reshape(p.shape[0], -1)
            _kernel.settle(lib, error, p, layer.memory["q"].T.contiguous())

    def aggregate(self, layers: list[Layer], grads: list[torch.Tensor], comm: Comm
                  ) -> Steps[list[Sent]]:
        world = comm.world_size
        low_rank, dense = [], []
        for layer, grad in zip(layers, grads, strict=True):
            n, m = layer.shape[0], grad.numel() // layer.shape[0]
            r = min(layer.level, n, m)
            if (n + m) * r < n * m:
                low_rank.append((layer, grad.view(n, m), r))
            else:
                self._note_dense(layer.name, n, m, r)
                dense.append((layer, grad.view(-1)))
        # P message: the P's ordered by (n, r, m), so that the layers of one shape and rank are
        # neighbours (a batch), then the dense layers' M's.
        low_rank.sort(key=lambda item: (item[1].shape[0], item[2], item[1].shape[1]))
        p_size = sum(grad.shape[0] * r for _, grad, r in low_rank)
        flat_p = grads[0].new_empty(p_size + sum(g.numel() for _, g in dense))
        factors, offset = [], 0
        for layer, grad, r in low_rank:
            p = flat_p[offset:offset + grad.shape[0] * r].view(grad.shape[0], r)
            factors.append(Factors(layer, grad, r, p))
            offset += p.numel()
        lib = self._lib(factors)
        mats = self._project(lib, factors)        # M = g + e; P = M Q
        for layer, grad in dense:                 # M = g + e, sent whole: e = 0
            flat_p[offset:offset + grad.numel()].copy_(self.memory.drain(layer, grad))
            offset += grad.numel()

        yield comm.all_reduce(flat_p)             # P = all_reduce(P)

        offset = p_size
        for _, grad in dense:
            torch.div(flat_p[offset:offset + grad.numel()], divisor(flat_p, world), out=grad)
            offset += grad.numel()
        for _, run in groupby(factors, key=lambda f: (f.grad.shape[0], f.r)):
            orthogonalize(_stack_p(list(run)))    # P = orthogonalize(P), one batch per (n, r)
        flat_q = flat_p.new_empty(sum(f.grad.shape[1] * f.r for f in factors))
        offset = 0
        for i, f in enumerate(factors):
            qt = flat_q[offset:offset + f.r * f.grad.shape[1]].view(f.r, f.grad.shape[1])
            factors[i] = f._replace(qt=qt)
            offset += qt.numel()
        self._back(lib, factors, mats)            # Q = M^T P (as Q^T = P^T M)

        yield comm.all_reduce(flat_q)
        flat_q.div_(divisor(flat_q, world))       # Q = all_reduce(Q) / W

        self._expand(lib, factors, mats)          # out = P Q^T; e = M - P Q^T
        for f in factors:
            f.layer.memory["q"] = f.qt.T          # warm start for the next step
        bits = [self.step_bits(layer.shape, layer.level) for layer in layers]
        return [Sent(b, b) for b in bits]

    # ---- the three passes: the C kernel, or batched torch ops -----------------------------
    def _lib(self, factors: list[Factors]) -> Any:
        """The C kernel where it can take every tensor of the step, else None."""
        if not factors:
            return None
        tensors = [f.grad for f in factors]
        if self.memory.enabled:
            tensors += [self.memory.buffer(f.layer, f.grad.numel(), f.grad) for f in factors]
        return _kernel.kernel() if usable(torch.float32, *tensors) else None

    def _project(self, lib: Any, factors: list[Factors]) -> list[torch.Tensor]:
        """M = g + e (into the error memory; without error feedback M = g) and P = M Q for
        every layer; returns the M's: one per layer (kernel) or one batch per shape (eager)."""
        if lib is None:
            return self._eager_project(factors)
        errors = ([self.memory.buffer(f.layer, f.grad.numel(), f.grad).view(f.grad.shape)
                   for f in factors] if self.memory.enabled else [None] * len(factors))
        owed = []
        for f in factors:
            p = f.layer.memory.pop("p", None)      # paid by this pass
            owed.append(None if p is None else (p, f.layer.memory["q"].T.contiguous()))
        qts = [self._warm_q(f.layer, f.grad, f.r).T.contiguous() for f in factors]
        _kernel.project(lib, errors, [f.grad for f in factors], qts, owed,
                        [f.p for f in factors])
        return [f.grad if e is None else e for f, e in zip(factors, errors, strict=True)]

    def _back(self, lib: Any, factors: list[Factors], mats: list[torch.Tensor]) -> None:
        """Q^T = P^T M for every layer, into its view of the Q message."""
        if lib is not None:
            _kernel.back(lib, mats, [f.p for f in factors], [f.qt for f in factors])
            return
        for batch, mat in zip(_batches(factors), mats, strict=True):
            torch.bmm(_stack_p(batch).transpose(1, 2), mat, out=_stack_qt(batch))

    def _expand(self, lib: Any, factors: list[Factors], mats: list[torch.Tensor]) -> None:
        """out = P Q^T into every gradient; e = M - P Q^T (the kernel owes it: P is kept)."""
        if lib is not None:
            _kernel.expand(lib, [f.grad for f in factors], [f.p for f in factors],
                           [f.qt for f in factors])
            if self.memory.enabled:
                for f in factors:
                    f.layer.memory["p"] = f.p
            return
        for batch, mat in zip(_batches(factors), mats, strict=True):
            p, qt = _stack_p(batch), _stack_qt(batch)
            if self.memory.enabled:
                mat.baddbmm_(p, qt, alpha=-1)     # e = M - P Q^T
            for f in batch:
                torch.mm(f.p, f.qt, out=f.grad)   # out = P Q^T

    def _eager_project(self, factors: list[Factors]) -> list[torch.Tensor]:
        """The first pass in torch ops, one batch (``bmm``) per shape and rank."""
        mats = []
        for batch in _batches(factors):
            for f in batch:
                self.settle(f.layer)               # an owed P from the kernel (another device)
            n, m = batch[0].grad.shape
            grads = [f.grad for f in batch]
            if self.memory.enabled:                # M = g + e, in the memories (rows of one)
                rows = self.memory.stacked([f.layer for f in batch], n * m, grads[0])
                torch._foreach_add_(list(rows), [g.view(-1) for g in grads])
                mat = rows.view(len(batch), n, m)
            else:
                mat = torch.stack(grads)           # M = g (out overwrites g later)
            q = torch.stack([self._warm_q(f.layer, f.grad, f.r) for f in batch])
            torch.bmm(mat, q, out=_stack_p(batch))  # P = M Q
            mats.append(mat)
        return mats

    def _warm_q(self, layer: Layer, grad: torch.Tensor, r: int) -> torch.Tensor:
        """The previous step's Q (m x r), cut or extended to rank r after a level change."""
        q = layer.memory.get("q")
        if q is None or q.shape[1] < r:
            initial = initial_q(self.seed, layer.name, grad.shape[1], r).to(grad)
            q = initial if q is None else torch.cat([q, initial[:, q.shape[1]:]], dim=1)
        return q[:, :r]

    def _note_dense(self, name: str, n: int, m: int, r: int) -> None:
        if name not in self._noted_dense:
            self._noted_dense.add(name)
            log.info("powersgd: %s (%d x %d) goes uncompressed: rank %d would send %d numbers "
                     "instead of %d", name, n, m, r, (n + m) * r, n * m)


def _batches(factors: list[Factors]) -> list[list[Factors]]:
    """The runs of layers of one shape and rank (neighbours in the messages)."""
    return [list(run) for _, run in groupby(factors, key=lambda f: (*f.grad.shape, f.r))]


def _stack_p(batch: list[Factors]) -> torch.Tensor:
    """The batch's P's (of one n and r) as one (count, n, r) view of the P message."""
    return _run_view(batch[0].p, len(batch))


def _stack_qt(batch: list[Factors]) -> torch.Tensor:
    """The batch's Q^T's as one (count, r, m) view of the Q message."""
    return _run_view(batch[0].qt, len(batch))


def _run_view(first: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` matrices shaped as ``first`` that follow it in its message, as one batch."""
    return first.as_strided((count, *first.shape), (first.numel(), *first.stride()))
