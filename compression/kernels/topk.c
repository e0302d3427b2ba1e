/* Top-K's CPU kernel: error feedback, exact radix selection and the message (compression/
   topk.py). The Python side is compression/_topk_kernel.py: its docstring describes the passes,
   and it defines HIGH_BITS and LOW_BITS (-D), from which it sizes the histograms' workspace. */
#include "prelude.h"

_Static_assert(HIGH_BITS + LOW_BITS == 31, "the two histograms split the 31 bits of |acc|");
#define HIGH (1 << HIGH_BITS)     /* buckets of the top HIGH_BITS bits of |acc| */
#define LOW (1 << LOW_BITS)       /* buckets of the low LOW_BITS bits, within one high bucket */

static inline int32_t key(float x) {  /* |x| as ordered bits: exponent, then mantissa */
    uint32_t u; memcpy(&u, &x, 4); return (int32_t)(u & 0x7fffffffu);
}


/* Pass 1: acc = g + e, stored in e; high[key(acc) >> LOW_BITS] counts. */
static void accumulate(float *error, const float *grad, int64_t n, int32_t *high) {
    memset(high, 0, HIGH * sizeof(int32_t));
    for (int64_t i = 0; i < n; ++i) {
        float acc = error[i] + grad[i];                      /* acc = g + e */
        error[i] = acc;
        ++high[key(acc) >> LOW_BITS];
    }
}

/* Pass 2: low[key & (LOW - 1)] counts over the entries whose key >> LOW_BITS is bucket. */
static void refine_scalar(const float *acc, int64_t j, int64_t n, int32_t bucket, int32_t *low) {
    for (; j < n; ++j) {
        int32_t u = key(acc[j]);
        if (u >> LOW_BITS == bucket) ++low[u & (LOW - 1)];
    }
}

#ifdef X86
__attribute__((target("avx2")))
static void refine_avx2(const float *acc, int64_t n, int32_t bucket, int32_t *low) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), vb = _mm256_set1_epi32(bucket);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256i u = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(acc + j)), abs_mask);
        __m256i in = _mm256_cmpeq_epi32(_mm256_srli_epi32(u, LOW_BITS), vb);
        if (!_mm256_testz_si256(in, in)) refine_scalar(acc, j, j + 8, bucket, low);
    }
    refine_scalar(acc, j, n, bucket, low);
}
#endif

/* Pass 3, from entry j: keep the entries with key > t, and the first `*ties` with key == t,
   until `*count` reaches k; a kept entry's value and index go to values/index[*count], and
   e = 0 there. Writes nothing past values/index[k - 1]. */
static int64_t emit_scalar(float *acc, int64_t j, int64_t n, int32_t t, int64_t *ties,
                           int64_t k, float *values, int32_t *index, int64_t count) {
    for (; j < n && count < k; ++j) {
        int32_t u = key(acc[j]);
        int keep = u > t || (u == t && *ties > 0);
        *ties -= u == t && keep;
        if (keep) {
            values[count] = acc[j];                          /* message: acc[S], S */
            index[count++] = (int32_t)j;
            acc[j] = 0.0f;                                   /* e = acc - sparse_own */
        }
    }
    return count;
}

#ifdef X86
static int32_t PACK[256][8];  /* PACK[mask]: the lanes set in mask, first */
__attribute__((constructor)) static void init_pack(void) {
    for (int mask = 0; mask < 256; ++mask)
        for (int lane = 0, c = 0; lane < 8; ++lane)
            if (mask >> lane & 1) PACK[mask][c++] = lane;
}

/* emit_scalar, eight lanes at a time while whole vectors fit below k; the rest scalar. */
__attribute__((target("avx2,popcnt")))
static int64_t emit_avx2(float *acc, int64_t n, int32_t t, int64_t *ties, int64_t k,
                         float *values, int32_t *index) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), vt = _mm256_set1_epi32(t);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);  /* lane i: bit i */
    int64_t j = 0, count = 0;
    for (; j + 8 <= n && count + 8 <= k; j += 8) {
        __m256 a = _mm256_loadu_ps(acc + j);
        __m256i u = _mm256_and_si256(_mm256_castps_si256(a), abs_mask);
        int kept = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(u, vt)));
        int tied = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(u, vt)));
        for (; tied && *ties > 0; tied &= tied - 1, --*ties)  /* the first ties, in order */
            kept |= tied & -tied;
        if (!kept) continue;
        __m256i order = _mm256_loadu_si256((const __m256i *)PACK[kept]);
        __m256i j8 = _mm256_add_epi32(_mm256_set1_epi32((int32_t)j), lanes);
        _mm256_storeu_ps(values + count, _mm256_permutevar8x32_ps(a, order));
        _mm256_storeu_si256((__m256i *)(index + count), _mm256_permutevar8x32_epi32(j8, order));
        __m256i mask = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(kept), bit), bit);
        _mm256_storeu_ps(acc + j, _mm256_andnot_ps(_mm256_castsi256_ps(mask), a));  /* e = 0 */
        count += __builtin_popcount(kept);
    }
    return emit_scalar(acc, j, n, t, ties, k, values, index, count);
}
#endif

/* Top-K of one layer: acc = g + e; the k largest |acc| (ties: the first) to values/index in
   index order; e = acc there, 0 at them. workspace: HIGH + LOW int32. */
void topk_compress(float *error, const float *grad, int64_t n, int64_t k, float *values,
                   int32_t *index, int32_t *workspace) {
#ifdef X86
    int avx2 = use_avx2();
#endif
    int32_t *high = workspace, *low = workspace + HIGH;
    accumulate(error, grad, n, high);
    int32_t bucket = HIGH - 1;
    int64_t above = 0;                                      /* entries in higher buckets */
    while (above + high[bucket] < k) above += high[bucket--];
    int32_t t = (bucket << LOW_BITS) - 1;                   /* the whole bucket kept: > t */
    int64_t ties = 0;
    if (above + high[bucket] > k) {                         /* T: the k-th largest key */
        memset(low, 0, LOW * sizeof(int32_t));
#ifdef X86
        if (avx2) refine_avx2(error, n, bucket, low);
        else
#endif
        refine_scalar(error, 0, n, bucket, low);
        int32_t r = LOW - 1;
        while (above + low[r] < k) above += low[r--];
        t = bucket << LOW_BITS | r;
        ties = k - above;                                   /* of the low[r] equal to T */
    }
#ifdef X86
    if (avx2) { emit_avx2(error, n, t, &ties, k, values, index); return; }
#endif
    emit_scalar(error, 0, n, t, &ties, k, values, index, 0);
}

/* out = alpha sum_w sparse_w (alpha = 1/W: the mean; 1: the sum): worker w's k values at
   parts + w * stride, its indices (each list ascending) k words after, added in worker order as
   zero_ then index_add_ do, block by block. Returns 0, or -1 if an index is out of [0, n) (then
   out is partial). */
int topk_decompress(float *out, int64_t n, int64_t world, const int32_t *parts, int64_t stride,
                    int64_t k, float alpha, int64_t *next) {
    enum { BLOCK = 4096 };
    for (int64_t w = 0; w < world; ++w) next[w] = 0;
    for (int64_t start = 0; start < n; start += BLOCK) {
        uint64_t end = (uint64_t)(n - start > BLOCK ? start + BLOCK : n);
        memset(out + start, 0, (end - start) * sizeof(float));
        for (int64_t w = 0; w < world; ++w) {
            const float *v = (const float *)(parts + w * stride);
            const int32_t *index = parts + w * stride + k;
            int64_t i = next[w];
            for (; i < k && (uint64_t)(int64_t)index[i] < end; ++i)
                out[index[i]] += v[i] * alpha;               /* alpha sum_w sparse_w */
            next[w] = i;
        }
    }
    for (int64_t w = 0; w < world; ++w) if (next[w] != k) return -1;
    return 0;
}
