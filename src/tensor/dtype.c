/* dtype.c - dtype names, sizes and exact f16/bf16/fp8 <-> f32 conversions. */
#include "dtype.h"

#include "base/base.h"

#include <math.h>
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

/* ---- fp8 ---------------------------------------------------------------------
 * One encoder for both formats: mbits mantissa bits, exponent bias, and the
 * f32 pattern of the largest finite value. Below the smallest normal
 * (2^(1-bias)) the value is scaled by a power of two (exact) so that the
 * subnormal grid becomes the integers, and rintf rounds half to even; a
 * result of 2^mbits is the smallest normal's encoding, so no special case.
 * Above it, the f32 mantissa is rounded to nearest even on its low
 * 23 - mbits bits and the exponent rebiased. Values at or above the largest
 * finite saturate before rounding, so rounding never reaches the NaN/Inf
 * encodings. */
static uint8_t f32_to_f8(float f, int mbits, int bias, uint32_t max_bits, int has_inf) {
    uint32_t x = bits_of(f), a = x & 0x7fffffffu;
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint8_t max_code = (uint8_t)((((max_bits >> 23) - 127u + (uint32_t)bias) << mbits) |
                                 ((max_bits >> (23 - mbits)) & ((1u << mbits) - 1u)));
    if (a > 0x7f800000u) return has_inf ? (uint8_t)(sign | 0x7eu) : (uint8_t)(sign | 0x7fu); /* NaN */
    if (a == 0x7f800000u && has_inf) return (uint8_t)(sign | 0x7cu);                        /* Inf */
    if (a >= max_bits) return (uint8_t)(sign | max_code);                                   /* saturate */
    uint32_t min_normal = (uint32_t)(128 - bias) << 23; /* 2^(1-bias) */
    if (a < min_normal) {
        /* |f| * 2^(bias - 1 + mbits): the subnormal steps become integers */
        float v = float_of(a) * float_of((uint32_t)(127 + bias - 1 + mbits) << 23);
        return (uint8_t)(sign | (uint8_t)rintf(v));
    }
    int shift = 23 - mbits;
    uint32_t r = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
    return (uint8_t)(sign | (uint8_t)(r - ((uint32_t)(127 - bias) << mbits)));
}

float kt_e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
    float v;
    if ((b & 0x7fu) == 0x7fu) v = NAN;
    else if (e == 0) v = (float)m * 0x1p-9f;
    else v = float_of(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}

uint8_t kt_f32_to_e4m3(float f) { return f32_to_f8(f, 3, 7, 0x43e00000u /* 448 */, 0); }

float kt_e5m2_to_f32(uint8_t b) { return kt_f16_to_f32((uint16_t)(b << 8)); }

uint8_t kt_f32_to_e5m2(float f) { return f32_to_f8(f, 2, 15, 0x47600000u /* 57344 */, 1); }

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
    case KILN_F8_E4M3:
        for (size_t i = 0; i < n; i++) out[i] = kt_e4m3_to_f32(p[i]);
        return KILN_OK;
    case KILN_F8_E5M2:
        for (size_t i = 0; i < n; i++) out[i] = kt_e5m2_to_f32(p[i]);
        return KILN_OK;
    default:
        return kb_fail(KILN_ERR_DTYPE, "cannot convert %s to F32 (supported: F32, F16, BF16, F8_E4M3, F8_E5M2)",
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
    case KILN_F8_E4M3:
        for (size_t i = 0; i < n; i++) p[i] = kt_f32_to_e4m3(in[i]);
        return KILN_OK;
    case KILN_F8_E5M2:
        for (size_t i = 0; i < n; i++) p[i] = kt_f32_to_e5m2(in[i]);
        return KILN_OK;
    default:
        return kb_fail(KILN_ERR_DTYPE, "cannot convert F32 to %s (supported: F32, F16, BF16, F8_E4M3, F8_E5M2)",
                       kiln_dtype_name(dst));
    }
}
