/* PowerSGD's CPU kernel: the three passes over a bucket's matrices (compression/powersgd.py).
   The Python side is compression/_powersgd_kernel.py: its docstring describes the passes; it
   defines LANES and ROWS (-D), which this file checks.

   Every sum runs in a fixed order, written once as plain loops over LANES lanes: the same
   function is compiled twice, for AVX2 (the compiler turns the lane loops into vector
   instructions) and portable, and -ffp-contract=off keeps every multiply and add rounded on its
   own, so both give the same bits. A matrix's rows of m elements are taken LANES columns at a
   time; past column m a lane reads +0 (in every operand), so it adds the same in both. The
   AVX2 expand alone is its own function (expand_stream: streaming stores). */
#include "prelude.h"

_Static_assert(LANES == 8, "a lane block is one AVX2 vector of float32");
_Static_assert(ROWS >= 1, "rows per block of the back projection");
#define KB 4                      /* columns of P (or Q) accumulated per sweep of a row */
#define PROJECT_ROWS 2            /* rows of M per sweep of psgd_project */
#define PREFETCH 16               /* floats per cache line: one prefetch each */

#define ALWAYS static inline __attribute__((always_inline))
/* Vectors pass between functions only where they are inlined: no ABI to keep. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* LANES float32 lanes: GCC's vector extension, one AVX2 register where the function is built
   for AVX2, plain lanes elsewhere; each operator rounds lane by lane as a float does. */
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

/* LANES elements of src from column j (of m): whole (j + LANES <= m, a constant where this is
   inlined), or +0 past m. */
ALWAYS vec load(const float *src, int64_t j, int64_t m, const int whole) {
    vec v = {0.0f};
    if (whole) {
        memcpy(&v, src + j, sizeof v);
    } else {
        for (int l = 0; l < LANES; ++l) v[l] = j + l < m ? src[j + l] : 0.0f;
    }
    return v;
}

ALWAYS void store(float *dst, vec v, int64_t j, int64_t m, const int whole) {
    if (whole) {
        memcpy(dst + j, &v, sizeof v);
    } else {
        for (int l = 0; l < LANES; ++l)
            if (j + l < m) dst[j + l] = v[l];
    }
}

/* Run body(j, whole) over a row of m columns: the whole lane blocks, then the last part. */
#define FOR_LANES(m, body)                                                                    \
    do {                                                                                      \
        int64_t j_ = 0;                                                                       \
        for (; j_ + LANES <= (m); j_ += LANES) body(j_, 1);                                   \
        if (j_ < (m)) body(j_, 0);                                                            \
    } while (0)

/* c[b] = sum_k p[b][k] qt[k][j..j+LANES), k = 0, 1, ... in order: LANES columns of the rows
   p[0 .. rows) of P Q^T, each load of Q^T serving every row (rows: a constant where this is
   inlined). Pass 1 takes the owed P Q^T off e with these float operations, pass 3 and settle
   make P Q^T with them: so e = M - out exactly. */
ALWAYS void low_rank_rows(const float *const *p, const int rows, const float *qt, int64_t r,
                          int64_t j, int64_t m, const int whole, vec *c) {
    vec q = load(qt, j, m, whole);
    for (int b = 0; b < rows; ++b) c[b] = p[b][0] * q;
    for (int64_t k = 1; k < r; ++k) {
        q = load(qt + k * m, j, m, whole);
        for (int b = 0; b < rows; ++b) c[b] = c[b] + p[b][k] * q;
    }
}

/* LANES columns of row p of P Q^T (low_rank_rows for one row). */
ALWAYS vec low_rank(const float *p, const float *qt, int64_t r, int64_t j, int64_t m,
                    const int whole) {
    vec c;
    low_rank_rows(&p, 1, qt, r, j, m, whole, &c);
    return c;
}

/* The sum of the lanes of a, pairwise: (a0 + a4) + (a2 + a6), plus (a1 + a5) + (a3 + a7). */
ALWAYS float lane_sum(vec a) {
    float s[4], t[2];
    for (int l = 0; l < 4; ++l) s[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; ++l) t[l] = s[l] + s[l + 2];
    return t[0] + t[1];
}

/* Columns k0 .. k0 + kb of P for rows i0 .. i0 + rows: P = M Q (qt: Q^T, r x m). With make
   (k0 = 0 and an error memory e), M = (e - P_o Q_o^T) + g is made from the rows' e and g and
   stored in e (p_o NULL: nothing owed); otherwise M is read from e (from g without an error
   memory). The rows share each load of Q^T and Q_o^T (at rank 2 and more, ResNet-18's widest
   Q^T no longer fits in L1: two rows read it from L2 half as often as one; kernel_ab: project
   1.1-1.2x faster at ranks 2 and 4), and each row's sums run as they would alone. rows and kb
   are constants where this is inlined, so the accumulators stay in registers. The `ahead` rows
   after these (of g and e, or of the array M is read from) are prefetched at the same columns,
   a cache line at a time, as back_rows does: each row is a stream starting cold. */
ALWAYS void project_rows(float *e, const float *g, int64_t i0, const int rows, int64_t ahead,
                         int64_t m, const int make, const float *qt, int64_t k0, const int kb,
                         const float *p_o, const float *qt_o, int64_t r_o, float *p, int64_t r) {
    vec acc[PROJECT_ROWS][KB] = {{{0.0f}}};
    float *er[PROJECT_ROWS];
    const float *gr[PROJECT_ROWS], *mr[PROJECT_ROWS], *por[PROJECT_ROWS];
    for (int b = 0; b < rows; ++b) {
        er[b] = e ? e + (i0 + b) * m : NULL;
        gr[b] = g + (i0 + b) * m;
        mr[b] = e ? er[b] : gr[b];
        por[b] = p_o ? p_o + (i0 + b) * r_o : NULL;
    }
#define PROJECT(j, whole)                                                                     \
    do {                                                                                      \
        vec x[PROJECT_ROWS];                                                                  \
        if (make) {                                                   /* M = g + e, once */   \
            for (int b = 0; b < rows; ++b) x[b] = load(er[b], j, m, whole);                   \
            if (p_o) {                                                /* e - P_o Q_o^T */     \
                vec c[PROJECT_ROWS];                                                          \
                low_rank_rows(por, rows, qt_o, r_o, j, m, whole, c);                          \
                for (int b = 0; b < rows; ++b) x[b] = x[b] - c[b];                            \
            }                                                                                 \
            for (int b = 0; b < rows; ++b) {                                                  \
                x[b] = x[b] + load(gr[b], j, m, whole);                                       \
                store(er[b], x[b], j, m, whole);                                              \
            }                                                                                 \
        } else {                                                                              \
            for (int b = 0; b < rows; ++b) x[b] = load(mr[b], j, m, whole);                   \
        }                                                                                     \
        if ((j) % PREFETCH == 0)                                                              \
            for (int64_t b = 0; b < ahead; ++b) {                                             \
                const int64_t at = (i0 + rows + b) * m + (j);                                 \
                if (make) {                                       /* read g, write e */       \
                    __builtin_prefetch(g + at, 0, 2);                                         \
                    __builtin_prefetch(e + at, 1, 2);                                         \
                } else {                                                                      \
                    __builtin_prefetch((e ? e : g) + at, 0, 2);                               \
                }                                                                             \
            }                                                                                 \
        for (int k = 0; k < kb; ++k) {                                /* P = M Q */           \
            const vec q = load(qt + (k0 + k) * m, j, m, whole);                               \
            for (int b = 0; b < rows; ++b) acc[b][k] = acc[b][k] + x[b] * q;                  \
        }                                                                                     \
    } while (0)
    FOR_LANES(m, PROJECT);
#undef PROJECT
    for (int b = 0; b < rows; ++b)
        for (int k = 0; k < kb; ++k) p[(i0 + b) * r + k0 + k] = lane_sum(acc[b][k]);
}

/* Pass 1 of one matrix (n x m): M = (e - P_o Q_o^T) + g, stored in e (without e: M = g;
   without p_o: nothing owed), and P = M Q (p: n x r), KB columns of P per sweep of
   PROJECT_ROWS rows. */
ALWAYS void project(float *e, const float *g, int64_t n, int64_t m, int64_t r, const float *qt,
                    const float *p_o, const float *qt_o, int64_t r_o, float *p) {
    int64_t i = 0;
#define SWEEP(rows, kb)                                                                       \
    project_rows(e, g, i, rows, k0 + (kb) >= r ? ahead : 0, m, make, qt, k0, kb, p_o, qt_o,   \
                 r_o, p, r)
#define SWEEPS(rows, rows_ahead)                                                              \
    for (int64_t k0 = 0, ahead = (rows_ahead); k0 < r; k0 += KB) {                            \
        const int make = e && k0 == 0;                                                        \
        switch (r - k0) {                                                                     \
            case 1: SWEEP(rows, 1); break;                                                    \
            case 2: SWEEP(rows, 2); break;                                                    \
            case 3: SWEEP(rows, 3); break;                                                    \
            default: SWEEP(rows, KB);                                                         \
        }                                                                                     \
    }
    for (; i + PROJECT_ROWS <= n; i += PROJECT_ROWS) {
        const int64_t left = n - i - PROJECT_ROWS;
        SWEEPS(PROJECT_ROWS, left < PROJECT_ROWS ? left : PROJECT_ROWS)
    }
    for (; i < n; ++i) SWEEPS(1, 0)
#undef SWEEP
#undef SWEEPS
}

/* Rows i0 .. i0 + rows of M added to qt = P^T M, row after row (rows: a constant where this is
   inlined; M's LANES columns are read once for all of Q^T's rows). The next block's first
   `ahead` rows are prefetched at the same columns, a cache line (PREFETCH floats) at a time: a
   block's rows are separate streams, each starting cold, which the hardware prefetcher alone
   leaves waiting (benchmarks/kernel_ab.py: back 1.2-1.5x faster with it). */
ALWAYS void back_rows(const float *mat, int64_t i0, const int rows, int64_t ahead, int64_t m,
                      int64_t r, const float *p, float *qt) {
#define BACK(j, whole)                                                                        \
    do {                                                                                      \
        vec x[ROWS];                                                                          \
        for (int b = 0; b < rows; ++b) x[b] = load(mat + (i0 + b) * m, j, m, whole);          \
        if ((j) % PREFETCH == 0)                                                              \
            for (int64_t b = 0; b < ahead; ++b)                                               \
                __builtin_prefetch(mat + (i0 + rows + b) * m + (j), 0, 2);                    \
        for (int64_t k = 0; k < r; ++k) {                                                     \
            vec s = load(qt + k * m, j, m, whole);                                            \
            for (int b = 0; b < rows; ++b) s = s + p[(i0 + b) * r + k] * x[b];                \
            store(qt + k * m, s, j, m, whole);                                                \
        }                                                                                     \
    } while (0)
    FOR_LANES(m, BACK);
#undef BACK
}

/* Pass 2 of one matrix: qt = P^T M (r x m), each element a sum over the rows in order. */
ALWAYS void back(const float *mat, int64_t n, int64_t m, int64_t r, const float *p, float *qt) {
    memset(qt, 0, (size_t)(r * m) * sizeof(float));
    int64_t i = 0;
    for (; i + ROWS <= n; i += ROWS) {
        const int64_t left = n - i - ROWS;
        back_rows(mat, i, ROWS, left < ROWS ? left : ROWS, m, r, p, qt);
    }
    for (; i < n; ++i) back_rows(mat, i, 1, 0, m, r, p, qt);
}

/* Pass 3 of one matrix: out = P Q^T. */
ALWAYS void expand(float *out, int64_t n, int64_t m, int64_t r, const float *p, const float *qt) {
    for (int64_t i = 0; i < n; ++i) {
#define EXPAND(j, whole) store(out + i * m, low_rank(p + i * r, qt, r, j, m, whole), j, m, whole)
        FOR_LANES(m, EXPAND);
#undef EXPAND
    }
}

#ifdef X86
/* expand for AVX2 with streaming stores (out is only written: no read for ownership, no cache
   pollution; _mm_sfence() at the end of the pass). An element of P Q^T is the same sum in any
   lane (low_rank adds lane by lane), so a row's lane blocks start at its first 32-byte
   boundary: the elements before it and the last ones go one at a time, as the first lane of a
   part block. */
__attribute__((target("avx2")))
static void expand_stream(float *out, int64_t n, int64_t m, int64_t r, const float *p,
                          const float *qt) {
    for (int64_t i = 0; i < n; ++i) {
        float *oi = out + i * m;
        const float *pi = p + i * r;
        int64_t j = 0;
        for (; j < m && ((uintptr_t)(oi + j) & 31) != 0; ++j)
            oi[j] = low_rank(pi, qt, r, j, m, 0)[0];
        for (; j + LANES <= m; j += LANES)
            _mm256_stream_ps(oi + j, low_rank(pi, qt, r, j, m, 1));
        for (; j < m; ++j) oi[j] = low_rank(pi, qt, r, j, m, 0)[0];
    }
}
#endif

/* Each pass over a bucket's layers, compiled for AVX2 and portable (see the top). */
#define PASSES(suffix, attr)                                                                  \
    attr static void project_##suffix(int64_t layers, float *const *e, const float *const *g, \
            const int64_t *n, const int64_t *m, const int64_t *r, const float *const *qt,     \
            const float *const *p_o, const float *const *qt_o, const int64_t *r_o,            \
            float *const *p) {                                                                \
        for (int64_t l = 0; l < layers; ++l)                                                  \
            project(e[l], g[l], n[l], m[l], r[l], qt[l], p_o[l], qt_o[l], r_o[l], p[l]);      \
    }                                                                                         \
    attr static void back_##suffix(int64_t layers, const float *const *mat, const int64_t *n, \
            const int64_t *m, const int64_t *r, const float *const *p, float *const *qt) {    \
        for (int64_t l = 0; l < layers; ++l) back(mat[l], n[l], m[l], r[l], p[l], qt[l]);     \
    }                                                                                         \
    attr static void expand_##suffix(int64_t layers, float *const *out, const int64_t *n,     \
            const int64_t *m, const int64_t *r, const float *const *p,                        \
            const float *const *qt) {                                                         \
        for (int64_t l = 0; l < layers; ++l)                                                  \
            EXPAND_##suffix(out[l], n[l], m[l], r[l], p[l], qt[l]);                           \
    }

#define EXPAND_portable expand
#define EXPAND_avx2 expand_stream
PASSES(portable, )
#ifdef X86
PASSES(avx2, __attribute__((target("avx2"))))
#define DISPATCH(pass, ...) \
    do { if (use_avx2()) pass##_avx2(__VA_ARGS__); else pass##_portable(__VA_ARGS__); } while (0)
#else
#define DISPATCH(pass, ...) pass##_portable(__VA_ARGS__)
#endif

/* Pass 1 over a bucket's layers: layer l's M = (e - P_o Q_o^T) + g into e[l] (e[l] NULL: no
   error memory, M = g; p_o[l] NULL: nothing owed) and P = M Q into p[l] (n x r); qt[l] is Q^T
   (r x m), qt_o[l] the owed Q_o^T (r_o[l] x m). */
void psgd_project(int64_t layers, float *const *e, const float *const *g, const int64_t *n,
                  const int64_t *m, const int64_t *r, const float *const *qt,
                  const float *const *p_o, const float *const *qt_o, const int64_t *r_o,
                  float *const *p) {
    DISPATCH(project, layers, e, g, n, m, r, qt, p_o, qt_o, r_o, p);
}

/* Pass 2: qt[l] = P^T M (r x m) from the layer's M (mat[l]) and its orthogonalized P. */
void psgd_back(int64_t layers, const float *const *mat, const int64_t *n, const int64_t *m,
               const int64_t *r, const float *const *p, float *const *qt) {
    DISPATCH(back, layers, mat, n, m, r, p, qt);
}

/* Pass 3: out[l] = P Q^T, the value pass 1 takes off e at the next step (see settle). */
void psgd_expand(int64_t layers, float *const *out, const int64_t *n, const int64_t *m,
                 const int64_t *r, const float *const *p, const float *const *qt) {
    DISPATCH(expand, layers, out, n, m, r, p, qt);
#ifdef X86
    _mm_sfence();                                            /* streaming stores are visible */
#endif
}

/* What pass 1 owes, paid at once: e = e - P Q^T, with pass 1's float operations. */
void psgd_settle(float *e, int64_t n, int64_t m, int64_t r, const float *p, const float *qt) {
    for (int64_t i = 0; i < n; ++i) {
        float *ei = e + i * m;
#define SETTLE(j, whole) \
        store(ei, load(ei, j, m, whole) - low_rank(p + i * r, qt, r, j, m, whole), j, m, whole)
        FOR_LANES(m, SETTLE);
#undef SETTLE
    }
}
