/* QSGD's bit count, Code_s of Alistarh et al. (NeurIPS 2017), Sec. 3.1, in one pass
   (compression/qsgd.py: code_bits is the same in torch ops; the Python side is
   compression/_qsgd_kernel.py). Integers only: the count is exact on every path. */
#include "prelude.h"

/* The length of the Elias omega code of k >= 1 (Elias 1975): a final 0, and while k > 1 the
   binary digits of k, then k = (their count) - 1. */
static int64_t omega_loop(uint64_t k) {
    int64_t length = 1;
    while (k > 1) {
        int digits = 64 - __builtin_clzll(k);
        length += digits;
        k = (uint64_t)digits - 1;
    }
    return length;
}

/* LENGTH[d]: the code's length for a k >= 1 of d binary digits: 1 for k = 1 (d = 1), else
   d + the length for d - 1 (below 64). */
static int64_t LENGTH[65];
__attribute__((constructor)) static void init_lengths(void) {
    LENGTH[1] = 1;
    for (uint64_t d = 2; d <= 64; ++d) LENGTH[d] = (int64_t)d + omega_loop(d - 1);
}

/* omega_loop(k) for k >= 1, one look-up. */
static inline int64_t omega(uint64_t k) { return LENGTH[64 - __builtin_clzll(k)]; }

/* Code_s's bits of the levels codes[0 .. n) in buckets of bucket elements, norms left out: per
   non-zero level, Elias(gap) + 1 sign bit + Elias(level), the gap to the previous non-zero of
   its bucket (for the first, its position in the bucket, from 1). */
int64_t qsgd_code_bits(const int32_t *codes, int64_t n, int64_t bucket) {
    int64_t bits = 0;
    for (int64_t start = 0; start < n; start += bucket) {
        int64_t end = n - start > bucket ? start + bucket : n, previous = start - 1;
        for (int64_t i = start; i < end; ++i) {            /* without branches: codes are */
            uint64_t level = (uint32_t)codes[i];            /* zero at random */
            int64_t kept = -(int64_t)(level != 0);          /* all ones where non-zero */
            bits += (omega((uint64_t)(i - previous)) + 1 + omega(level | 1)) & kept;
            previous += (i - previous) & kept;
        }
    }
    return bits;
}

/* The message's bit planes of a layer of n elements (element i is bit i % 8 of byte i / 8 of a
   plane of width bytes; the last byte's spare bits 0): plane 0 the signs, set where grad < 0,
   then plane 1 + b the bit b of each level codes[i], for b < bits. */
void qsgd_pack(const int32_t *codes, const float *grad, int64_t n, int64_t bits,
               uint8_t *planes, int64_t width) {
    for (int64_t byte = 0; byte < width; ++byte) {
        const int64_t first = 8 * byte, len = n - first < 8 ? n - first : 8;
        uint32_t sign = 0;
        for (int64_t l = 0; l < len; ++l) sign |= (uint32_t)(grad[first + l] < 0.0f) << l;
        planes[byte] = (uint8_t)sign;
        for (int64_t b = 0; b < bits; ++b) {
            uint32_t plane = 0;
            for (int64_t l = 0; l < len; ++l)
                plane |= ((uint32_t)codes[first + l] >> b & 1u) << l;
            planes[width * (1 + b) + byte] = (uint8_t)plane;
        }
    }
}

/* One worker's Q_s(v) added to out (n elements, buckets of bucket): out[i] = out[i] (first:
   +0) + sign_i (norms[i / bucket] / s) level_i, the levels read from the bits planes after the
   sign plane as qsgd_pack wrote them, a byte (eight elements) at a time; the float operations
   the torch ops do, in their order. */
void qsgd_add(float *out, int64_t n, int64_t bucket, const float *norms, float s,
              const uint8_t *planes, int64_t width, int64_t bits, int first) {
    int64_t block = 0, next = bucket;                        /* element next starts block + 1 */
    float scale = norms[0] / s;                              /* ||v||_2 / s */
    for (int64_t byte = 0; byte < width; ++byte) {
        uint32_t level[8] = {0};
        for (int64_t b = 0; b < bits; ++b) {
            const uint32_t plane = planes[width * (1 + b) + byte];
            for (int l = 0; l < 8; ++l) level[l] |= (plane >> l & 1u) << b;
        }
        const uint32_t sign = planes[byte];
        const int64_t at = 8 * byte, len = n - at < 8 ? n - at : 8;
        for (int64_t l = 0; l < len; ++l) {
            if (at + l == next) {
                scale = norms[++block] / s;
                next += bucket;
            }
            const float value = scale * (float)level[l];     /* ||v||_2 xi_i */
            const float signed_value = sign >> l & 1u ? -value : value;
            out[at + l] = (first ? 0.0f : out[at + l]) + signed_value;
        }
    }
}
