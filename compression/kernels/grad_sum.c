/* The hook's epoch sum Delta_e (compression/hook.py) with its finiteness check in the same pass:
   acc += g, and whether every sum is still finite. The Python side is
   compression/_grad_sum_kernel.py. The add is the one float operation torch's add_ does, so acc
   has the same bits; the check costs no pass of its own (the loop is bound by memory). */
#include "prelude.h"

#define EXPONENT 0x7f800000u   /* a float32 whose exponent bits are all set is inf or NaN */

static int add_finite_scalar(float *acc, const float *g, int64_t i, int64_t n) {
    uint32_t bad = 0;
    for (; i < n; ++i) {
        float s = acc[i] + g[i];                             /* Delta_e += g */
        uint32_t u;
        acc[i] = s;
        memcpy(&u, &s, 4);
        bad |= (u & EXPONENT) == EXPONENT;
    }
    return !bad;
}

#ifdef X86
__attribute__((target("avx2")))
static int add_finite_avx2(float *acc, const float *g, int64_t n) {
    const __m256i exponent = _mm256_set1_epi32((int)EXPONENT);
    __m256i bad = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 s = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(g + i));
        _mm256_storeu_ps(acc + i, s);
        __m256i e = _mm256_and_si256(_mm256_castps_si256(s), exponent);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exponent));
    }
    return _mm256_testz_si256(bad, bad) && add_finite_scalar(acc, g, i, n);
}
#endif

/* acc[i] += g[i] for i < n; 1 if every acc[i] is then finite, 0 if one is inf or NaN. */
int grad_sum_add(float *acc, const float *g, int64_t n) {
#ifdef X86
    if (use_avx2()) return add_finite_avx2(acc, g, n);
#endif
    return add_finite_scalar(acc, g, 0, n);
}
