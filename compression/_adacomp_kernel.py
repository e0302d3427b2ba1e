"""AdaComp's CPU kernel: Algorithm 2 in two streaming passes, in C, called through ctypes.

The eager torch path (``AdaComp._select_eager``) makes about a dozen passes over a layer (add,
abs, amax, add, abs, ge, nonzero, index_select, index_add_, ...). Here::

    adacomp_max         g_max(i) = max |residue + dW| over each bin (reads only)
    (torch)             s = g_max.mean(), so that s has the eager path's bits
    adacomp_select      G = residue + dW, H = G + dW; sent where |H| >= g_max(i) > 0 and G != 0
                        (hard LS: the bin's first argmax |G|), as signed indices (index + 1,
                        negated when G < 0); residue = G - sign(G) s where sent, G elsewhere
    adacomp_decompress  out = sum_w sign v_w at every worker's received signed indices

The library is plain C (no torch headers, no ninja): it compiles in a fraction of a second with
the system C compiler and is cached by the hash of its source; on x86-64 the two passes are
compiled for AVX2 and for any CPU, and the loader picks one. Without a compiler, :func:`kernel`
warns once and returns None, and AdaComp uses the eager path. The results are bit-identical to
the eager path (tested): the same float operations, rounded alike and summed in the same order;
the max is exact (taken on the bit patterns of |G|, which order as the floats do).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE = r"""
#include <stdint.h>
#include <string.h>

enum { CHUNK = 256, BLOCK = 4096 };

static inline uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline uint32_t abs_bits(float x) { return bits(x) & 0x7fffffffu; }

#if defined(__x86_64__) && defined(__GNUC__)
#define CLONES __attribute__((target_clones("avx2", "default")))  /* picked at load time */
#else
#define CLONES
#endif

/* Alg. 2, first pass: g_max[bin] = max |residue + dW| over each bin of bin_size elements (the
   last one may be shorter). Reads only. */
CLONES void adacomp_max(const float *residue, const float *grad, int64_t n, int64_t bin_size,
                        float *g_max) {
    for (int64_t start = 0, bin = 0; start < n; start += bin_size, ++bin) {
        int64_t end = n - start > bin_size ? start + bin_size : n;
        uint32_t m = 0;
        for (int64_t j = start; j < end; ++j) {
            uint32_t a = abs_bits(residue[j] + grad[j]);     /* |G|; a NaN's bits are largest */
            m = a > m ? a : m;                               /* g_max = max |G| over the bin */
        }
        memcpy(&g_max[bin], &m, 4);
    }
}

/* The signed index (index + 1, negated when G < 0) and sign(G) s, without branches. */
static inline int32_t signed_index(int32_t k, float g) {
    int32_t neg = -(int32_t)(bits(g) >> 31);                 /* -1 if G < 0 (or -0: not sent) */
    return (k ^ neg) - neg;
}
static inline float with_sign_of(float s, float g) {
    uint32_t u = bits(s) ^ (bits(g) & 0x80000000u); memcpy(&s, &u, 4); return s;
}

/* Alg. 2, second pass: residue := G - G_q (G_q = sign(G) s where sent, 0 elsewhere); the sent
   elements' signed indices go to out (room for n). Returns how many were sent. */
CLONES int64_t adacomp_select(float *residue, const float *grad, int64_t n, int64_t bin_size,
                              int soft, const float *g_max, float s, int32_t *out) {
    int64_t count = 0;
    for (int64_t start = 0, bin = 0; start < n; start += bin_size, ++bin) {
        int64_t end = n - start > bin_size ? start + bin_size : n;
        uint32_t m = bits(g_max[bin]);
        int sends = g_max[bin] > 0.0f;                       /* bin of zeros (or NaN): none */
        if (!soft) {                                         /* hard LS: first argmax |G| */
            int64_t first = -1;
            for (int64_t j = start; j < end; ++j) {
                float g = residue[j] + grad[j];              /* G = residue + dW */
                residue[j] = g;
                if (first < 0 && abs_bits(g) == m) first = j;
            }
            if (sends) {
                out[count++] = signed_index((int32_t)(first + 1), residue[first]);
                residue[first] -= with_sign_of(s, residue[first]);
            }
            continue;
        }
        for (int64_t c = start; c < end; c += CHUNK) {       /* in chunks, to vectorize */
            int32_t len = end - c < CHUNK ? (int32_t)(end - c) : CHUNK, base = (int32_t)c + 1;
            int32_t tmp[CHUNK];
            for (int32_t j = 0; j < len; ++j) {               /* vectorized: no branches */
                float g = residue[c + j] + grad[c + j];      /* G = residue + dW */
                float h = g + grad[c + j];                   /* H = G + dW */
                int32_t send = sends & (abs_bits(h) >= m) & (abs_bits(g) != 0);  /* |H| >= g_max */
                uint32_t q = bits(with_sign_of(s, g)) & -(uint32_t)send;  /* G_q, or +0 */
                float gq; memcpy(&gq, &q, 4);
                residue[c + j] = g - gq;                     /* residue = G - G_q */
                tmp[j] = signed_index(base + j, g) & -send;
            }
            for (int32_t j = 0; j < len; ++j) {               /* keep the nonzero ones */
                out[count] = tmp[j];
                count += tmp[j] != 0;
            }
        }
    }
    return count;
}

/* The signed index k's element (|k| - 1) and sign(k) v, without branches (signs are random). */
static inline int64_t element(int32_t k) { int32_t neg = k >> 31; return ((k ^ neg) - neg) - 1; }
static inline float signed_value(int32_t k, float v) {
    uint32_t u = bits(v) ^ ((uint32_t)k & 0x80000000u); memcpy(&v, &u, 4); return v;
}

/* out = sum_w sign v[w] at worker w's received signed indices (as zero_ then index_add_ of
   the workers' lists, in worker order), block by block so that the zeros and the sums are
   written in one pass. Returns 0, or -1 if an index is out of [1, n] (then out is partial). */
int adacomp_decompress(float *out, int64_t n, int64_t world, const int32_t *const *received,
                       const int64_t *count, const float *v, int64_t *next) {
    for (int64_t w = 0; w < world; ++w) next[w] = 0;
    for (int64_t start = 0; start < n; start += BLOCK) {
        uint64_t end = (uint64_t)(n - start > BLOCK ? start + BLOCK : n);
        memset(out + start, 0, (end - start) * sizeof(float));
        for (int64_t w = 0; w < world; ++w) {              /* each list is ascending */
            const int32_t *r = received[w];
            int64_t i = next[w], stop = count[w];
            float value = v[w];
            for (; i < stop && (uint64_t)element(r[i]) < end; ++i)
                out[element(r[i])] += signed_value(r[i], value);
            next[w] = i;
        }
    }
    for (int64_t w = 0; w < world; ++w) if (next[w] != count[w]) return -1;
    return 0;
}
"""

# -ffp-contract=off: no fused multiply-adds, so every float operation rounds as torch's does.
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-fast-math")

_lib: ctypes.CDLL | None = None
_tried = False


def _build() -> ctypes.CDLL:
    """Compile SOURCE (once per source and flags; cached) and load it."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC) found")
    tag = hashlib.sha256((SOURCE + compiler + " ".join(FLAGS)).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "accordion-bench"
    path = cache / f"adacomp_{tag}.so"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src, lib = Path(tmp) / "adacomp.c", Path(tmp) / "adacomp.so"
            src.write_text(SOURCE)
            subprocess.run([compiler, *FLAGS, str(src), "-o", str(lib)], check=True,
                           capture_output=True, text=True)
            os.replace(lib, path)  # atomic: ranks building at once all load a whole file
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.adacomp_max.argtypes = [p, p, i64, i64, p]
    lib.adacomp_max.restype = None
    lib.adacomp_select.argtypes = [p, p, i64, i64, ctypes.c_int, p, ctypes.c_float, p]
    lib.adacomp_select.restype = i64
    lib.adacomp_decompress.argtypes = [p, i64, i64, p, p, p, p]
    lib.adacomp_decompress.restype = ctypes.c_int
    return lib


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    global _lib, _tried
    if not _tried:
        _tried = True
        try:
            _lib = _build()
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            warnings.warn(f"AdaComp: the C kernel could not be built ({detail}); using the "
                          f"slower eager torch path", RuntimeWarning, stacklevel=2)
    return _lib


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernel can take these tensors: contiguous float32 CPU ones."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
               for t in tensors)


def decompress(lib: ctypes.CDLL, out: torch.Tensor, received: list[torch.Tensor],
               counts: torch.Tensor, values: torch.Tensor) -> None:
    """``out`` = sum over workers w of sign(k) ``values[w]`` at each signed index k of the
    first ``counts[w]`` of ``received[w]`` (contiguous int32, ascending |k|)."""
    world = len(received)
    pointers = (ctypes.c_void_p * world)(*(r.data_ptr() for r in received))
    counts = counts.to(torch.int64).contiguous()
    values = values.to(torch.float32).contiguous()
    cursors = torch.empty(world, dtype=torch.int64)
    if lib.adacomp_decompress(out.data_ptr(), out.numel(), world, pointers, counts.data_ptr(),
                              values.data_ptr(), cursors.data_ptr()):
        raise ValueError("AdaComp: a received index is out of range")
