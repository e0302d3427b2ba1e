/* What every kernel's C source starts with: the headers, X86 where the AVX2 code paths can be
   built, and use_avx2(): whether to take them (the CPU has AVX2, and the environment variable
   named PORTABLE_ENV is not set: the tests' way to run the portable loops on any machine).
   compression/_native.py compiles the kernels with -DPORTABLE_ENV=<its name>, a string. */
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
