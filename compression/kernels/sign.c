/* signSGD's and Signum's message and majority vote (compression/signsgd.py), each in one pass;
   the Python side is compression/_sign_kernel.py. Bits only: the same results as the torch ops.
   A message holds element i as bit i % 8 of byte i / 8, set where the element is negative. */
#include "prelude.h"

/* bits[0 .. ceil(n / 8)) = the signs of v[0 .. n): set where v < 0 (so -0, +0 and NaN: clear);
   the last byte's spare bits clear. */
void sign_pack(const float *v, int64_t n, uint8_t *bits) {
    for (int64_t byte = 0; byte < (n + 7) / 8; ++byte) {
        const int64_t first = 8 * byte, len = n - first < 8 ? n - first : 8;
        uint32_t negative = 0;
        for (int64_t l = 0; l < len; ++l) negative |= (uint32_t)(v[first + l] < 0.0f) << l;
        bits[byte] = (uint8_t)negative;
    }
}

/* out[i] = sign(V_i), V_i = sum over the world workers of sign(v_w,i) = world - 2 (the number
   of workers whose bit i is set): +1, -1, or +0 on a tie. Worker w's bits at parts + w * stride. */
void sign_vote(float *out, int64_t n, int64_t world, const uint8_t *parts, int64_t stride) {
    for (int64_t byte = 0; byte < (n + 7) / 8; ++byte) {
        int32_t negative[8] = {0};
        for (int64_t w = 0; w < world; ++w) {
            const uint32_t bits = parts[w * stride + byte];
            for (int l = 0; l < 8; ++l) negative[l] += (int32_t)(bits >> l & 1u);
        }
        const int64_t first = 8 * byte, len = n - first < 8 ? n - first : 8;
        for (int64_t l = 0; l < len; ++l) {
            const int64_t votes = world - 2 * (int64_t)negative[l];      /* V */
            out[first + l] = (float)((votes > 0) - (votes < 0));  /* sign(V), +0 on a tie; */
            /* without a branch: the signs are random, a branch is mispredicted half the time */
        }
    }
}
