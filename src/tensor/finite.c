/* finite.c - finding NaN and Inf in f32 buffers, fast enough to run on every
 * input and every output of a forward (dtype.h).
 *
 * A float is NaN or Inf exactly when its 8 exponent bits are all ones, the
 * largest value the field can hold. So one pass keeps the running maximum of
 * (bits & 0x7f800000): plain integer max over 32-bit lanes, which gcc and
 * clang vectorize at -O2/-O3 (vpmaxud), no branch per element. The pass runs
 * in blocks so that a bad value stops the scan within a block, and only then
 * is the block searched for the first bad index. */
#include "tensor/dtype.h"
#include "base/base.h"

#include <string.h>

#define KT_EXP_MASK 0x7f800000u
#define KT_BLOCK 4096 /* floats: 16 KiB, inside L1 */

/* The largest exponent field in x[0..n). memcpy, not a pointer cast, keeps
 * it free of aliasing questions; it compiles to plain loads. */
static uint32_t max_exponent(const float *x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= KT_EXP_MASK;
        m = u > m ? u : m;
    }
    return m;
}

size_t kt_find_nonfinite(const float *x, size_t n) {
    for (size_t b = 0; b < n; b += KT_BLOCK) {
        size_t len = n - b < KT_BLOCK ? n - b : KT_BLOCK;
        if (max_exponent(x + b, len) != KT_EXP_MASK) continue;
        for (size_t i = b; i < b + len; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            if ((u & KT_EXP_MASK) == KT_EXP_MASK) return i;
        }
    }
    return n;
}

const char *kt_nonfinite_name(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (u & 0x007fffffu) return "NaN";
    return u >> 31 ? "-Inf" : "+Inf";
}

kiln_status kt_check_finite(const char *what, const float *x, size_t n) {
    size_t i = kt_find_nonfinite(x, n);
    if (i == n) return KILN_OK;
    return kb_fail(KILN_ERR_NONFINITE, "%s holds %s at index %zu (the first value that is not finite)", what,
                   kt_nonfinite_name(x[i]), i);
}
