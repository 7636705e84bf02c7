/* dtype.c - dtype names, sizes and exact f16/bf16 <-> f32 conversions. */
#include "dtype.h"

#include "base/base.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} k_dtypes[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_INVALID] = {"INVALID", 0},
    [KILN_F32] = {"F32", 4},       [KILN_F16] = {"F16", 2},
    [KILN_BF16] = {"BF16", 2},     [KILN_F64] = {"F64", 8},
    [KILN_F8_E4M3] = {"F8_E4M3", 1}, [KILN_F8_E5M2] = {"F8_E5M2", 1},
    [KILN_I8] = {"I8", 1},         [KILN_U8] = {"U8", 1},
    [KILN_I16] = {"I16", 2},       [KILN_U16] = {"U16", 2},
    [KILN_I32] = {"I32", 4},       [KILN_U32] = {"U32", 4},
    [KILN_I64] = {"I64", 8},       [KILN_U64] = {"U64", 8},
    [KILN_BOOL] = {"BOOL", 1},
};

const char *kiln_dtype_name(kiln_dtype t) {
    return (t > KILN_DTYPE_INVALID && t < KILN_DTYPE_COUNT) ? k_dtypes[t].name : "INVALID";
}

size_t kiln_dtype_size(kiln_dtype t) {
    return (t > KILN_DTYPE_INVALID && t < KILN_DTYPE_COUNT) ? k_dtypes[t].size : 0;
}

kiln_dtype kt_dtype_from_name(const char *name) {
    for (int t = 1; t < KILN_DTYPE_COUNT; t++)
        if (!strcmp(name, k_dtypes[t].name)) return (kiln_dtype)t;
    return KILN_DTYPE_INVALID;
}

int kt_dtype_is_float_source(kiln_dtype t) { return t == KILN_F32 || t == KILN_F16 || t == KILN_BF16; }

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        /* zero or subnormal: m * 2^-24 is exact in f32 */
        float v = (float)m * 5.9604644775390625e-08f;
        return float_of(bits_of(v) | sign);
    }
    if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t kt_f32_to_f16(float f) {
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to Inf */
    if (a < 0x38800000u) {                         /* below 2^-14: f16 subnormal */
        if (a < 0x33000000u) return sign;          /* below 2^-25: rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r); /* r == 0x400 is the smallest normal */
    }
    /* normal: rebias exponent (-112 << 23) and round to nearest even on bit 13 */
    uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float kt_bf16_to_f32(uint16_t b) { return float_of((uint32_t)b << 16); }

uint16_t kt_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

kiln_status kt_to_f32(kiln_dtype src, const void *in, float *out, size_t n) {
    const uint8_t *p = in;
    switch (src) {
    case KILN_F32: memmove(out, in, n * 4); return KILN_OK;
    case KILN_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = kt_f16_to_f32(h);
        }
        return KILN_OK;
    case KILN_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = kt_bf16_to_f32(h);
        }
        return KILN_OK;
    default:
        return kb_fail(KILN_ERR_DTYPE, "cannot convert %s to F32 (supported: F32, F16, BF16)",
                       kiln_dtype_name(src));
    }
}

kiln_status kt_from_f32(kiln_dtype dst, const float *in, void *out, size_t n) {
    uint8_t *p = out;
    switch (dst) {
    case KILN_F32: memmove(out, in, n * 4); return KILN_OK;
    case KILN_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = kt_f32_to_f16(in[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return KILN_OK;
    case KILN_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = kt_f32_to_bf16(in[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return KILN_OK;
    default:
        return kb_fail(KILN_ERR_DTYPE, "cannot convert F32 to %s (supported: F32, F16, BF16)",
                       kiln_dtype_name(dst));
    }
}
