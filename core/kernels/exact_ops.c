/* ATen CPU kernels that portable numerics leave slow, as plain loops with the same bits
   (core/exact_ops.py). Each one selects or copies floats: no float arithmetic, nothing
   rounded, so the compiler may vectorize it freely. */
#include <stdint.h>
#include <string.h>

/* threshold_backward: out[i] = self[i] <= threshold ? +0 : grad[i] (ATen's threshold_kernel,
   the derivative of ReLU; a NaN in self keeps grad). As bits: grad & keep, keep all ones or
   all zeros, so the loop has no branch. */
void threshold_backward(float *out, const float *grad, const float *self, float threshold,
                        int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t g;
        memcpy(&g, grad + i, sizeof g);
        g &= -(uint32_t)!(self[i] <= threshold);
        memcpy(out + i, &g, sizeof g);
    }
}

/* One window offset of a row of outputs: output ow (lo <= ow < hi) meets the element
   src[ow * dw] (index first + ow * dw) and takes it where it is greater or NaN. dw is a constant
   where this is inlined (1: the loads are contiguous, and the loop vectorizes). */
static inline __attribute__((always_inline)) void window_column(
        const float *restrict src, float *restrict m, int32_t *restrict at, int32_t first,
        int64_t lo, int64_t hi, const int32_t dw) {
    for (int64_t ow = lo; ow < hi; ++ow) {
        const float val = src[ow * dw];
        const int32_t take = -(int32_t)((val > m[ow]) | (val != val));   /* all ones or none */
        m[ow] = take ? val : m[ow];
        at[ow] = ((first + (int32_t)ow * dw) & take) | (at[ow] & ~take);
    }
}

/* max_pool2d_with_indices over planes of an NCHW float32 tensor, as ATen's cpu_max_pool does
   it: each output takes the largest element of its window, visited row by row, each row left
   to right, a later element winning only where it is greater or NaN (so ties keep the first,
   NaNs the last); it starts at -inf and at the index (ih * w + iw) of the window's first
   element inside the input. The loops run over a whole output row at each window offset (kw),
   which visits each output's elements in the same order, without a branch; a row's indices
   are int32 (as wide as the floats: the selects vectorize; the caller keeps h * w below 2^31
   and a row short enough for the stack) until the row is done. */
void max_pool2d(const float *restrict in, float *restrict out, int64_t *restrict ind,
                int64_t planes, int64_t h, int64_t w, int64_t oh_n, int64_t ow_n, int64_t kh,
                int64_t kw_n, int64_t dh, int64_t dw, int64_t pad_h, int64_t pad_w, int64_t dil_h,
                int64_t dil_w) {
    for (int64_t plane = 0; plane < planes; ++plane) {
        const float *src = in + plane * h * w;
        for (int64_t oh = 0; oh < oh_n; ++oh) {
            float *restrict m = out + (plane * oh_n + oh) * ow_n;
            int64_t *restrict index = ind + (plane * oh_n + oh) * ow_n;
            int64_t ih0 = oh * dh - pad_h;
            const int64_t ih1 = ih0 + (kh - 1) * dil_h + 1 < h ? ih0 + (kh - 1) * dil_h + 1 : h;
            while (ih0 < 0) ih0 += dil_h;
            int32_t at[ow_n];
            for (int64_t ow = 0; ow < ow_n; ++ow) {
                int64_t iw0 = ow * dw - pad_w;
                while (iw0 < 0) iw0 += dil_w;
                m[ow] = -__builtin_inff();
                at[ow] = (int32_t)(ih0 * w + iw0);
            }
            for (int64_t ih = ih0; ih < ih1; ih += dil_h) {
                const float *row = src + ih * w;
                for (int64_t kw = 0; kw < kw_n; ++kw) {
                    const int64_t c = kw * dil_w - pad_w;          /* iw = ow * dw + c */
                    const int64_t lo = c < 0 ? (-c + dw - 1) / dw : 0;
                    int64_t hi = w - c > 0 ? (w - c + dw - 1) / dw : 0;
                    hi = hi < ow_n ? hi : ow_n;
                    const int32_t first = (int32_t)(ih * w + c);
                    if (dw == 1) window_column(row + c, m, at, first, lo, hi, 1);
                    else window_column(row + c, m, at, first, lo, hi, (int32_t)dw);
                }
            }
            for (int64_t ow = 0; ow < ow_n; ++ow) index[ow] = at[ow];
        }
    }
}
