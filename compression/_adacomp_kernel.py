"""AdaComp's CPU kernel: Algorithm 2 in one streaming pass per layer, in C (see _native).

The eager torch path (``AdaComp._select_eager``) makes about a dozen passes over a layer (add,
abs, amax, add, abs, ge, nonzero, index_select, index_add_, ...). Here::

    adacomp_compress    bin by bin (each bin is read from memory once, then again from cache):
                        G = residue + dW, g_max(i) = max |G| over the bin; H = G + dW, sent
                        where |H| >= g_max(i) > 0 and G != 0 (hard LS: the bin's first
                        argmax |G|), as signed indices (index + 1, negated when G < 0) written
                        straight into the message
    (torch)             s = g_max.mean(), so that s has the eager path's bits
    adacomp_decompress  out = sum_w sign v_w at every worker's received signed indices

The one thing a single pass cannot do is Alg. 2's residue = G - sign(G) s for the sent
elements: s is the mean over all of the layer's bins, known only at the end. So it is owed: the
pass stores G and sets the element's bit in a bitmap (``owed``, a byte per group of 8 elements
of a bin), and the next step's pass takes sign(G) s off as it reads the element, with the same
float operation the eager path does at once, so every later value has the same bits.
``adacomp_settle`` pays what is owed (before a checkpoint, a bin size change, or the eager
path).

On x86-64 CPUs with AVX2 the pass runs eight lanes at a time and packs the sent lanes' indices
with a permutation table (no branches); elsewhere a portable loop does the same. The decompress
builds each block of the output in L1 and streams it out. The results are bit-identical to the
eager path (tested): the same float operations, rounded alike and summed in the same order; the
max is exact (taken on the bit patterns of |G|, which order as the floats do).
"""

from __future__ import annotations

import ctypes

import torch

from compression._native import Library

# The message buffer needs this many int32 past a layer's last possible index, and the residue
# this many floats past its last bin: the AVX2 path loads and stores whole vectors of 8.
SLACK = 8

SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* Each bin [start, end) of n elements in bins of bin_size (the last may be shorter), and its
   number, bin. */
#define FOR_EACH_BIN(n, bin_size)                                                        \
    for (int64_t start = 0, bin = 0, end = 0;                                            \
         start < (n) && (end = (n) - start > (bin_size) ? start + (bin_size) : (n), 1);  \
         start += (bin_size), ++bin)
static inline uint32_t abs_bits(float x) { return bits(x) & 0x7fffffffu; }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86 1
#endif

/* The signed index (index + 1, negated when G < 0) and sign(G) s, without branches. */
static inline int32_t signed_index(int32_t k, float g) {
    int32_t neg = -(int32_t)(bits(g) >> 31);                 /* -1 if G < 0 (or -0: not sent) */
    return (k ^ neg) - neg;
}
static inline float with_sign_of(float s, float g) {
    uint32_t u = bits(s) ^ (bits(g) & 0x80000000u); memcpy(&s, &u, 4); return s;
}

/* The deferred update. For an element sent last step (its bit set in `owed`) the residue array
   still holds that step's G; its residue is G - G_q = G - sign(G) s_prev, taken when the element
   is next read: the float operation the eager path does at once, so the same bits. `owed` has a
   byte per group of 8 elements of a bin (bit l: the group's element l), ceil(bin_size / 8) bytes
   per bin, bin after bin: each group's bits are read and written as one byte. */
static inline float settled(float stored, uint32_t owe, float s_prev) {
    uint32_t q = bits(with_sign_of(s_prev, stored)) & -(owe & 1u);  /* G_q of last step, or +0 */
    float gq; memcpy(&gq, &q, 4);
    return stored - gq;                                      /* residue = G - G_q */
}
static inline int64_t groups(int64_t len) { return (len + 7) / 8; }

/* g_max bits over the group [j, j + len) (len <= 8), from m on; *first: the first argmax. */
static inline uint32_t group_max(const float *residue, const float *grad, uint32_t owe,
                                 float s_prev, int64_t j, int64_t len, uint32_t m,
                                 int64_t *first) {
    for (int64_t l = 0; l < len; ++l) {
        uint32_t a = abs_bits(settled(residue[j + l], owe >> l, s_prev) + grad[j + l]);  /* |G| */
        if (a > m) { m = a; *first = j + l; }                /* a NaN's bits are largest */
    }
    return m;
}

/* Alg. 2 on the group [j, j + len) of a bin whose g_max bits are m (sends = 0: a bin of zeros
   or NaN sends nothing; first >= 0: hard LS, only that element is sent): G = residue + dW,
   H = G + dW; sent iff |H| >= g_max(i) and G != 0. Stores G (its G_q is owed) and the sent
   elements' signed indices at out + *count; returns the group's sent bits. */
static inline uint32_t group_select(float *residue, const float *grad, uint32_t owe,
                                    float s_prev, int64_t j, int64_t len, uint32_t m, int sends,
                                    int64_t first, int32_t *out, int64_t *count) {
    uint32_t sent_bits = 0;
    for (int64_t l = 0; l < len; ++l) {
        float g = settled(residue[j + l], owe >> l, s_prev) + grad[j + l];  /* G = res. + dW */
        float h = g + grad[j + l];                           /* H = G + dW */
        uint32_t send = first >= 0 ? j + l == first
                                   : (abs_bits(h) >= m) & (abs_bits(g) != 0);  /* |H| >= g_max */
        send &= (uint32_t)sends;
        residue[j + l] = g;
        out[*count] = signed_index((int32_t)(j + l) + 1, g);  /* always written, kept if sent */
        *count += send;
        sent_bits |= send << l;
    }
    return sent_bits;
}

/* One bin [start, end), a group at a time; writes g_max, owed; returns how many were sent. */
static int64_t bin_scalar(float *residue, const float *grad, uint8_t *owed, float s_prev,
                          int64_t start, int64_t end, int soft, float *g_max, int32_t *out) {
    uint32_t m = 0;
    int64_t first = -1, count = 0;
    for (int64_t j = start, g = 0; j < end; j += 8, ++g)
        m = group_max(residue, grad, owed[g], s_prev, j, end - j < 8 ? end - j : 8, m, &first);
    memcpy(g_max, &m, 4);                                    /* g_max(i) = max |G| over bin */
    int sends = *g_max > 0.0f;
    for (int64_t j = start, g = 0; j < end; j += 8, ++g)
        owed[g] = (uint8_t)group_select(residue, grad, owed[g], s_prev, j,
                                        end - j < 8 ? end - j : 8, m, sends,
                                        soft ? -1 : first, out, &count);  /* hard LS: first */
    return count;
}

#ifdef X86
/* PACK[mask]: the lanes set in mask, first; a permutation that left-packs the sent lanes.
   LANES[mask]: lane l is all ones if bit l of mask is set, else 0. */
static int32_t PACK[256][8], LANES[256][8];
__attribute__((constructor)) static void init_tables(void) {
    for (int mask = 0; mask < 256; ++mask)
        for (int lane = 0, c = 0; lane < 8; ++lane) {
            if (mask >> lane & 1) PACK[mask][c++] = lane;
            LANES[mask][lane] = -(mask >> lane & 1);
        }
}

#define AVX2 __attribute__((target("avx2,popcnt")))
/* settled(), eight lanes: stored - (sign(stored) s_prev where owed, else +0). */
AVX2 static inline __m256 settled8(__m256 stored, uint32_t owe, __m256i s_prev) {
    const __m256i sign_mask = _mm256_set1_epi32((int32_t)0x80000000u);
    __m256i owes = _mm256_loadu_si256((const __m256i *)LANES[owe]);
    __m256i sign_s = _mm256_or_si256(s_prev, _mm256_and_si256(_mm256_castps_si256(stored),
                                                              sign_mask));
    return _mm256_sub_ps(stored, _mm256_castsi256_ps(_mm256_and_si256(owes, sign_s)));
}

/* The first len lanes (1 <= len <= 8) of a group: a load/store mask. */
AVX2 static inline __m256i first_lanes(int64_t len) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)len),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* bin_scalar, eight lanes at a time. The first sweep stores G (its G_q owed) and takes the
   max; the second reads G back from L1. The bin's last group may be short: its lanes past the
   bin load dW as 0 and keep their residue (the residue has room for 8 more elements). */
/* One group of the selection: the lanes in valid with |H| >= g_max(i) and G != 0 are sent;
   their signed indices (k: index + 1 per lane) go to out + *count; returns the sent bits. */
AVX2 static inline uint32_t select8(__m256 big_g, __m256 dw, __m256i valid, __m256i vm,
                                    __m256i k, int32_t *out, int64_t *count) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i gb = _mm256_castps_si256(big_g);
    __m256i abs_h = _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(big_g, dw)),
                                     abs_mask);                          /* |H| = |G + dW| */
    __m256i send = _mm256_andnot_si256(                      /* |H| >= g_max(i), G != 0 */
        _mm256_or_si256(_mm256_cmpgt_epi32(vm, abs_h),
                        _mm256_cmpeq_epi32(_mm256_and_si256(gb, abs_mask),
                                           _mm256_setzero_si256())), valid);
    uint32_t sent = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(send));
    __m256i neg = _mm256_srai_epi32(gb, 31);
    __m256i signed_k = _mm256_sub_epi32(_mm256_xor_si256(k, neg), neg);
    __m256i order = _mm256_loadu_si256((const __m256i *)PACK[sent]);
    _mm256_storeu_si256((__m256i *)(out + *count), _mm256_permutevar8x32_epi32(signed_k, order));
    *count += __builtin_popcount(sent);
    return sent;
}

/* bin_scalar, eight lanes at a time. The first sweep stores G (its G_q owed) and takes the
   max; the second reads G back from L1. The bin's last group may be short: its lanes past the
   bin load dW as 0 and keep their residue (the residue has room for 8 more elements). */
AVX2 static inline __attribute__((always_inline)) int64_t bin_avx2(
        float *residue, const float *grad, uint8_t *owed, __m256i sp, int64_t start,
        int64_t end, int soft, float *g_max, int32_t *out) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const int64_t last = groups(end - start) - 1;
    const __m256i tail = first_lanes(end - start - 8 * last);
    float *r = residue + start;
    const float *dw = grad + start;
    __m256i vmax = _mm256_setzero_si256();
    for (int64_t g = 0; g < last; ++g) {
        __m256 big_g = _mm256_add_ps(settled8(_mm256_loadu_ps(r + 8 * g), owed[g], sp),
                                     _mm256_loadu_ps(dw + 8 * g));
        _mm256_storeu_ps(r + 8 * g, big_g);                  /* G = residue + dW */
        vmax = _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_castps_si256(big_g), abs_mask));
    }
    __m256 stored = _mm256_loadu_ps(r + 8 * last);           /* lanes past the bin: G = 0 */
    __m256 dw_tail = _mm256_maskload_ps(dw + 8 * last, tail);
    __m256 g_tail = _mm256_and_ps(_mm256_add_ps(settled8(stored, owed[last], sp), dw_tail),
                                  _mm256_castsi256_ps(tail));
    _mm256_storeu_ps(r + 8 * last, _mm256_blendv_ps(stored, g_tail, _mm256_castsi256_ps(tail)));
    vmax = _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_castps_si256(g_tail), abs_mask));
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(vmax), _mm256_extracti128_si256(vmax, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
    uint32_t m = (uint32_t)_mm_cvtsi128_si32(m4);
    memcpy(g_max, &m, 4);                                    /* g_max(i) = max |G| over bin */
    if (!(*g_max > 0.0f) || !soft) {                         /* bin of zeros (or NaN): none */
        memset(owed, 0, (size_t)(last + 1));
        if (!(*g_max > 0.0f)) return 0;
        const __m256i vm = _mm256_broadcastd_epi32(m4);      /* hard LS: first argmax |G| */
        for (int64_t g = 0;; ++g) {
            __m256i abs_g = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(r + 8 * g)),
                                             abs_mask);
            uint32_t hit = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_cmpeq_epi32(abs_g, vm)));
            if (g == last) hit &= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(tail));
            if (hit) {
                int lane = __builtin_ctz(hit);
                owed[g] = (uint8_t)(1u << lane);
                out[0] = signed_index((int32_t)(start + 8 * g + lane) + 1, r[8 * g + lane]);
                return 1;
            }
        }
    }

    const __m256i vm = _mm256_broadcastd_epi32(m4), eight = _mm256_set1_epi32(8);
    const __m256i all = _mm256_set1_epi32(-1);
    __m256i k = _mm256_add_epi32(_mm256_set1_epi32((int32_t)start),   /* index + 1 */
                                 _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8));
    int64_t count = 0;
    for (int64_t g = 0; g < last; ++g, k = _mm256_add_epi32(k, eight))
        owed[g] = (uint8_t)select8(_mm256_loadu_ps(r + 8 * g), _mm256_loadu_ps(dw + 8 * g),
                                   all, vm, k, out, &count);
    owed[last] = (uint8_t)select8(g_tail, dw_tail, tail, vm, k, out, &count);
    return count;
}

/* adacomp_compress, with bin_avx2 for every bin. */
AVX2 static int64_t compress_avx2(float *residue, const float *grad, int64_t n,
                                  int64_t bin_size, int soft, uint8_t *owed, float s_prev,
                                  float *g_max, int32_t *out) {
    const __m256i sp = _mm256_set1_epi32((int32_t)bits(s_prev));
    int64_t count = 0;
    FOR_EACH_BIN(n, bin_size)
        count += bin_avx2(residue, grad, owed + bin * groups(bin_size), sp, start, end, soft,
                          g_max + bin, out + count);
    return count;
}
#endif

/* Alg. 2 in one pass per bin (the bin is read again from cache): g_max(i), then the selection.
   residue: stored values (see settled); owed: last step's sent bits, replaced by this step's;
   s_prev: last step's s. Writes each bin's g_max and the sent elements' signed indices (room
   for n + 8). Returns how many were sent. This step's residue is G - G_q with s = mean g_max,
   owed until the next call (or adacomp_settle). */
static int64_t compress_layer(float *residue, const float *grad, int64_t n, int64_t bin_size,
                              int soft, uint8_t *owed, float s_prev, float *g_max,
                              int32_t *out) {
#ifdef X86
    if (__builtin_cpu_supports("avx2"))
        return compress_avx2(residue, grad, n, bin_size, soft, owed, s_prev, g_max, out);
#endif
    int64_t count = 0;
    FOR_EACH_BIN(n, bin_size)
        count += bin_scalar(residue, grad, owed + bin * groups(bin_size), s_prev, start, end,
                            soft, g_max + bin, out + count);
    return count;
}

/* compress_layer for each of a bucket's layers: their signed indices one after the other in
   out, their bins' g_max one after the other in g_max; count[l]: how many layer l sent. */
void adacomp_compress(int64_t layers, float *const *residue, const float *const *grad,
                      const int64_t *n, const int64_t *bin_size, int soft, uint8_t *const *owed,
                      const float *s_prev, float *g_max, int32_t *out, int64_t *count) {
    for (int64_t l = 0; l < layers; ++l) {
        count[l] = compress_layer(residue[l], grad[l], n[l], bin_size[l], soft, owed[l],
                                  s_prev[l], g_max, out);
        out += count[l];
        g_max += (n[l] + bin_size[l] - 1) / bin_size[l];
    }
}

/* The bytes of owed for n elements in bins of bin_size. */
int64_t adacomp_owed_bytes(int64_t n, int64_t bin_size) {
    int64_t bins = (n + bin_size - 1) / bin_size;
    return bins == 0 ? 0 : (bins - 1) * groups(bin_size) + groups(n - (bins - 1) * bin_size);
}

/* Take the owed G_q off: residue = G - sign(G) s where owed; clears owed. */
void adacomp_settle(float *residue, int64_t n, int64_t bin_size, uint8_t *owed, float s) {
    FOR_EACH_BIN(n, bin_size) {
        uint8_t *bin_owed = owed + bin * groups(bin_size);
        for (int64_t j = start; j < end; ++j) {
            uint32_t owe = bin_owed[(j - start) / 8];
            residue[j] = settled(residue[j], owe >> ((j - start) % 8), s);
        }
        memset(bin_owed, 0, (size_t)groups(end - start));
    }
}

/* The signed index k's element (|k| - 1) and sign(k) v, without branches (signs are random). */
static inline int64_t element(int32_t k) { int32_t neg = k >> 31; return ((k ^ neg) - neg) - 1; }
static inline float signed_value(int32_t k, float v) {
    uint32_t u = bits(v) ^ ((uint32_t)k & 0x80000000u); memcpy(&v, &u, 4); return v;
}

/* Add sign(k) v at element (|k| - 1) - start of block (of len elements); returns 1 (and adds
   nothing out of place) if that is outside the block: a list that is not ascending. */
static inline int add_at(float *block, uint64_t start, uint64_t len, int32_t k, float v) {
    uint64_t at = (uint64_t)element(k) - start;
    int bad = at >= len;
    block[bad ? 0 : at] += bad ? 0.0f : signed_value(k, v);
    return bad;
}

#ifdef X86
/* add_at for the 8 entries r[0..7] (all < end): decoded eight lanes at a time. */
AVX2 static int add8_avx2(float *block, uint64_t start, uint64_t len, const int32_t *r,
                          float v) {
    __m256i k = _mm256_loadu_si256((const __m256i *)r);
    __m256i neg = _mm256_srai_epi32(k, 31);
    __m256i at = _mm256_sub_epi32(_mm256_sub_epi32(_mm256_xor_si256(k, neg), neg),
                                  _mm256_set1_epi32((int32_t)start + 1));  /* |k| - 1 - start */
    __m256i flip = _mm256_set1_epi32((int32_t)0x80000000u);       /* unsigned at >= len */
    __m256i last = _mm256_set1_epi32((int32_t)((uint32_t)(len - 1) ^ 0x80000000u));
    __m256i outside = _mm256_cmpgt_epi32(_mm256_xor_si256(at, flip), last);
    if (!_mm256_testz_si256(outside, outside)) return 1;
    __m256 value = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_set1_epi32((int32_t)bits(v)),
                                                        _mm256_and_si256(k, flip)));
    int32_t offsets[8];
    float values[8];
    _mm256_storeu_si256((__m256i *)offsets, at);
    _mm256_storeu_ps(values, value);
    for (int l = 0; l < 8; ++l) block[offsets[l]] += values[l];  /* sign(k) v */
    return 0;
}
#endif

/* The block [start, end) of out: the sum over workers of sign v[w] at their received signed
   indices, advancing each worker's cursor next[w] (each list is ascending). The block is built
   in block (in L1: zeros, then each worker's adds, in worker order, as index_add_ sums).
   Returns nonzero if a list is not ascending. */
static int decompress_block(float *block, uint64_t start, uint64_t end, int64_t world,
                            const int32_t *const *received, const int64_t *count,
                            const float *v, int64_t *next, int avx2) {
    uint64_t len = end - start;
    int bad = 0;
    memset(block, 0, len * sizeof(float));
    for (int64_t w = 0; w < world; ++w) {
        const int32_t *r = received[w];
        int64_t i = next[w], stop = count[w];
        float value = v[w];
        for (; i + 8 <= stop && (uint64_t)element(r[i + 7]) < end; i += 8) {  /* 8 in block */
#ifdef X86
            if (avx2) { bad |= add8_avx2(block, start, len, r + i, value); continue; }
#endif
            for (int l = 0; l < 8; ++l) bad |= add_at(block, start, len, r[i + l], value);
        }
        for (; i < stop && (uint64_t)element(r[i]) < end; ++i)
            bad |= add_at(block, start, len, r[i], value);
        next[w] = i;
    }
    return bad;
}

/* Copy a finished block to out; on x86 with streaming stores (out is only written: no read
   for ownership, no cache pollution). */
static void store_block(float *out, const float *block, int64_t len) {
#ifdef X86
    if (((uintptr_t)out & 15) == 0) {
        int64_t j = 0;
        for (; j + 4 <= len; j += 4) _mm_stream_ps(out + j, _mm_load_ps(block + j));
        memcpy(out + j, block + j, (size_t)(len - j) * sizeof(float));
        return;
    }
#endif
    memcpy(out, block, (size_t)len * sizeof(float));
}

/* out = sum_w sign v[w] at worker w's received signed indices (as zero_ then index_add_ of
   the workers' lists, in worker order), block by block so that out is written once. Returns 0,
   or -1 if an index is out of [1, n] or a list is not ascending (then out is partial). */
static int decompress_layer(float *out, int64_t n, int64_t world,
                            const int32_t *const *received, const int64_t *count,
                            const float *v, int64_t *next) {
    enum { BLOCK = 4096 };
    float block[BLOCK] __attribute__((aligned(16)));
    int bad = 0, avx2 = 0;
#ifdef X86
    avx2 = __builtin_cpu_supports("avx2");
#endif
    for (int64_t w = 0; w < world; ++w) next[w] = 0;
    /* Blocks aligned to out's 16-byte boundaries: the first one may be shorter. */
    int64_t head = (int64_t)((16 - ((uintptr_t)out & 15)) & 15) / (int64_t)sizeof(float);
    for (int64_t start = 0; start < n;) {
        int64_t len = start == 0 && head > 0 ? head : BLOCK;
        uint64_t end = (uint64_t)(n - start > len ? start + len : n);
        bad |= decompress_block(block, (uint64_t)start, end, world, received, count, v, next,
                                avx2);
        store_block(out + start, block, (int64_t)end - start);
        start = (int64_t)end;
    }
#ifdef X86
    _mm_sfence();                                          /* streaming stores are visible */
#endif
    for (int64_t w = 0; w < world; ++w) bad |= next[w] != count[w];
    return bad;
}

/* decompress_layer for each of a bucket's layers: layer l's list from worker w starts at
   message[w] + start[l world + w], has count[l world + w] entries, worth v[l world + w].
   Workspace: 2 world pointers and int64s. Returns 0, or -1 if a list is bad. */
int adacomp_decompress(int64_t layers, float *const *out, const int64_t *n, int64_t world,
                       const int32_t *const *message, const int64_t *start,
                       const int64_t *count, const float *v, const int32_t **received,
                       int64_t *next) {
    int bad = 0;
    for (int64_t l = 0; l < layers; ++l) {
        for (int64_t w = 0; w < world; ++w) received[w] = message[w] + start[l * world + w];
        bad |= decompress_layer(out[l], n[l], world, received, count + l * world,
                                v + l * world, next);
    }
    return bad ? -1 : 0;
}
"""

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
LIBRARY = Library("adacomp", SOURCE, {
    "adacomp_compress": ([_i64, _p, _p, _p, _p, ctypes.c_int, _p, _p, _p, _p, _p], None),
    "adacomp_owed_bytes": ([_i64, _i64], _i64),
    "adacomp_settle": ([_p, _i64, _i64, _p, ctypes.c_float], None),
    "adacomp_decompress": ([_i64, _p, _p, _i64, _p, _p, _p, _p, _p, _p], ctypes.c_int),
})


def kernel() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None (with one warning) if it cannot be."""
    return LIBRARY.get()


def pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
    """The tensors' data pointers, as a C array."""
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


def int64s(values: list[int] | torch.Tensor) -> torch.Tensor:
    """A contiguous int64 CPU tensor of ``values``."""
    return torch.as_tensor(values, dtype=torch.int64).contiguous()


def compress(lib: ctypes.CDLL, residues: list[torch.Tensor], grads: list[torch.Tensor],
             bin_sizes: list[int], soft: bool, owed: list[torch.Tensor], s_prev: torch.Tensor,
             g_max: torch.Tensor, out: torch.Tensor) -> list[int]:
    """One pass per bin over each layer (see the module docstring): the sent elements' signed
    indices go to ``out``, layer after layer, and the bins' g_max to ``g_max``, likewise.
    Returns how many each layer sent. ``s_prev``: each layer's s of the last step (float32)."""
    sizes, bins = int64s([g.numel() for g in grads]), int64s(bin_sizes)
    counts = torch.empty(len(grads), dtype=torch.int64)
    lib.adacomp_compress(len(grads), pointers(residues), pointers(grads), sizes.data_ptr(),
                         bins.data_ptr(), int(soft), pointers(owed), s_prev.data_ptr(),
                         g_max.data_ptr(), out.data_ptr(), counts.data_ptr())
    return counts.tolist()


def decompress(lib: ctypes.CDLL, outs: list[torch.Tensor], messages: list[torch.Tensor],
               starts: torch.Tensor, counts: torch.Tensor, values: torch.Tensor) -> None:
    """Each ``outs[l]`` = sum over workers w of sign(k) ``values[l, w]`` at each signed index k
    of the ``counts[l, w]`` ones from ``starts[l, w]`` of ``messages[w]`` (contiguous int32,
    ascending |k|)."""
    world = len(messages)
    sizes, starts, counts = int64s([o.numel() for o in outs]), int64s(starts), int64s(counts)
    values = values.to(torch.float32).contiguous()
    cursors = torch.empty(world, dtype=torch.int64)
    if lib.adacomp_decompress(len(outs), pointers(outs), sizes.data_ptr(), world,
                              pointers(messages), starts.data_ptr(), counts.data_ptr(),
                              values.data_ptr(), (ctypes.c_void_p * world)(),
                              cursors.data_ptr()):
        raise ValueError("AdaComp: a received index is out of range")
