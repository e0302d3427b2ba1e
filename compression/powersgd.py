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
worker sends 32 (n r + m r) bits per layer per step. A layer with (n + m) r >= n m would send
no fewer numbers compressed, so it goes dense instead (M all-reduced inside the P message, its
error memory emptied); that is logged once per layer.

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
from collections import defaultdict
from typing import Any

import torch

from compression import register
from compression.base import Compressor, Layer, Sent
from compression.comm import Comm, Steps
from compression.memory import ErrorFeedback
from core.errors import check_bool, check_int

log = logging.getLogger(__name__)

FP32_BITS = 32
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
        if self.restart and level != layer.level:
            layer.memory.pop("q", None)
        layer.level = level

    def step_bits(self, shape: torch.Size, level: Any) -> int:
        n, m = shape[0], math.prod(shape[1:])
        r = min(level, n, m)
        return FP32_BITS * ((n + m) * r if (n + m) * r < n * m else n * m)

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
                dense.append((layer, grad.view(n, m)))

        # P message: the P's grouped by (n, r), so each group orthogonalizes as one batch,
        # then the dense layers' M's.
        groups: dict[tuple[int, int], list[tuple[Layer, torch.Tensor, int]]] = defaultdict(list)
        for item in low_rank:
            groups[(item[1].shape[0], item[2])].append(item)
        p_size = sum(n * r * len(g) for (n, r), g in groups.items())
        flat_p = grads[0].new_empty(p_size + sum(g.numel() for _, g in dense))
        batches, ps, offset = [], [], 0
        for (n, r), group in groups.items():
            batch = flat_p[offset:offset + len(group) * n * r].view(len(group), n, r)
            batches.append(batch)
            for i, (layer, grad, _) in enumerate(group):
                acc = self.memory.compensate(layer, grad).view(grad.shape)  # M = g + e
                torch.mm(acc, self._warm_q(layer, grad, r), out=batch[i])    # P = M Q
                ps.append((layer, grad, acc, batch[i]))
            offset += batch.numel()
        for layer, grad in dense:                                  # M = g + e, sent whole:
            flat_p[offset:offset + grad.numel()].copy_(self.memory.drain(layer, grad))  # e = 0
            offset += grad.numel()

        yield comm.all_reduce(flat_p)                     # P = all_reduce(P)

        offset = p_size
        for _, grad in dense:
            torch.div(flat_p[offset:offset + grad.numel()].view_as(grad), world, out=grad)
            offset += grad.numel()
        for batch in batches:
            orthogonalize(batch)                          # P = orthogonalize(P)
        flat_q = flat_p.new_empty(sum(acc.shape[1] * p.shape[1] for _, _, acc, p in ps))
        qs, offset = [], 0
        for _, _, acc, p in ps:
            q = flat_q[offset:offset + acc.shape[1] * p.shape[1]].view(acc.shape[1], p.shape[1])
            torch.mm(acc.T, p, out=q)                     # Q = M^T P
            qs.append(q)
            offset += q.numel()

        yield comm.all_reduce(flat_q)
        flat_q.div_(world)                                # Q = all_reduce(Q) / W

        for (layer, grad, acc, p), q in zip(ps, qs, strict=True):
            if self.memory.enabled:
                acc.addmm_(p, q.T, alpha=-1)              # e = M - P Q^T
            torch.mm(p, q.T, out=grad)                    # out = P Q^T
            layer.memory["q"] = q                         # warm start for the next step
        bits = [self.step_bits(layer.shape, layer.level) for layer in layers]
        return [Sent(b, b) for b in bits]

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
