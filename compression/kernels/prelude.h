/* What every kernel's C source starts with: the headers, X86 where the AVX2 code paths can be
   built, use_avx2(): whether to take them (the CPU has AVX2, and the environment variable
   named PORTABLE_ENV is not set: the tests' way to run the portable loops on any machine),
   use_avx512(): whether to take a kernel's AVX-512 paths where it has some (use_avx2(), the CPU
   has AVX-512 F and BW, and the variable named NO_AVX512_ENV is not set: the tests' way to run
   the AVX2 paths on such a CPU), and copy_floats() and stream_floats(), the portable and AVX2
   ways to write a finished block of an output that is only written.
   compression/_native.py compiles the kernels with -DPORTABLE_ENV=<its name> and
   -DNO_AVX512_ENV=<its name>, strings. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86 1
#endif
static int use_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        cached = 0;
#ifdef X86
        cached = __builtin_cpu_supports("avx2") && !getenv(PORTABLE_ENV);
#endif
    }
    return cached;
}

__attribute__((unused)) static int use_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        cached = 0;
#ifdef X86
        cached = use_avx2() && __builtin_cpu_supports("avx512f")
                 && __builtin_cpu_supports("avx512bw") && !getenv(NO_AVX512_ENV);
#endif
    }
    return cached;
}

/* A finished block copied to out: the portable paths' store_fn (the AVX2 ones stream it). */
typedef void store_fn(float *out, const float *block, int64_t len);
__attribute__((unused)) static void copy_floats(float *out, const float *block, int64_t len) {
    memcpy(out, block, (size_t)len * sizeof(float));
}

#ifdef X86
/* out[0 .. len) = block[0 .. len) with streaming stores where out is 32-byte aligned: out is
   only written, so no read for ownership and no cache pollution (a plain store first reads the
   line it writes). Streaming stores are weakly ordered: the pass that made them ends with
   _mm_sfence() before another thread may read out. */
__attribute__((target("avx2"), unused))
static void stream_floats(float *out, const float *block, int64_t len) {
    int64_t j = 0;
    for (; j < len && ((uintptr_t)(out + j) & 31) != 0; ++j) out[j] = block[j];
    for (; j + 8 <= len; j += 8) _mm256_stream_ps(out + j, _mm256_loadu_ps(block + j));
    memcpy(out + j, block + j, (size_t)(len - j) * sizeof(float));
}
#endif
