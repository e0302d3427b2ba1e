/* AdaComp's CPU kernel: Algorithm 2 in one streaming pass per bin (compression/adacomp.py).
   The Python side is compression/_adacomp_kernel.py: its docstring describes the passes and
   the message layout, and it defines the constants below (-D), which this file checks. */
#include "prelude.h"

/* GROUP elements of a bin share a byte of the message's bits (and are one AVX2 vector). */
_Static_assert(GROUP == 8, "a group is the 8 bits of a byte");
/* The residue has SLACK floats of room past its last bin: the AVX2 path reads a bin's last
   group, which may be short, as a whole vector of 8. */
_Static_assert(SLACK >= 8, "the residue needs room for a vector of 8 past its last bin");

static inline uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline uint32_t abs_bits(float x) { return bits(x) & 0x7fffffffu; }
static inline float from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline int64_t groups(int64_t len) { return (len + 7) / 8; }
static inline int64_t count_bits(const uint8_t *bytes, int64_t n) {  /* set bits in n bytes */
    int64_t count = 0, j = 0;
    for (uint64_t word; j + 8 <= n; j += 8) {
        memcpy(&word, bytes + j, 8);
        count += __builtin_popcountll(word);
    }
    for (; j < n; ++j) count += __builtin_popcount(bytes[j]);
    return count;
}

/* Each bin [start, end) of n elements in bins of bin_size (the last may be shorter), and its
   number, bin. */
#define FOR_EACH_BIN(n, bin_size)                                                        \
    for (int64_t start = 0, bin = 0, end = 0;                                            \
         start < (n) && (end = (n) - start > (bin_size) ? start + (bin_size) : (n), 1);  \
         start += (bin_size), ++bin)


/* The deferred update. For an element sent last step (its bit set in owed) the residue array
   still holds that step's G; its residue is G - G_q = G - sign(G) s_prev, taken when the element
   is next read: the float operation the eager path does at once, so the same bits. */
static inline float settled(float stored, uint32_t owe, float s_prev) {
    uint32_t g_q = (bits(s_prev) | (bits(stored) & 0x80000000u)) & -(owe & 1u);  /* or +0 */
    return stored - from_bits(g_q);                          /* residue = G - G_q */
}

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
   H = G + dW; sent iff |H| >= g_max(i) and G != 0. Stores G (its G_q is owed); returns the
   group's sent bits, and its sign bits (of the sent elements) in *sign. */
static inline uint32_t group_select(float *residue, const float *grad, uint32_t owe,
                                    float s_prev, int64_t j, int64_t len, uint32_t m, int sends,
                                    int64_t first, uint32_t *sign) {
    uint32_t sent = 0;
    *sign = 0;
    for (int64_t l = 0; l < len; ++l) {
        float g = settled(residue[j + l], owe >> l, s_prev) + grad[j + l];  /* G = res. + dW */
        float h = g + grad[j + l];                           /* H = G + dW */
        uint32_t send = first >= 0 ? j + l == first
                                   : (abs_bits(h) >= m) & (abs_bits(g) != 0);  /* |H| >= g_max */
        send &= (uint32_t)sends;
        residue[j + l] = g;
        sent |= send << l;
        *sign |= (send & bits(g) >> 31) << l;                /* sign(G) of what is sent */
    }
    return sent;
}

/* One bin [start, end), a group at a time: g_max, then the selection into sent and sign (the
   bin's bytes; owed, last step's, is only read). */
static void bin_scalar(float *residue, const float *grad, const uint8_t *owed, float s_prev,
                          int64_t start, int64_t end, int soft, float *g_max, uint8_t *sent,
                          uint8_t *sign) {
    uint32_t m = 0;
    int64_t first = -1;
    for (int64_t j = start, g = 0; j < end; j += 8, ++g)
        m = group_max(residue, grad, owed[g], s_prev, j, end - j < 8 ? end - j : 8, m, &first);
    memcpy(g_max, &m, 4);                                    /* g_max(i) = max |G| over bin */
    int sends = *g_max > 0.0f;
    for (int64_t j = start, g = 0; j < end; j += 8, ++g) {
        uint32_t negative;
        uint32_t bits_sent = group_select(residue, grad, owed[g], s_prev, j,
                                          end - j < 8 ? end - j : 8, m, sends,
                                          soft ? -1 : first, &negative);  /* hard LS: first */
        sent[g] = (uint8_t)bits_sent;
        sign[g] = (uint8_t)negative;
    }
}

#ifdef X86
/* LANES[mask]: lane l is all ones if bit l of mask is set, else 0. */
static int32_t LANES[256][8];
__attribute__((constructor)) static void init_lanes(void) {
    for (int mask = 0; mask < 256; ++mask)
        for (int lane = 0; lane < 8; ++lane) LANES[mask][lane] = -(mask >> lane & 1);
}

#define AVX2 __attribute__((target("avx2,popcnt")))
AVX2 static inline __m256i lanes_of(uint32_t mask) {
    return _mm256_loadu_si256((const __m256i *)LANES[mask]);
}
/* settled(), eight lanes: stored - (sign(stored) s_prev where owed, else +0). */
AVX2 static inline __m256 settled8(__m256 stored, uint32_t owe, __m256i s_prev) {
    const __m256i sign_mask = _mm256_set1_epi32((int32_t)0x80000000u);
    __m256i sign_s = _mm256_or_si256(s_prev, _mm256_and_si256(_mm256_castps_si256(stored),
                                                              sign_mask));
    return _mm256_sub_ps(stored, _mm256_castsi256_ps(_mm256_and_si256(lanes_of(owe), sign_s)));
}

/* The first len lanes (1 <= len <= 8) of a group: a load/store mask. */
AVX2 static inline __m256i first_lanes(int64_t len) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)len),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Store the first len lanes (1 <= len <= 8) of x: no wider, so that the next bin's loads of
   its first elements are not held up behind a store that overlaps them. */
AVX2 static inline void store_first(float *p, __m256 x, int64_t len) {
    __m128 part = _mm256_castps256_ps128(x);
    if (len == 8) {
        _mm256_storeu_ps(p, x);
        return;
    }
    if (len >= 4) {
        _mm_storeu_ps(p, part);
        p += 4, len -= 4, part = _mm256_extractf128_ps(x, 1);
    }
    if (len >= 2) {
        _mm_storel_pi((__m64 *)p, part);
        p += 2, len -= 2, part = _mm_movehl_ps(part, part);
    }
    if (len) _mm_store_ss(p, part);
}

/* One group of the selection: the lanes in valid with |H| >= g_max(i) and G != 0 are sent;
   returns their bits, and the bits of those with G < 0 in *sign. */
AVX2 static inline uint32_t select8(__m256 big_g, __m256 dw, __m256i valid, __m256i vm,
                                    uint32_t *sign) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i gb = _mm256_castps_si256(big_g);
    __m256i abs_h = _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(big_g, dw)),
                                     abs_mask);                          /* |H| = |G + dW| */
    __m256i send = _mm256_andnot_si256(                      /* |H| >= g_max(i), G != 0 */
        _mm256_or_si256(_mm256_cmpgt_epi32(vm, abs_h),
                        _mm256_cmpeq_epi32(_mm256_and_si256(gb, abs_mask),
                                           _mm256_setzero_si256())), valid);
    uint32_t sent = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(send));
    *sign = (uint32_t)_mm256_movemask_ps(big_g) & sent;
    return sent;
}

/* The first sweep's step for a whole group: G = residue + dW, stored (its G_q owed); returns
   the running max of |G| (bit patterns). */
AVX2 static inline __m256i sweep8(float *r, const float *dw, uint32_t owe, __m256i sp,
                                  __m256i vmax) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256 big_g = _mm256_add_ps(settled8(_mm256_loadu_ps(r), owe, sp), _mm256_loadu_ps(dw));
    _mm256_storeu_ps(r, big_g);                              /* G = residue + dW */
    return _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_castps_si256(big_g), abs_mask));
}

/* sweep8 for a bin's last group, which may be short (tail: its len lanes in the bin): lanes
   past the bin take dW as 0 (read as 0 past the layer's end: inner = 0), give G = 0 and keep
   their residue (the residue has room for 8 more elements). Returns G; dW in *dw_tail. */
AVX2 static inline __m256 sweep_tail(float *r, const float *dw, uint32_t owe, __m256i sp,
                                     __m256i tail, int64_t len, int inner, __m256 *dw_tail) {
    *dw_tail = inner ? _mm256_and_ps(_mm256_loadu_ps(dw), _mm256_castsi256_ps(tail))
                     : _mm256_maskload_ps(dw, tail);
    __m256 g_tail = _mm256_and_ps(_mm256_add_ps(settled8(_mm256_loadu_ps(r), owe, sp), *dw_tail),
                                  _mm256_castsi256_ps(tail));
    store_first(r, g_tail, len);
    return g_tail;
}

/* g_max(i) = max |G| over the bin, from the lanes' maxima, in every lane (bit patterns). */
AVX2 static inline __m256i bin_max(__m256i vmax, __m256 g_tail) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    vmax = _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_castps_si256(g_tail), abs_mask));
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(vmax), _mm256_extracti128_si256(vmax, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
    return _mm256_broadcastd_epi32(m4);
}

/* bin_scalar, eight lanes at a time (hard LS, and a soft bin that soft_bins leaves): the first
   sweep stores G and takes the max; the second reads G back from L1. */
AVX2 static inline __attribute__((always_inline)) void bin_avx2(
        float *residue, const float *grad, const uint8_t *owed, __m256i sp, int64_t start,
        int64_t end, int soft, float *g_max, uint8_t *sent, uint8_t *sign, __m256i tail,
        int inner) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const int64_t last = groups(end - start) - 1;
    float *r = residue + start;
    const float *dw = grad + start;
    __m256i vmax = _mm256_setzero_si256();
    for (int64_t g = 0; g < last; ++g) vmax = sweep8(r + 8 * g, dw + 8 * g, owed[g], sp, vmax);
    __m256 dw_tail, g_tail = sweep_tail(r + 8 * last, dw + 8 * last, owed[last], sp, tail,
                                        end - start - 8 * last, inner, &dw_tail);
    const __m256i vm = bin_max(vmax, g_tail);
    _mm_store_ss(g_max, _mm256_castps256_ps128(_mm256_castsi256_ps(vm)));  /* g_max(i) */
    if (!(*g_max > 0.0f) || !soft) {                         /* bin of zeros (or NaN): none */
        memset(sent, 0, (size_t)(last + 1));
        memset(sign, 0, (size_t)(last + 1));
        if (!(*g_max > 0.0f)) return;
        for (int64_t g = 0;; ++g) {                          /* hard LS: first argmax |G| */
            __m256i abs_g = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(r + 8 * g)),
                                             abs_mask);
            uint32_t hit = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_cmpeq_epi32(abs_g, vm)));
            if (g == last) hit &= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(tail));
            if (hit) {
                int lane = __builtin_ctz(hit);
                sent[g] = (uint8_t)(1u << lane);
                sign[g] = (uint8_t)((bits(r[8 * g + lane]) >> 31) << lane);
                return;
            }
        }
    }
    const __m256i all = _mm256_set1_epi32(-1);
    uint32_t negative;
    for (int64_t g = 0; g < last; ++g) {
        sent[g] = (uint8_t)select8(_mm256_loadu_ps(r + 8 * g), _mm256_loadu_ps(dw + 8 * g), all,
                                   vm, &negative);
        sign[g] = (uint8_t)negative;
    }
    sent[last] = (uint8_t)select8(g_tail, dw_tail, tail, vm, &negative);
    sign[last] = (uint8_t)negative;
}

/* bin_avx2 with the soft threshold for the layer's whole bins, software-pipelined: bin b's
   first sweep (from memory) goes a group at a time alongside bin b - 1's selection (from
   cache), which a short bin would otherwise keep apart. Bins of PIPELINED_BIN elements or more
   go to bin_avx2 instead: two bins of those no longer sit in L1 together, and two streams from
   L2 beside the one from memory were measured slower (make bench-kernels PASSES=adacomp).
   Returns how many bins it did. */
enum { PIPELINED_BIN = 256 };
AVX2 static int64_t soft_bins(float *residue, const float *grad, int64_t n, int64_t bin_size,
                              const uint8_t *owed, __m256i sp, float *g_max, uint8_t *sent,
                              uint8_t *sign) {
    const int64_t per_bin = groups(bin_size), last = per_bin - 1, whole = n / bin_size;
    const int64_t tail_len = bin_size - 8 * last;
    const __m256i tail = first_lanes(tail_len), all = _mm256_set1_epi32(-1);
    __m256i vm = all;                                        /* the pending bin's g_max */
    __m256 g_tail = _mm256_setzero_ps(), dw_tail = g_tail;
    int pending = 0;                                         /* bin b - 1 awaits selection */
    uint32_t negative;
    for (int64_t b = 0; b <= whole; ++b) {
        float *r = residue + b * bin_size, *r_prev = r - bin_size;
        const float *dw = grad + b * bin_size, *dw_prev = dw - bin_size;
        uint8_t *sent_prev = sent + (b - 1) * per_bin, *sign_prev = sign + (b - 1) * per_bin;
        __m256i vmax = _mm256_setzero_si256();
        for (int64_t g = 0; g < last; ++g) {
            if (b < whole) vmax = sweep8(r + 8 * g, dw + 8 * g, owed[b * per_bin + g], sp, vmax);
            if (pending) {
                sent_prev[g] = (uint8_t)select8(_mm256_loadu_ps(r_prev + 8 * g),
                                                _mm256_loadu_ps(dw_prev + 8 * g), all, vm,
                                                &negative);
                sign_prev[g] = (uint8_t)negative;
            }
        }
        if (pending) {
            sent_prev[last] = (uint8_t)select8(g_tail, dw_tail, tail, vm, &negative);
            sign_prev[last] = (uint8_t)negative;
        }
        if (b == whole) break;
        g_tail = sweep_tail(r + 8 * last, dw + 8 * last, owed[b * per_bin + last], sp, tail,
                            tail_len, b * bin_size + 8 * per_bin <= n, &dw_tail);
        vm = bin_max(vmax, g_tail);
        _mm_store_ss(g_max + b, _mm256_castps256_ps128(_mm256_castsi256_ps(vm)));
        pending = g_max[b] > 0.0f;
        if (!pending) {                                      /* bin of zeros (or NaN): none */
            memset(sent + b * per_bin, 0, (size_t)per_bin);
            memset(sign + b * per_bin, 0, (size_t)per_bin);
        }
    }
    return whole;
}

/* compress_layer with soft_bins and bin_avx2 (and the count with the popcnt instruction). */
AVX2 static int64_t compress_avx2(float *residue, const float *grad, int64_t n,
                                  int64_t bin_size, int soft, const uint8_t *owed, float s_prev,
                                  float *g_max, uint8_t *sent, uint8_t *sign, int64_t size) {
    const __m256i sp = _mm256_set1_epi32((int32_t)bits(s_prev));
    const int64_t per_bin = groups(bin_size), short_bin = n % bin_size;
    const __m256i tail = first_lanes(bin_size - 8 * (per_bin - 1));  /* of a whole bin */
    const int64_t done = soft && bin_size < PIPELINED_BIN
        ? soft_bins(residue, grad, n, bin_size, owed, sp, g_max, sent, sign) : 0;
    FOR_EACH_BIN(n, bin_size)
        if (bin >= done)
            bin_avx2(residue, grad, owed + bin * per_bin, sp, start, end, soft, g_max + bin,
                     sent + bin * per_bin, sign + bin * per_bin,
                     end - start == bin_size ? tail
                         : first_lanes(short_bin - 8 * (groups(short_bin) - 1)),
                     start + 8 * groups(end - start) <= n);
    return count_bits(sent, size);
}
#endif

/* The mean of x[0 .. len): a pairwise sum, level by level (x[i] = x[2i] + x[2i + 1], an odd
   last one plus +0), over len; x is overwritten. adacomp.pairwise_mean is the same in torch. */
static float pairwise_mean(float *x, int64_t len) {
    for (int64_t m = len; m > 1; m = (m + 1) / 2) {
        for (int64_t i = 0; i < m / 2; ++i) x[i] = x[2 * i] + x[2 * i + 1];
        if (m % 2) x[m / 2] = x[m - 1] + 0.0f;
    }
    return (len ? x[0] : 0.0f) / (float)len;
}

/* Alg. 2 in one pass per bin (the bin is read again from cache): g_max(i), then the selection.
   residue: stored values (see settled); owed: last step's sent bits, then this step's;
   *scale: last step's s, then this step's, s = mean_i g_max(i). Writes the message's sent and
   sign bytes (size of each); g_max: room for a g_max per bin. Returns how many were sent. This
   step's residue is G - G_q, owed until the next call (or adacomp_settle). */
static int64_t compress_layer(float *residue, const float *grad, int64_t n, int64_t bin_size,
                              int soft, uint8_t *owed, float *scale, float *g_max,
                              uint8_t *sent, uint8_t *sign, int64_t size) {
    const float s_prev = *scale;
    int64_t count;
#ifdef X86
    if (use_avx2())
        count = compress_avx2(residue, grad, n, bin_size, soft, owed, s_prev, g_max, sent, sign,
                              size);
    else
#endif
    {
        FOR_EACH_BIN(n, bin_size)
            bin_scalar(residue, grad, owed + bin * groups(bin_size), s_prev, start, end, soft,
                       g_max + bin, sent + bin * groups(bin_size), sign + bin * groups(bin_size));
        count = count_bits(sent, size);
    }
    memcpy(owed, sent, (size_t)size);                        /* this step's sent bits: owed */
    *scale = pairwise_mean(g_max, (n + bin_size - 1) / bin_size);  /* s = mean_i g_max(i) */
    return count;
}

/* compress_layer for each of a bucket's layers: the message starts with each layer's s
   (float32; also in *scale[l]), then layer l's sent bytes at message + offset[l], its sign
   bytes right after them (size[l] bytes each); count[l]: how many layer l sent. g_max: room
   for the g_max of the largest layer's bins. */
void adacomp_compress(int64_t layers, float *const *residue, const float *const *grad,
                      const int64_t *n, const int64_t *bin_size, int soft, uint8_t *const *owed,
                      float *const *scale, float *g_max, uint8_t *message,
                      const int64_t *offset, const int64_t *size, int64_t *count) {
    for (int64_t l = 0; l < layers; ++l) {
        uint8_t *sent = message + offset[l];
        count[l] = compress_layer(residue[l], grad[l], n[l], bin_size[l], soft, owed[l],
                                  scale[l], g_max, sent, sent + size[l], size[l]);
        memcpy(message + 4 * l, scale[l], 4);
    }
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

/* A bin's part of len elements (its groups' sent bytes from bytes, their sign bytes size bytes
   on: bit l of a group's bytes is its element l): to[j] += sign v where element j was sent (sign
   flipped where G < 0), else +0; first: to holds nothing yet (from +0). A short last group may
   spill +0 into the next bin's place, which is written next. Over the workers in order this is
   zero_ then index_add_ of their lists: adding +0 elsewhere changes nothing (a sum is never -0).
   add_groups_scalar, add_groups (AVX2) and add_groups512 (AVX-512) do it. */
typedef void groups_fn(float *to, const uint8_t *bytes, int64_t size, int64_t len, float v,
                       int first);
static inline void add_groups_scalar(float *to, const uint8_t *bytes, int64_t size,
                                     int64_t len, float v, int first) {
    for (int64_t g = 0; g < groups(len); ++g)
        for (int l = 0; l < 8; ++l) {
            uint32_t send = bytes[g] >> l & 1u, negative = bytes[size + g] >> l & 1u;
            float g_q = from_bits((bits(v) ^ negative << 31) & -send);  /* sign s_w/W */
            to[8 * g + l] = (first ? 0.0f : to[8 * g + l]) + g_q;
        }
}

/* The elements [start, stop) of a layer in bins of bin_size (per_bin groups each, from bin
   start / bin_size; start is a bin's start, or a group's in a bin longer than a piece), added
   to to[element - start] a bin's part at a time by add (inlined); the whole bins in a loop of
   their own, with first a constant in each inlined copy. */
static inline __attribute__((always_inline)) void add_bins(
        float *to, int64_t start, int64_t stop, int64_t bin_size, int64_t per_bin,
        const uint8_t *sent, int64_t size, float v, int first, groups_fn *add) {
    int64_t bin = start / bin_size, offset = start - bin * bin_size;
    const uint8_t *bytes = sent + bin * per_bin + offset / 8;
    if (offset == 0) {                                       /* whole bins */
        const int64_t whole = (stop - start) / bin_size;
        for (int64_t b = 0; b < whole; ++b, to += bin_size, bytes += per_bin)
            if (first)
                add(to, bytes, size, bin_size, v, 1);
            else
                add(to, bytes, size, bin_size, v, 0);
        start += whole * bin_size, bin += whole;
    }
    for (int64_t len = bin_size - offset; start < stop; start += len, len = bin_size) {
        len = len < stop - start ? len : stop - start;       /* this bin's part */
        add(to, bytes, size, len, v, first);
        to += len;
        bytes = sent + ++bin * per_bin;
    }
}

/* out (n elements in bins of bin_size) = sum over workers of sign v[w] where worker w sent:
   its sent bytes at sent[w], its sign bytes size bytes after. Built in an L1 block, a piece
   (whole bins, or part of a long bin) at a time, and streamed out; 16 floats of room past
   the block for add_groups512's spill. */
static inline __attribute__((always_inline)) void decompress_layer(
        float *out, int64_t n, int64_t bin_size, int64_t world, const uint8_t *const *sent,
        int64_t size, const float *v, groups_fn *add, store_fn *store) {
    enum { BLOCK = 4096, PIECE = 2048 };
    float block[BLOCK + 16];
    int64_t per_bin = groups(bin_size), begin = 0;           /* out[begin] is block[0] */
    int64_t step = bin_size <= PIECE ? PIECE / bin_size * bin_size : PIECE;
    for (int64_t start = 0; start < n;) {
        int64_t stop = start + step;                         /* whole bins, or whole groups */
        if (bin_size > PIECE && stop > (start / bin_size + 1) * bin_size)
            stop = (start / bin_size + 1) * bin_size;        /* a long bin's last piece */
        stop = stop < n ? stop : n;
        if (stop - begin > BLOCK) {                          /* no room: flush the block */
            store(out + begin, block, start - begin);
            begin = start;
        }
        for (int64_t w = 0; w < world; ++w)
            add_bins(block + (start - begin), start, stop, bin_size, per_bin, sent[w], size,
                     v[w], w == 0, add);
        start = stop;
    }
    store(out + begin, block, n - begin);
}
static void decompress_scalar(float *out, int64_t n, int64_t bin_size, int64_t world,
                              const uint8_t *const *sent, int64_t size, const float *v) {
    decompress_layer(out, n, bin_size, world, sent, size, v, add_groups_scalar, copy_floats);
}

#ifdef X86
/* add_groups' step for one group, eight lanes: sign v (value) where sent, or +0; of a group of
   len < 8 (a bin's short last one) only its len lanes are stored, so that the next bin's load of
   its first group does not wait on a store that overlaps it. */
AVX2 static inline __attribute__((always_inline)) void add_group(
        float *to, uint8_t sent, uint8_t negative, __m256i value, __m256i sign_mask, int first,
        int64_t len) {
    __m256i signed_v = _mm256_xor_si256(value, _mm256_and_si256(lanes_of(negative), sign_mask));
    __m256 g_q = _mm256_castsi256_ps(_mm256_and_si256(lanes_of(sent), signed_v));
    store_first(to, first ? g_q : _mm256_add_ps(_mm256_loadu_ps(to), g_q), len);
}
/* add_group over len elements from to (bytes: their groups' sent bytes, the sign bytes size
   bytes on): the whole groups, then a short last one's own lanes. */
AVX2 static inline __attribute__((always_inline)) void add_groups(
        float *to, const uint8_t *bytes, int64_t size, int64_t len, float v, int first) {
    const __m256i sign_mask = _mm256_set1_epi32(bits(v) ? (int32_t)0x80000000u : 0);
    const __m256i value = _mm256_set1_epi32((int32_t)bits(v));
    const int64_t full = len / 8;
    for (int64_t g = 0; g < full; ++g)
        add_group(to + 8 * g, bytes[g], bytes[size + g], value, sign_mask, first, 8);
    if (len % 8)
        add_group(to + 8 * full, bytes[full], bytes[size + full], value, sign_mask, first,
                  len % 8);
}
AVX2 static void decompress_avx2(float *out, int64_t n, int64_t bin_size, int64_t world,
                                 const uint8_t *const *sent, int64_t size, const float *v) {
    decompress_layer(out, n, bin_size, world, sent, size, v, add_groups, stream_floats);
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,popcnt")))
/* The mask of the 16 elements of the two groups whose bytes start at bytes (lane l is bit l of
   bytes[0] and bytes[1], read as one little-endian 16-bit word), or of their first len < 16
   elements (bytes[1] read only where len > 8). */
static inline __mmask16 pair_bits(const uint8_t *bytes, int64_t len) {
    uint16_t word = bytes[0];
    if (len > 8) word |= (uint16_t)(bytes[1] << 8);
    return (__mmask16)word;
}
/* add_groups in sixteen lanes: two groups' bytes are one mask register each (sent, and
   negative), so no lane table; the same values, so the same bits. */
AVX512 static inline __attribute__((always_inline)) void add_lanes(
        float *to, __mmask16 sent, __mmask16 negative, __m512i value, __m512i sign_mask,
        int first) {
    __m512 g_q = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(     /* sign v where sent, or +0 */
        sent, _mm512_mask_xor_epi32(value, negative, value, sign_mask)));
    _mm512_storeu_ps(to, first ? g_q : _mm512_add_ps(_mm512_loadu_ps(to), g_q));
}
/* add_lanes over len elements from to, 16 at a time; a bin's last 1 to 15 of them: for the
   first worker a whole vector whose lanes past the bin spill +0 into the next bin's place, which
   is written next (the block has room for it past its end); for the others add_groups, whose
   stores are no wider than the bin (a masked store over the next bin's first lanes would hold up
   their loads). */
AVX512 static inline __attribute__((always_inline)) void add_groups512(
        float *to, const uint8_t *bytes, int64_t size, int64_t len, float v, int first) {
    const __m512i sign_mask = _mm512_set1_epi32(bits(v) ? (int32_t)0x80000000u : 0);
    const __m512i value = _mm512_set1_epi32((int32_t)bits(v));
    int64_t j = 0;
    for (; j + 16 <= len; j += 16, bytes += 2) {
        uint16_t s, negative;
        memcpy(&s, bytes, 2);
        memcpy(&negative, bytes + size, 2);
        add_lanes(to + j, s, negative, value, sign_mask, first);
    }
    if (j < len && first)
        add_lanes(to + j, pair_bits(bytes, len - j), pair_bits(bytes + size, len - j), value,
                  sign_mask, 1);
    else if (j < len)
        add_groups(to + j, bytes, size, len - j, v, 0);
}
AVX512 static void decompress_avx512(float *out, int64_t n, int64_t bin_size, int64_t world,
                                     const uint8_t *const *sent, int64_t size, const float *v) {
    decompress_layer(out, n, bin_size, world, sent, size, v, add_groups512, stream_floats);
}
#endif

/* decompress_layer for each of a bucket's layers: worker w's message is at
   message + w * stride; its l-th float32 word is layer l's s_w, worth s_w / W (as the eager
   path divides); layer l's sent bytes at offset[l] in it (size[l] of them, its sign bytes
   after). Workspace: world pointers and world floats. */
void adacomp_decompress(int64_t layers, float *const *out, const int64_t *n,
                        const int64_t *bin_size, int64_t world, const uint8_t *message,
                        int64_t stride, const int64_t *offset, const int64_t *size,
                        const uint8_t **sent, float *v) {
    void (*layer_fn)(float *, int64_t, int64_t, int64_t, const uint8_t *const *, int64_t,
                     const float *) = decompress_scalar;
#ifdef X86
    if (use_avx2()) layer_fn = use_avx512() ? decompress_avx512 : decompress_avx2;
#endif
    for (int64_t l = 0; l < layers; ++l) {
        for (int64_t w = 0; w < world; ++w) {
            float s_w;
            memcpy(&s_w, message + w * stride + 4 * l, 4);
            v[w] = s_w / (float)world;                       /* s_w / W */
            sent[w] = message + w * stride + offset[l];
        }
        layer_fn(out[l], n[l], bin_size[l], world, sent, size[l], v);
    }
#ifdef X86
    _mm_sfence();                                            /* streaming stores are visible */
#endif
}
