/* Top-K's CPU kernel: error feedback, exact radix selection and the message (compression/
   topk.py). The Python side is compression/_topk_kernel.py: its docstring describes the passes,
   and it defines HIGH_BITS, LOW_BITS, SAMPLE and SAMPLED_MIN (-D), from which it sizes the
   workspace. */
#include "prelude.h"

_Static_assert(HIGH_BITS + LOW_BITS == 31, "the two histograms split the 31 bits of |acc|");
#define HIGH (1 << HIGH_BITS)     /* buckets of the top HIGH_BITS bits of |acc| */
#define LOW (1 << LOW_BITS)       /* buckets of the low LOW_BITS bits, within one high bucket */

static inline int32_t key(float x) {  /* |x| as ordered bits: exponent, then mantissa */
    uint32_t u; memcpy(&u, &x, 4); return (int32_t)(u & 0x7fffffffu);
}


/* Pass 1: acc = g + e, stored in e; high[key(acc) >> LOW_BITS] counts. Returns the highest
   bucket counted (where bucket_of starts). */
static int32_t accumulate(float *error, const float *grad, int64_t n, int32_t *high) {
    memset(high, 0, HIGH * sizeof(int32_t));
    int32_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
        float acc = error[i] + grad[i];                      /* acc = g + e */
        error[i] = acc;
        int32_t b = key(acc) >> LOW_BITS;
        ++high[b];
        top = b > top ? b : top;
    }
    return top;
}

/* high[key(acc) >> LOW_BITS] counts over acc (already summed: the fallback of the sampled
   pass). Returns the highest bucket counted. */
static int32_t histogram(const float *acc, int64_t n, int32_t *high) {
    memset(high, 0, HIGH * sizeof(int32_t));
    int32_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
        int32_t b = key(acc[i]) >> LOW_BITS;
        ++high[b];
        top = b > top ? b : top;
    }
    return top;
}

/* The bucket (of keys >> shift, histogram count over top .. 0, none counted above top) that
   holds the k-th largest key, and in *above the entries in higher buckets (plus what it held
   before). The caller knows top: a scan from the histogram's last bucket would cost more than
   the pass that filled it on a small layer (gradients' keys sit far below the top buckets). */
static int32_t bucket_of(const int32_t *count, int32_t top, int64_t k, int64_t *above) {
    int32_t bucket = top;
    while (*above + count[bucket] < k) *above += count[bucket--];
    return bucket;
}

/* The sample's places: Knuth's MMIX LCG, scaled to [0, n) (n < 2^31). Each read misses the
   cache, so the read AHEAD places later is prefetched: many misses in flight at once. */
#define AHEAD 32
static inline uint64_t lcg(uint64_t x) { return x * 6364136223846793005ull + 1442695040888963407ull; }
static inline int64_t place(uint64_t x, int64_t n) { return (int64_t)((x >> 32) * (uint64_t)n >> 32); }

/* The sample: the keys of acc = e + g at SAMPLE fixed pseudo-random places (read, not stored),
   as a histogram of their high buckets. The sampled pass keeps as candidates the buckets *lo to
   *hi, which hold the k-th largest key unless the sample is far off: its rank among the sample
   is about q SAMPLE (q = k / n), give or take 4 binomial standard deviations and 2. */
static void bracket(const float *error, const float *grad, int64_t n, int64_t k, int32_t *high,
                    int32_t *lo, int32_t *hi) {
    memset(high, 0, HIGH * sizeof(int32_t));
    uint64_t x = (uint64_t)n, ahead = (uint64_t)n;
    int32_t top = 0;
    for (int s = 0; s < AHEAD; ++s) {
        ahead = lcg(ahead);
        __builtin_prefetch(error + place(ahead, n));
        __builtin_prefetch(grad + place(ahead, n));
    }
    for (int s = 0; s < SAMPLE; ++s) {
        x = lcg(x), ahead = lcg(ahead);                      /* the place AHEAD draws later: */
        __builtin_prefetch(error + place(ahead, n));         /* its reads start now */
        __builtin_prefetch(grad + place(ahead, n));
        int64_t i = place(x, n);
        int32_t b = key(error[i] + grad[i]) >> LOW_BITS;
        ++high[b];
        top = b > top ? b : top;
    }
    int64_t rank = (SAMPLE * k + n - 1) / n, variance = SAMPLE * k / n * (n - k) / n, sd = 0;
    while ((sd + 1) * (sd + 1) <= variance) ++sd;
    int64_t margin = 4 * (sd + 1) + 2, above = 0, below = 0;
    *hi = rank - margin < 1 ? HIGH - 1 : bucket_of(high, top, rank - margin, &above);
    *lo = rank + margin > SAMPLE ? 0 : bucket_of(high, top, rank + margin, &below);
}

/* Pass 1, sampled: acc = g + e, stored in e; *above counts the entries in buckets above hi,
   and the keys in buckets lo .. hi go to cand, as long as there is room for them (capacity).
   Returns how many there are (more than capacity: cand holds the first ones). */
static int64_t candidates_scalar(float *error, const float *grad, int64_t i, int64_t n,
                                 int32_t lo, int32_t hi, int32_t *cand, int64_t count,
                                 int64_t capacity, int64_t *above) {
    for (; i < n; ++i) {
        float acc = error[i] + grad[i];                      /* acc = g + e */
        error[i] = acc;
        int32_t b = key(acc) >> LOW_BITS;
        *above += b > hi;
        if (b >= lo && b <= hi) {
            if (count < capacity) cand[count] = key(acc);
            ++count;
        }
    }
    return count;
}

/* Pass 2: low[key & (LOW - 1)] counts over the entries whose key >> LOW_BITS is bucket; *top:
   the highest low bucket counted so far. */
static void refine_scalar(const float *acc, int64_t j, int64_t n, int32_t bucket, int32_t *low,
                          int32_t *top) {
    for (; j < n; ++j) {
        int32_t u = key(acc[j]);
        if (u >> LOW_BITS == bucket) {
            ++low[u & (LOW - 1)];
            *top = (u & (LOW - 1)) > *top ? u & (LOW - 1) : *top;
        }
    }
}

#ifdef X86
__attribute__((target("avx2")))
static void refine_avx2(const float *acc, int64_t n, int32_t bucket, int32_t *low,
                        int32_t *top) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), vb = _mm256_set1_epi32(bucket);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256i u = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(acc + j)), abs_mask);
        __m256i in = _mm256_cmpeq_epi32(_mm256_srli_epi32(u, LOW_BITS), vb);
        if (!_mm256_testz_si256(in, in)) refine_scalar(acc, j, j + 8, bucket, low, top);
    }
    refine_scalar(acc, j, n, bucket, low, top);
}
#endif

#ifdef X86
static int32_t PACK[256][8];  /* PACK[mask]: the lanes set in mask, first */
__attribute__((constructor)) static void init_pack(void) {
    for (int mask = 0; mask < 256; ++mask)
        for (int lane = 0, c = 0; lane < 8; ++lane)
            if (mask >> lane & 1) PACK[mask][c++] = lane;
}

/* candidates_scalar, eight lanes at a time while a whole vector of candidates fits. Every
   vector is packed and stored, with or without candidates (count grows by none then): a
   branch around the empty ones, a few percent of the layer being candidates, mispredicted
   often enough to cost more than the store it saves (Top-K 0.25 and 0.99 on ResNet-18: about
   1.2-1.6x the time of the branchless pass, measured). */
__attribute__((target("avx2,popcnt")))
static int64_t candidates_avx2(float *error, const float *grad, int64_t n, int32_t lo,
                               int32_t hi, int32_t *cand, int64_t capacity, int64_t *above) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    const __m256i vlo = _mm256_set1_epi32(lo - 1), vhi = _mm256_set1_epi32(hi);
    __m256i counted = _mm256_setzero_si256();                /* minus the entries above hi */
    int64_t j = 0, count = 0;
    for (; j + 8 <= n && count + 8 <= capacity; j += 8) {
        __m256 a = _mm256_add_ps(_mm256_loadu_ps(error + j), _mm256_loadu_ps(grad + j));
        _mm256_storeu_ps(error + j, a);
        __m256i u = _mm256_and_si256(_mm256_castps_si256(a), abs_mask);
        __m256i b = _mm256_srli_epi32(u, LOW_BITS);
        __m256i over = _mm256_cmpgt_epi32(b, vhi);
        counted = _mm256_add_epi32(counted, over);
        int in = _mm256_movemask_ps(_mm256_castsi256_ps(
            _mm256_andnot_si256(over, _mm256_cmpgt_epi32(b, vlo))));
        __m256i order = _mm256_loadu_si256((const __m256i *)PACK[in]);
        _mm256_storeu_si256((__m256i *)(cand + count), _mm256_permutevar8x32_epi32(u, order));
        count += __builtin_popcount(in);
    }
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, counted);
    for (int l = 0; l < 8; ++l) *above -= lanes[l];
    return candidates_scalar(error, grad, j, n, lo, hi, cand, count, capacity, above);
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
/* emit_scalar, eight lanes at a time while whole vectors fit below k; the rest scalar. sparse
   (a constant where this is inlined): skip the vectors that keep nothing. */
__attribute__((target("avx2,popcnt"), always_inline))
static inline int64_t emit_lanes(float *acc, int64_t n, int32_t t, int64_t *ties, int64_t k,
                                 float *values, int32_t *index, const int sparse) {
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
        if (sparse && !kept) continue;
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

/* A branch around the vectors that keep nothing pays where it is rarely mispredicted: where
   nearly all vectors are empty (under 1 kept in SPARSE). Elsewhere every vector is packed and
   stored (nothing kept: count grows by none, e is stored unchanged), with no branch on what it
   kept: at 1 kept in 10, 4 vectors in 10 are empty, and the branch made Top-K 0.1's compress
   about twice as slow; measured on ResNet-18's gradients, the branch pays from 1 in 200 (0.005)
   down, not at 1 in 50 (0.02). */
#define SPARSE 64
__attribute__((target("avx2,popcnt")))
static int64_t emit_avx2(float *acc, int64_t n, int32_t t, int64_t *ties, int64_t k,
                         float *values, int32_t *index) {
    if (SPARSE * k < n) return emit_lanes(acc, n, t, ties, k, values, index, 1);
    return emit_lanes(acc, n, t, ties, k, values, index, 0);
}
#endif

/* T (the k-th largest key) and how many entries equal to T are kept, given the bucket it is in
   and the entries above that bucket: refined over the low bits of the keys in the bucket, from
   acc (n floats) or from the candidates' keys (cand: count of them). */
static int32_t threshold(const float *acc, int64_t n, const int32_t *cand, int64_t count,
                         int32_t bucket, int64_t above, const int32_t *high, int64_t k,
                         int32_t *low, int64_t *ties) {
    *ties = 0;
    if (above + high[bucket] == k) return (bucket << LOW_BITS) - 1;  /* the whole bucket: > t */
    memset(low, 0, LOW * sizeof(int32_t));
    int32_t top = 0;
    if (cand) {
        for (int64_t c = 0; c < count; ++c)
            if (cand[c] >> LOW_BITS == bucket) {
                ++low[cand[c] & (LOW - 1)];
                top = (cand[c] & (LOW - 1)) > top ? cand[c] & (LOW - 1) : top;
            }
    } else {
#ifdef X86
        if (use_avx2()) refine_avx2(acc, n, bucket, low, &top);
        else
#endif
        refine_scalar(acc, 0, n, bucket, low, &top);
    }
    int32_t r = bucket_of(low, top, k, &above);
    *ties = k - above;                                      /* of the low[r] equal to T */
    return bucket << LOW_BITS | r;
}

/* Pass 1 and the threshold: T and its ties. Large layers take the sampled pass (candidates
   from a sample's bracket) and fall back to a histogram of acc where the sample was off. */
static int32_t select_t(float *error, const float *grad, int64_t n, int64_t k,
                        int32_t *workspace, int64_t capacity, int64_t *ties) {
    int32_t *high = workspace, *low = workspace + HIGH, *cand = low + LOW, top;
    int64_t above = 0;
    if (n >= SAMPLED_MIN && k < n) {
        int32_t lo, hi;
        bracket(error, grad, n, k, high, &lo, &hi);
        int64_t count;
#ifdef X86
        if (use_avx2()) count = candidates_avx2(error, grad, n, lo, hi, cand, capacity, &above);
        else
#endif
        count = candidates_scalar(error, grad, 0, n, lo, hi, cand, 0, capacity, &above);
        if (count <= capacity && above < k && above + count >= k) {  /* T is a candidate */
            memset(high + lo, 0, (size_t)(hi - lo + 1) * sizeof(int32_t));  /* their buckets */
            for (int64_t c = 0; c < count; ++c) ++high[cand[c] >> LOW_BITS];
            int32_t bucket = bucket_of(high, hi, k, &above);
            return threshold(NULL, 0, cand, count, bucket, above, high, k, low, ties);
        }
        top = histogram(error, n, high);                    /* the sample was off */
        above = 0;
    } else {
        top = accumulate(error, grad, n, high);
    }
    int32_t bucket = bucket_of(high, top, k, &above);
    return threshold(error, n, NULL, 0, bucket, above, high, k, low, ties);
}

/* Top-K of one layer: acc = g + e; the k largest |acc| (ties: the first) to values/index in
   index order; e = acc there, 0 at them. workspace: HIGH + LOW + capacity int32. */
void topk_compress(float *error, const float *grad, int64_t n, int64_t k, float *values,
                   int32_t *index, int32_t *workspace, int64_t capacity) {
    int64_t ties;
    int32_t t = select_t(error, grad, n, k, workspace, capacity, &ties);
#ifdef X86
    if (use_avx2()) { emit_avx2(error, n, t, &ties, k, values, index); return; }
#endif
    emit_scalar(error, 0, n, t, &ties, k, values, index, 0);
}

#ifdef X86
/* A dense list's entries of a block [start, start + len) (summed in block), from entry i on, as
   the scalar loop of topk_decompress adds them, while whole vectors of 8 fit: where the next 8
   indices are a run (index[i], index[i] + 1, ... + 7: in a list that keeps nearly every entry,
   most are), one vector add of their v * alpha; else the entries up to where the run breaks,
   one at a time, as the scalar loop adds them (the next vector starts at the break). The same
   float operations on each element in the same order, so the same bits. Returns the first entry
   not added (the scalar loop goes on from there). */
__attribute__((target("avx2")))
static int64_t add_runs_avx2(float *block, int64_t start, int64_t len, const float *v,
                             const int32_t *index, int64_t i, int64_t k, float alpha) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t at; i + 8 <= k && (at = (int64_t)index[i] - start) >= 0 && at + 8 <= len;) {
        __m256i run = _mm256_add_epi32(_mm256_set1_epi32(index[i]), lanes);
        unsigned in_run = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
            _mm256_loadu_si256((const __m256i *)(index + i)), run)));
        if (in_run == 0xff) {
            _mm256_storeu_ps(block + at, _mm256_add_ps(_mm256_loadu_ps(block + at),
                                                       _mm256_mul_ps(_mm256_loadu_ps(v + i),
                                                                     va)));
            i += 8;
            continue;
        }
        for (int l = 0, breaks = __builtin_ctz(~in_run); l < breaks; ++l, ++i)
            block[at + l] += v[i] * alpha;                   /* alpha sum_w sparse_w */
    }
    return i;
}
#endif

/* out = alpha sum_w sparse_w (alpha = 1/W: the mean; 1: the sum): worker w's k values at
   parts + w * stride, its indices (each list ascending) k words after, added in worker order as
   zero_ then index_add_ do, block by block: each block is summed in an L1 buffer and then
   copied out (on AVX2 with streaming stores: out is only written). Returns 0, or -1 if an index
   is out of [0, n) or a list is not ascending (then out is partial). */
int topk_decompress(float *out, int64_t n, int64_t world, const int32_t *parts, int64_t stride,
                    int64_t k, float alpha, int64_t *next) {
    enum { BLOCK = 4096 };
    float block[BLOCK];
    store_fn *store = copy_floats;
    int runs = 0;                          /* lists dense enough for add_runs_avx2 (9 in 10) */
#ifdef X86
    if (use_avx2()) store = stream_floats, runs = 10 * k >= 9 * n;
#endif
    for (int64_t w = 0; w < world; ++w) next[w] = 0;
    for (int64_t start = 0; start < n; start += BLOCK) {
        int64_t len = n - start > BLOCK ? BLOCK : n - start;
        memset(block, 0, (size_t)len * sizeof(float));
        for (int64_t w = 0; w < world; ++w) {
            const float *v = (const float *)(parts + w * stride);
            const int32_t *index = parts + w * stride + k;
            int64_t i = next[w];
#ifdef X86
            if (runs) i = add_runs_avx2(block, start, len, v, index, i, k, alpha);
#endif
            for (; i < k && (uint64_t)((int64_t)index[i] - start) < (uint64_t)len; ++i)
                block[index[i] - start] += v[i] * alpha;     /* alpha sum_w sparse_w */
            next[w] = i;
        }
        store(out + start, block, len);
    }
#ifdef X86
    _mm_sfence();                                            /* streaming stores are visible */
#endif
    for (int64_t w = 0; w < world; ++w) if (next[w] != k) return -1;
    return 0;
}
