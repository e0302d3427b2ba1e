"""PowerSGD's CPU kernel: a bucket's matrices in three passes, in C (kernels/powersgd.c).

The eager torch path (``PowerSGD._eager_*``) reads and writes every matrix about five times a
step: M = g + e, P = M Q, Q^T = P^T M, e = M - P Q^T, out = P Q^T. Here, for all the bucket's
low-rank layers in one call each::

    psgd_project   M = (e - P_o Q_o^T) + g, stored in e, and P = M Q, in one pass (two rows
                   at a time: Q^T is read once for both)
    (torch)        P = all_reduce(P), orthogonalize(P)
    psgd_back      Q^T = P^T M, rows read in blocks of ROWS (Q^T stays in cache), the next
                   block's rows prefetched
    (torch)        Q = all_reduce(Q) / W
    psgd_expand    out = P Q^T (AVX2: streaming stores, as out is only written)

The error update e = M - P Q^T of a step is owed: the layer keeps that step's P (``memory["p"]``
beside its Q) and the next step's pass 1 takes P Q^T off e as it reads it, with the float
operations ``psgd_expand`` used for out (so e = M - out, exactly). :func:`settle` pays it at once
(before a checkpoint, a rank change, or the eager path).

Sums run in a fixed order of their own (P's over the columns in LANES lanes, then the lanes
pairwise; Q^T's over the rows in order; P Q^T's over the rank in order), not BLAS's: the results
agree with the eager path within float32 rounding, not bit for bit. The AVX2 and the portable
build of the kernel give the same bits (tested).
"""

from __future__ import annotations

import ctypes

import torch

from core.native import Library, int64s, pointers

LANES = 8  # columns per lane block: one AVX2 vector of float32
ROWS = 8   # rows of M per block of psgd_back

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
_PASS = [_i64, _p, _p, _p, _p, _p, _p]
LIBRARY = Library("powersgd", {
    "psgd_project": ([_i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p], None),
    "psgd_back": (_PASS, None),
    "psgd_expand": (_PASS, None),
    "psgd_settle": ([_p, _i64, _i64, _i64, _p, _p], None),
}, defines={"LANES": LANES, "ROWS": ROWS})


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    return LIBRARY.get()


def _maybe(tensors: list[torch.Tensor | None]) -> ctypes.Array:
    """Data pointers, NULL for None."""
    return (ctypes.c_void_p * len(tensors))(*(None if t is None else t.data_ptr()
                                              for t in tensors))


def _dims(mats: list[torch.Tensor], ps: list[torch.Tensor]) -> tuple[ctypes.Array, ...]:
    return (int64s([x.shape[0] for x in mats]), int64s([x.shape[1] for x in mats]),
            int64s([p.shape[1] for p in ps]))


def project(lib: ctypes.CDLL, errors: list[torch.Tensor | None], grads: list[torch.Tensor],
            qts: list[torch.Tensor], owed: list[tuple[torch.Tensor, torch.Tensor] | None],
            ps: list[torch.Tensor]) -> None:
    """Pass 1 for every layer: M = (e - P_o Q_o^T) + g into ``errors[l]`` (None: no error
    memory, M = g) and P = M Q into ``ps[l]`` (n x r); ``qts[l]``: Q^T (r x m); ``owed[l]``:
    (P_o, Q_o^T) still to take off e, or None. All contiguous float32."""
    n, m, r = _dims(grads, ps)
    lib.psgd_project(len(grads), _maybe(errors), pointers(grads), n, m, r, pointers(qts),
                     _maybe([o and o[0] for o in owed]), _maybe([o and o[1] for o in owed]),
                     int64s([0 if o is None else o[0].shape[1] for o in owed]), pointers(ps))


def back(lib: ctypes.CDLL, mats: list[torch.Tensor], ps: list[torch.Tensor],
         qts: list[torch.Tensor]) -> None:
    """Pass 2: ``qts[l]`` = P^T M (r x m), M = ``mats[l]`` (n x m), P = ``ps[l]``."""
    n, m, r = _dims(mats, ps)
    lib.psgd_back(len(mats), pointers(mats), n, m, r, pointers(ps), pointers(qts))


def expand(lib: ctypes.CDLL, outs: list[torch.Tensor], ps: list[torch.Tensor],
           qts: list[torch.Tensor]) -> None:
    """Pass 3: ``outs[l]`` = P Q^T (n x m)."""
    n, m, r = _dims(outs, ps)
    lib.psgd_expand(len(outs), pointers(outs), n, m, r, pointers(ps), pointers(qts))


def settle(lib: ctypes.CDLL, error: torch.Tensor, p: torch.Tensor, qt: torch.Tensor) -> None:
    """``error`` (n x m) = error - P Q^T, as pass 1 would take it off."""
    lib.psgd_settle(error.data_ptr(), error.shape[0], error.shape[1], p.shape[1], p.data_ptr(),
                    qt.data_ptr())
