/* test_dtype.c - f16/bf16 <-> f32 conversions checked exhaustively over all
 * 16-bit patterns and every rounding boundary against independent references
 * (ldexp/frexp/rint in double and, where the compiler has it, _Float16), the
 * fp8 formats (E4M3, E5M2: all 256 codes, every midpoint, saturation) against a
 * search-based reference, plus
 * the buffer converters, dtype names and sizes. */
#include "test.h"
#include "tensor/dtype.h"

#include <float.h>
#include <stdint.h>

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* deterministic xorshift64 */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng32(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return (uint32_t)(x >> 32);
}

/* ---- independent references ------------------------------------------- */

/* f16 bits -> f32 bits from sign/exponent/mantissa in double */
static uint32_t ref_f16_to_f32_bits(uint16_t h) {
    uint32_t s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) {
        if (m == 0) return (s << 31) | 0x7f800000u;
        return (s << 31) | 0x7f800000u | (m << 13); /* NaN: payload kept */
    }
    double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, (int)e - 15);
    if (s) v = -v;
    return f2u((float)v); /* exact: every f16 value is an f32 value */
}

/* finite f32 -> f16 bits by round-half-even (rint) in double */
static uint16_t ref_f32_to_f16(float x) {
    uint16_t s = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a < 0x1p-14) return s | (uint16_t)rint(a * 0x1p24); /* 1024 = smallest normal */
    int e;
    double f = frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    double q = rint(f * 2048.0);
    if (q == 2048.0) {
        q = 1024.0;
        e++;
    }
    int biased = e + 14;
    if (biased >= 31) return s | 0x7c00;
    return s | (uint16_t)((biased << 10) | ((int)q - 1024));
}

/* finite f32 -> bf16 bits by round-half-even (rint) in double */
static uint16_t ref_f32_to_bf16(float x) {
    uint16_t s = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a < 0x1p-126) return s | (uint16_t)rint(a * 0x1p133); /* 128 = smallest normal */
    int e;
    double f = frexp(a, &e);
    double q = rint(f * 256.0);
    if (q == 256.0) {
        q = 128.0;
        e++;
    }
    int biased = e + 126;
    if (biased >= 255) return s | 0x7f80;
    return s | (uint16_t)((biased << 7) | ((int)q - 128));
}

static int f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

/* value of an f16 pattern as double; 0x7c00 (|Inf|) reads as 65536, the value
 * the next step after 65504 would have had without overflow */
static double f16_val_ext(uint16_t h) {
    if ((h & 0x7fff) == 0x7c00) return (h & 0x8000) ? -65536.0 : 65536.0;
    return (double)kt_f16_to_f32(h);
}

static double bf16_val_ext(uint16_t b) {
    if ((b & 0x7fff) == 0x7f80) return (b & 0x8000) ? -0x1p128 : 0x1p128;
    return (double)kt_bf16_to_f32(b);
}

/* ---- f16 ---------------------------------------------------------------- */

TEST(f16_to_f32_exhaustive) {
    int bad = 0, first = -1;
    uint32_t got_first = 0, want_first = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t got = f2u(kt_f16_to_f32((uint16_t)i)), want = ref_f16_to_f32_bits((uint16_t)i);
        if (got != want) {
            if (!bad++) first = (int)i, got_first = got, want_first = want;
        }
    }
    CHECK_MSG(bad == 0, "%d mismatches; first 0x%04x -> 0x%08x, want 0x%08x", bad, first,
              (unsigned)got_first, (unsigned)want_first);
    /* spot values */
    CHECK(kt_f16_to_f32(0x3c00) == 1.0f);
    CHECK(kt_f16_to_f32(0xc000) == -2.0f);
    CHECK(kt_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(kt_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(kt_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(kt_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(f2u(kt_f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(f2u(kt_f16_to_f32(0x0000)) == 0u);
    CHECK(kt_f16_to_f32(0x7c00) == INFINITY);
    CHECK(kt_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(kt_f16_to_f32(0x7e00)) && !signbit(kt_f16_to_f32(0x7e00)));
    CHECK(isnan(kt_f16_to_f32(0xfc01)) && signbit(kt_f16_to_f32(0xfc01)));
}

TEST(f16_to_f32_vs_float16) {
#ifdef __FLT16_MANT_DIG__
    int bad = 0, first = -1;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        _Float16 v;
        memcpy(&v, &h, 2);
        float want = (float)v, got = kt_f16_to_f32(h);
        int ok = f16_is_nan(h) ? (isnan(got) && isnan(want) && !signbit(got) == !signbit(want))
                               : f2u(got) == f2u(want);
        if (!ok && !bad++) first = (int)i;
    }
    CHECK_MSG(bad == 0, "%d mismatches against _Float16; first 0x%04x", bad, first);
#else
    fprintf(stderr, "  (no _Float16: skipped)\n");
#endif
}

TEST(f16_round_trip) {
    int bad = 0, bad_nan = 0, first = -1, first_nan = -1;
    uint16_t got_first = 0, got_first_nan = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i, back = kt_f32_to_f16(kt_f16_to_f32(h));
        if (f16_is_nan(h)) {
            /* NaN: same sign, quiet bit set, payload kept */
            if (back != (h | 0x0200)) {
                if (!bad_nan++) first_nan = (int)i, got_first_nan = back;
            }
        } else if (back != h) {
            if (!bad++) first = (int)i, got_first = back;
        }
    }
    CHECK_MSG(bad == 0, "%d non-NaN patterns changed; first 0x%04x -> 0x%04x", bad, first, got_first);
    CHECK_MSG(bad_nan == 0, "%d NaN patterns wrong; first 0x%04x -> 0x%04x", bad_nan, first_nan,
              got_first_nan);
}

/* For every adjacent pair lo < hi in magnitude (same sign) of f16 values: the
 * f32 midpoint and its two f32 neighbours. */
TEST(f16_rounding_boundaries) {
    int bad = 0, inexact = 0, pairs = 0;
    char first[160] = "";
    for (int sgn = 0; sgn < 2; sgn++) {
        uint16_t s = sgn ? 0x8000 : 0;
        for (uint32_t i = 0; i < 0x7c00; i++) { /* lo = i .. 0x7bff, hi = i+1 .. 0x7c00 */
            uint16_t lo = s | (uint16_t)i, hi = s | (uint16_t)(i + 1);
            double dm = (f16_val_ext(lo) + f16_val_ext(hi)) / 2;
            float m = (float)dm;
            if ((double)m != dm) {
                inexact++;
                continue;
            }
            pairs++;
            float inf = sgn ? -INFINITY : INFINITY;
            float toward0 = nextafterf(m, 0.0f), away = nextafterf(m, inf);
            uint16_t even = (lo & 1) ? hi : lo;
            uint16_t r0 = kt_f32_to_f16(toward0), rm = kt_f32_to_f16(m), r1 = kt_f32_to_f16(away);
            if (r0 != lo || rm != even || r1 != hi) {
                if (!bad++)
                    snprintf(first, sizeof first,
                             "pair 0x%04x/0x%04x mid %a: below->0x%04x at->0x%04x above->0x%04x "
                             "(want 0x%04x 0x%04x 0x%04x)",
                             lo, hi, (double)m, r0, rm, r1, lo, even, hi);
            }
            /* the reference must agree on the same inputs */
            if (ref_f32_to_f16(toward0) != lo || ref_f32_to_f16(m) != even || ref_f32_to_f16(away) != hi) {
                if (!bad++) snprintf(first, sizeof first, "reference disagrees at pair 0x%04x", lo);
            }
        }
    }
    CHECK_MSG(inexact == 0, "%d midpoints not exact in f32", inexact);
    CHECK_MSG(pairs == 2 * 0x7c00, "%d pairs", pairs);
    CHECK_MSG(bad == 0, "%d bad pairs; first %s", bad, first);
}

TEST(f16_special_inputs) {
    /* overflow */
    CHECK(kt_f32_to_f16(65519.996f) == 0x7bff);
    CHECK(kt_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7bff);
    CHECK(kt_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(kt_f32_to_f16(-65520.0f) == 0xfc00);
    CHECK(kt_f32_to_f16(65536.0f) == 0x7c00);
    CHECK(kt_f32_to_f16(1e10f) == 0x7c00);
    CHECK(kt_f32_to_f16(FLT_MAX) == 0x7c00);
    CHECK(kt_f32_to_f16(-FLT_MAX) == 0xfc00);
    CHECK(kt_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(kt_f32_to_f16(-INFINITY) == 0xfc00);
    {
        int bad = 0;
        uint32_t first = 0;
        for (uint32_t a = f2u(65520.0f); a < 0x7f800000u; a += 997) {
            for (int sg = 0; sg < 2; sg++) {
                uint32_t x = a | (sg ? 0x80000000u : 0);
                if (kt_f32_to_f16(u2f(x)) != (sg ? 0xfc00 : 0x7c00) && !bad++) first = x;
            }
        }
        CHECK_MSG(bad == 0, "%d values >= 65520 not Inf; first 0x%08x", bad, (unsigned)first);
    }
    /* underflow */
    CHECK(kt_f32_to_f16(0.0f) == 0x0000);
    CHECK(kt_f32_to_f16(-0.0f) == 0x8000);
    CHECK(kt_f32_to_f16(0x1p-25f) == 0x0000);             /* tie to even: zero */
    CHECK(kt_f32_to_f16(-0x1p-25f) == 0x8000);
    CHECK(kt_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(kt_f32_to_f16(-nextafterf(0x1p-25f, 1.0f)) == 0x8001);
    CHECK(kt_f32_to_f16(nextafterf(0x1p-25f, 0.0f)) == 0x0000);
    CHECK(kt_f32_to_f16(1.5f * 0x1p-24f) == 0x0002);      /* tie: 1 -> 2 (even) */
    CHECK(kt_f32_to_f16(2.5f * 0x1p-24f) == 0x0002);      /* tie: 2 stays */
    CHECK(kt_f32_to_f16(FLT_MIN) == 0x0000);
    CHECK(kt_f32_to_f16(u2f(0x00000001u)) == 0x0000);
    CHECK(kt_f32_to_f16(u2f(0x80000001u)) == 0x8000);
    {
        int bad = 0;
        uint32_t first = 0;
        for (uint32_t a = 0; a < f2u(0x1p-25f); a += 991) { /* f32 subnormals and tiny normals */
            for (int sg = 0; sg < 2; sg++) {
                uint32_t x = a | (sg ? 0x80000000u : 0);
                if (kt_f32_to_f16(u2f(x)) != (sg ? 0x8000 : 0) && !bad++) first = x;
            }
        }
        CHECK_MSG(bad == 0, "%d values below 2^-25 not signed zero; first 0x%08x", bad, (unsigned)first);
    }
    /* exact values */
    CHECK(kt_f32_to_f16(1.0f) == 0x3c00);
    CHECK(kt_f32_to_f16(-2.0f) == 0xc000);
    CHECK(kt_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(kt_f32_to_f16(0x1p-14f) == 0x0400);
    CHECK(kt_f32_to_f16(0x1p-24f) == 0x0001);
    /* NaN: quiet, sign kept, top payload bits kept */
    CHECK(kt_f32_to_f16(NAN) == 0x7e00 && kt_f32_to_f16(-NAN) == 0xfe00);
    CHECK(kt_f32_to_f16(u2f(0x7fc00000u)) == 0x7e00);
    CHECK(kt_f32_to_f16(u2f(0xffc00000u)) == 0xfe00);
    CHECK(kt_f32_to_f16(u2f(0x7f800001u)) == 0x7e00); /* sNaN with only low payload: not Inf */
    CHECK(kt_f32_to_f16(u2f(0xff800001u)) == 0xfe00);
    CHECK(kt_f32_to_f16(u2f(0x7f802000u)) == 0x7e01);
    CHECK(kt_f32_to_f16(u2f(0x7fffffffu)) == 0x7fff);
    {
        int bad = 0;
        uint32_t first = 0;
        for (uint32_t a = 0x7f800001u; a <= 0x7fffffffu; a += 127) {
            for (int sg = 0; sg < 2; sg++) {
                uint32_t x = a | (sg ? 0x80000000u : 0);
                uint16_t h = kt_f32_to_f16(u2f(x));
                uint16_t want = (uint16_t)((sg ? 0x8000 : 0) | 0x7e00 | ((a >> 13) & 0x3ff));
                if (h != want && !bad++) first = x;
            }
        }
        CHECK_MSG(bad == 0, "%d NaN inputs wrong; first 0x%08x", bad, (unsigned)first);
    }
}

/* random and strided f32 patterns against the double reference and _Float16 */
TEST(f16_from_f32_cross_check) {
    int bad_ref = 0, bad_hw = 0, n = 0;
    uint32_t first_ref = 0, first_hw = 0;
    rng_state = 0x9E3779B97F4A7C15ull;
    for (uint64_t k = 0; k < 4000000 + (1ull << 32) / 1021; k++) {
        uint32_t x = k < 4000000 ? rng32() : (uint32_t)((k - 4000000) * 1021u);
        float f = u2f(x);
        uint16_t got = kt_f32_to_f16(f);
        n++;
        if (isnan(f)) {
            uint16_t want = (uint16_t)(((x >> 16) & 0x8000) | 0x7e00 | ((x >> 13) & 0x3ff));
            if (got != want && !bad_ref++) first_ref = x;
        } else if (got != ref_f32_to_f16(f)) {
            if (!bad_ref++) first_ref = x;
        }
#ifdef __FLT16_MANT_DIG__
        _Float16 hv = (_Float16)f;
        uint16_t hw;
        memcpy(&hw, &hv, 2);
        int ok = isnan(f) ? (f16_is_nan(got) && f16_is_nan(hw) && (got >> 15) == (hw >> 15)) : got == hw;
        if (!ok && !bad_hw++) first_hw = x;
#endif
    }
    CHECK_MSG(bad_ref == 0, "%d of %d disagree with the reference; first 0x%08x", bad_ref, n,
              (unsigned)first_ref);
    CHECK_MSG(bad_hw == 0, "%d of %d disagree with _Float16; first 0x%08x", bad_hw, n, (unsigned)first_hw);
}

/* ---- bf16 --------------------------------------------------------------- */

TEST(bf16_to_f32_exhaustive) {
    int bad = 0, first = -1;
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t got = f2u(kt_bf16_to_f32((uint16_t)i));
        if (got != i << 16 && !bad++) first = (int)i;
    }
    CHECK_MSG(bad == 0, "%d mismatches; first 0x%04x", bad, first);
    CHECK(kt_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(kt_bf16_to_f32(0x7f80) == INFINITY);
    CHECK(kt_bf16_to_f32(0xff80) == -INFINITY);
    CHECK(kt_bf16_to_f32(0x0001) == 0x1p-133f);
}

TEST(bf16_round_trip) {
    int bad = 0, bad_nan = 0, first = -1, first_nan = -1;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t b = (uint16_t)i, back = kt_f32_to_bf16(kt_bf16_to_f32(b));
        if (bf16_is_nan(b)) {
            if (back != (b | 0x40) && !bad_nan++) first_nan = (int)i;
        } else if (back != b && !bad++) {
            first = (int)i;
        }
    }
    CHECK_MSG(bad == 0, "%d non-NaN patterns changed; first 0x%04x", bad, first);
    CHECK_MSG(bad_nan == 0, "%d NaN patterns wrong; first 0x%04x", bad_nan, first_nan);
}

TEST(bf16_rounding_boundaries) {
    int bad = 0, inexact = 0, pairs = 0;
    char first[160] = "";
    for (int sgn = 0; sgn < 2; sgn++) {
        uint16_t s = sgn ? 0x8000 : 0;
        for (uint32_t i = 0; i < 0x7f80; i++) { /* lo = i .. 0x7f7f, hi = i+1 .. 0x7f80 (Inf) */
            uint16_t lo = s | (uint16_t)i, hi = s | (uint16_t)(i + 1);
            double dm = (bf16_val_ext(lo) + bf16_val_ext(hi)) / 2;
            float m = (float)dm;
            if ((double)m != dm) {
                inexact++;
                continue;
            }
            pairs++;
            float inf = sgn ? -INFINITY : INFINITY;
            float toward0 = nextafterf(m, 0.0f), away = nextafterf(m, inf);
            uint16_t even = (lo & 1) ? hi : lo;
            uint16_t r0 = kt_f32_to_bf16(toward0), rm = kt_f32_to_bf16(m), r1 = kt_f32_to_bf16(away);
            if (r0 != lo || rm != even || r1 != hi) {
                if (!bad++)
                    snprintf(first, sizeof first,
                             "pair 0x%04x/0x%04x mid %a: below->0x%04x at->0x%04x above->0x%04x "
                             "(want 0x%04x 0x%04x 0x%04x)",
                             lo, hi, (double)m, r0, rm, r1, lo, even, hi);
            }
            if (ref_f32_to_bf16(toward0) != lo || ref_f32_to_bf16(m) != even ||
                ref_f32_to_bf16(away) != hi) {
                if (!bad++) snprintf(first, sizeof first, "reference disagrees at pair 0x%04x", lo);
            }
        }
    }
    CHECK_MSG(inexact == 0, "%d midpoints not exact in f32", inexact);
    CHECK_MSG(pairs == 2 * 0x7f80, "%d pairs", pairs);
    CHECK_MSG(bad == 0, "%d bad pairs; first %s", bad, first);
}

TEST(bf16_special_inputs) {
    CHECK(kt_f32_to_bf16(u2f(0x7f7f8000u)) == 0x7f80); /* midpoint above max finite: Inf */
    CHECK(kt_f32_to_bf16(u2f(0x7f7f7fffu)) == 0x7f7f);
    CHECK(kt_f32_to_bf16(FLT_MAX) == 0x7f80);
    CHECK(kt_f32_to_bf16(-FLT_MAX) == 0xff80);
    CHECK(kt_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(kt_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(kt_f32_to_bf16(0.0f) == 0x0000);
    CHECK(kt_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(kt_f32_to_bf16(u2f(0x00008000u)) == 0x0000); /* tie to even: zero */
    CHECK(kt_f32_to_bf16(u2f(0x00008001u)) == 0x0001);
    CHECK(kt_f32_to_bf16(u2f(0x80008001u)) == 0x8001);
    CHECK(kt_f32_to_bf16(u2f(0x00018000u)) == 0x0002);
    CHECK(kt_f32_to_bf16(u2f(0x007fffffu)) == 0x0080); /* largest f32 subnormal -> smallest normal */
    CHECK(kt_f32_to_bf16(u2f(0x7fc00000u)) == 0x7fc0);
    CHECK(kt_f32_to_bf16(u2f(0xffc00000u)) == 0xffc0);
    CHECK(kt_f32_to_bf16(u2f(0x7f800001u)) == 0x7fc0); /* sNaN with only low payload: not Inf */
    CHECK(kt_f32_to_bf16(u2f(0xff800001u)) == 0xffc0);
    CHECK(kt_f32_to_bf16(u2f(0x7fffffffu)) == 0x7fff); /* no carry out of the payload */
    CHECK(kt_f32_to_bf16(u2f(0x7f810000u)) == 0x7fc1);
}

TEST(bf16_from_f32_cross_check) {
    int bad = 0, n = 0;
    uint32_t first = 0;
    rng_state = 0x2545F4914F6CDD1Dull;
    for (uint64_t k = 0; k < 4000000 + (1ull << 32) / 1021; k++) {
        uint32_t x = k < 4000000 ? rng32() : (uint32_t)((k - 4000000) * 1021u);
        float f = u2f(x);
        uint16_t got = kt_f32_to_bf16(f), want;
        n++;
        if (isnan(f))
            want = (uint16_t)((x >> 16) | 0x40);
        else
            want = ref_f32_to_bf16(f);
        if (got != want && !bad++) first = x;
    }
    CHECK_MSG(bad == 0, "%d of %d disagree with the reference; first 0x%08x", bad, n, (unsigned)first);
}


/* ---- fp8 ---------------------------------------------------------------- */

/* one fp8 format, described independently of dtype.c */
typedef struct {
    const char *name;
    int ebits, mbits, bias, has_inf; /* has_inf: IEEE-like specials (E5M2); else only S.1111.111 is NaN */
    float (*dec)(uint8_t);
    uint8_t (*enc)(float);
} f8fmt;

static const f8fmt k_e4m3 = {"e4m3", 4, 3, 7, 0, kt_e4m3_to_f32, kt_f32_to_e4m3};
static const f8fmt k_e5m2 = {"e5m2", 5, 2, 15, 1, kt_e5m2_to_f32, kt_f32_to_e5m2};

/* classification of a code: 0 finite, 1 Inf, 2 NaN */
static int f8_kind(const f8fmt *F, uint8_t b) {
    int e = (b & 0x7f) >> F->mbits, m = b & ((1 << F->mbits) - 1), emax = (1 << F->ebits) - 1;
    if (F->has_inf) return e == emax ? (m ? 2 : 1) : 0;
    return (b & 0x7f) == 0x7f ? 2 : 0;
}

/* value of a finite code from its fields, in double */
static double f8_ref_val(const f8fmt *F, uint8_t b) {
    int e = (b & 0x7f) >> F->mbits, m = b & ((1 << F->mbits) - 1);
    double v = e == 0 ? ldexp((double)m, 1 - F->bias - F->mbits)
                      : ldexp(1.0 + (double)m / (1 << F->mbits), e - F->bias);
    return (b & 0x80) ? -v : v;
}

/* the largest finite positive code */
static uint8_t f8_max_code(const f8fmt *F) {
    uint8_t c = 0;
    for (int b = 0; b < 0x80; b++)
        if (f8_kind(F, (uint8_t)b) == 0) c = (uint8_t)b;
    return c;
}

/* reference encoder: nearest finite value by search, ties to the even code,
 * saturating; NaN and Inf as documented */
static uint8_t f8_ref_enc(const f8fmt *F, float x) {
    uint8_t s = signbit(x) ? 0x80 : 0, mx = f8_max_code(F);
    if (isnan(x)) return s | (F->has_inf ? 0x7e : 0x7f);
    if (isinf(x)) return s | (F->has_inf ? 0x7c : mx);
    double a = fabs((double)x);
    if (a >= f8_ref_val(F, mx)) return s | mx;
    uint8_t lo = 0; /* codes 0..mx are ascending in value */
    while (lo < mx && f8_ref_val(F, (uint8_t)(lo + 1)) <= a) lo++;
    double vlo = f8_ref_val(F, lo), vhi = f8_ref_val(F, (uint8_t)(lo + 1));
    if (a == vlo) return s | lo;
    if (a - vlo < vhi - a) return s | lo;
    if (a - vlo > vhi - a) return s | (uint8_t)(lo + 1);
    return s | ((lo & 1) ? (uint8_t)(lo + 1) : lo);
}

static void f8_decode_exhaustive(const f8fmt *F) {
    int bad = 0, first = -1;
    for (int b = 0; b < 256; b++) {
        float got = F->dec((uint8_t)b);
        int k = f8_kind(F, (uint8_t)b), ok;
        if (k == 2) ok = isnan(got) && !signbit(got) == !(b & 0x80);
        else if (k == 1) ok = isinf(got) && !signbit(got) == !(b & 0x80);
        else ok = f2u(got) == f2u((float)f8_ref_val(F, (uint8_t)b)); /* exact, signed zero included */
        if (!ok && !bad++) first = b;
    }
    CHECK_MSG(bad == 0, "%s: %d of 256 codes decode wrong; first 0x%02x", F->name, bad, first);
}

static void f8_round_trip(const f8fmt *F) {
    int bad = 0, first = -1;
    for (int b = 0; b < 256; b++) {
        uint8_t back = F->enc(F->dec((uint8_t)b));
        uint8_t want = f8_kind(F, (uint8_t)b) == 2 ? (uint8_t)((b & 0x80) | (F->has_inf ? 0x7e : 0x7f)) : (uint8_t)b;
        if (back != want && !bad++) first = b;
    }
    CHECK_MSG(bad == 0, "%s: %d codes do not round trip; first 0x%02x", F->name, bad, first);
}

/* every adjacent pair of finite codes of one sign: the f32 midpoint goes to
 * the even code, its f32 neighbours to the nearer code */
static void f8_rounding_boundaries(const f8fmt *F) {
    int bad = 0, pairs = 0, inexact = 0;
    char first[200] = "";
    uint8_t mx = f8_max_code(F);
    for (int sg = 0; sg < 2; sg++) {
        uint8_t s = sg ? 0x80 : 0;
        for (int i = 0; i < mx; i++) {
            uint8_t lo = s | (uint8_t)i, hi = s | (uint8_t)(i + 1);
            double dm = (f8_ref_val(F, lo) + f8_ref_val(F, hi)) / 2;
            float m = (float)dm;
            if ((double)m != dm) {
                inexact++;
                continue;
            }
            pairs++;
            float below = nextafterf(m, 0.0f), above = nextafterf(m, sg ? -INFINITY : INFINITY);
            uint8_t even = (lo & 1) ? hi : lo;
            uint8_t r0 = F->enc(below), rm = F->enc(m), r1 = F->enc(above);
            if ((r0 != lo || rm != even || r1 != hi) && !bad++)
                snprintf(first, sizeof first, "pair 0x%02x/0x%02x mid %a: 0x%02x 0x%02x 0x%02x (want 0x%02x 0x%02x 0x%02x)",
                         lo, hi, (double)m, r0, rm, r1, lo, even, hi);
            if ((f8_ref_enc(F, below) != lo || f8_ref_enc(F, m) != even || f8_ref_enc(F, above) != hi) && !bad++)
                snprintf(first, sizeof first, "reference disagrees at pair 0x%02x", lo);
        }
    }
    CHECK_MSG(inexact == 0, "%s: %d midpoints not exact in f32", F->name, inexact);
    CHECK_MSG(pairs == 2 * mx, "%s: %d pairs, want %d", F->name, pairs, 2 * mx);
    CHECK_MSG(bad == 0, "%s: %d bad pairs; first %s", F->name, bad, first);
}

/* random and strided f32 patterns (every class: NaN, Inf, huge, subnormal)
 * against the search-based reference */
static void f8_cross_check(const f8fmt *F) {
    int bad = 0, n = 0;
    uint32_t first = 0;
    rng_state = 0x0DDB1A5E5BAD5EEDull;
    for (uint64_t k = 0; k < 1000000 + (1ull << 32) / 4093; k++) {
        uint32_t x = k < 1000000 ? rng32() : (uint32_t)((k - 1000000) * 4093u);
        if (k < 500000) x = (x & 0x807fffffu) | ((uint32_t)(100 + (x >> 23) % 60) << 23); /* near the fp8 range */
        float f = u2f(x);
        n++;
        if (F->enc(f) != f8_ref_enc(F, f) && !bad++) first = x;
    }
    CHECK_MSG(bad == 0, "%s: %d of %d disagree with the reference; first 0x%08x", F->name, bad, n, (unsigned)first);
}

TEST(fp8_decode_exhaustive) {
    f8_decode_exhaustive(&k_e4m3);
    f8_decode_exhaustive(&k_e5m2);
    CHECK(kt_e4m3_to_f32(0x38) == 1.0f && kt_e4m3_to_f32(0xc0) == -2.0f);
    CHECK(kt_e4m3_to_f32(0x7e) == 448.0f && kt_e4m3_to_f32(0xfe) == -448.0f);
    CHECK(kt_e4m3_to_f32(0x01) == 0x1p-9f && kt_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    CHECK(kt_e4m3_to_f32(0x08) == 0x1p-6f);
    CHECK(isnan(kt_e4m3_to_f32(0x7f)) && isnan(kt_e4m3_to_f32(0xff)) && signbit(kt_e4m3_to_f32(0xff)));
    CHECK(f2u(kt_e4m3_to_f32(0x80)) == 0x80000000u && f2u(kt_e4m3_to_f32(0x00)) == 0u);
    CHECK(isfinite(kt_e4m3_to_f32(0x78)) && kt_e4m3_to_f32(0x78) == 256.0f); /* E4M3 has no Inf */
    CHECK(kt_e5m2_to_f32(0x3c) == 1.0f && kt_e5m2_to_f32(0x7b) == 57344.0f);
    CHECK(kt_e5m2_to_f32(0x01) == 0x1p-16f && kt_e5m2_to_f32(0x04) == 0x1p-14f);
    CHECK(kt_e5m2_to_f32(0x7c) == INFINITY && kt_e5m2_to_f32(0xfc) == -INFINITY);
    CHECK(isnan(kt_e5m2_to_f32(0x7d)) && isnan(kt_e5m2_to_f32(0x7e)) && isnan(kt_e5m2_to_f32(0xff)));
}

TEST(fp8_round_trip) {
    f8_round_trip(&k_e4m3);
    f8_round_trip(&k_e5m2);
}

TEST(fp8_rounding_boundaries) {
    f8_rounding_boundaries(&k_e4m3);
    f8_rounding_boundaries(&k_e5m2);
}

TEST(fp8_special_inputs) {
    /* saturation: everything finite at or beyond the largest finite value */
    CHECK(kt_f32_to_e4m3(448.0f) == 0x7e && kt_f32_to_e4m3(-448.0f) == 0xfe);
    CHECK(kt_f32_to_e4m3(nextafterf(448.0f, 0.0f)) == 0x7e);
    CHECK(kt_f32_to_e4m3(464.0f) == 0x7e && kt_f32_to_e4m3(480.0f) == 0x7e); /* never the NaN code */
    CHECK(kt_f32_to_e4m3(1e30f) == 0x7e && kt_f32_to_e4m3(-FLT_MAX) == 0xfe);
    CHECK(kt_f32_to_e4m3(INFINITY) == 0x7e && kt_f32_to_e4m3(-INFINITY) == 0xfe);
    CHECK(kt_f32_to_e5m2(57344.0f) == 0x7b && kt_f32_to_e5m2(61440.0f) == 0x7b && kt_f32_to_e5m2(1e30f) == 0x7b);
    CHECK(kt_f32_to_e5m2(-FLT_MAX) == 0xfb);
    CHECK(kt_f32_to_e5m2(INFINITY) == 0x7c && kt_f32_to_e5m2(-INFINITY) == 0xfc);
    /* NaN: the format's NaN, sign kept */
    CHECK(kt_f32_to_e4m3(NAN) == 0x7f && kt_f32_to_e4m3(-NAN) == 0xff);
    CHECK(kt_f32_to_e4m3(u2f(0x7f800001u)) == 0x7f);
    CHECK(kt_f32_to_e5m2(NAN) == 0x7e && kt_f32_to_e5m2(-NAN) == 0xfe && kt_f32_to_e5m2(u2f(0xff800001u)) == 0xfe);
    /* zeros, underflow, subnormals */
    CHECK(kt_f32_to_e4m3(0.0f) == 0x00 && kt_f32_to_e4m3(-0.0f) == 0x80);
    CHECK(kt_f32_to_e4m3(0x1p-10f) == 0x00 && kt_f32_to_e4m3(-0x1p-10f) == 0x80); /* half the smallest: even (0) */
    CHECK(kt_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)) == 0x01);
    CHECK(kt_f32_to_e4m3(3 * 0x1p-10f) == 0x02); /* 1.5 steps: tie to even (2) */
    CHECK(kt_f32_to_e4m3(15 * 0x1p-10f) == 0x08); /* 7.5 steps: up into the smallest normal */
    CHECK(kt_f32_to_e4m3(u2f(1)) == 0x00 && kt_f32_to_e4m3(FLT_MIN) == 0x00);
    CHECK(kt_f32_to_e5m2(0x1p-17f) == 0x00 && kt_f32_to_e5m2(nextafterf(0x1p-17f, 1.0f)) == 0x01);
    CHECK(kt_f32_to_e5m2(-0.0f) == 0x80);
    /* exact values */
    CHECK(kt_f32_to_e4m3(1.0f) == 0x38 && kt_f32_to_e4m3(-2.0f) == 0xc0 && kt_f32_to_e4m3(0x1p-6f) == 0x08);
    CHECK(kt_f32_to_e5m2(1.0f) == 0x3c && kt_f32_to_e5m2(0x1p-14f) == 0x04);
    /* E5M2 is the top byte of f16, rounding directly (no double rounding through f16) */
    CHECK(kt_f32_to_e5m2(u2f(0x3f900001u)) == 0x3d); /* 1.125 + 1ulp: above the midpoint 1.125 -> 1.25 */
    CHECK(kt_f32_to_e5m2(1.125f) == 0x3c);           /* the midpoint itself: even (1.0) */
}

TEST(fp8_from_f32_cross_check) {
    f8_cross_check(&k_e4m3);
    f8_cross_check(&k_e5m2);
}

TEST(fp8_buffers) {
    uint8_t codes[256], back[257];
    float v[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    for (int f = 0; f < 2; f++) {
        kiln_dtype dt = f ? KILN_F8_E5M2 : KILN_F8_E4M3;
        const f8fmt *F = f ? &k_e5m2 : &k_e4m3;
        CHECK_OK(kt_to_f32(dt, codes, v, 256));
        int bad = 0;
        for (int i = 0; i < 256; i++)
            if (f2u(v[i]) != f2u(F->dec((uint8_t)i))) bad++;
        CHECK_MSG(bad == 0, "%s to_f32: %d wrong", F->name, bad);
        back[256] = 0xAB;
        CHECK_OK(kt_from_f32(dt, v, back, 256));
        bad = 0;
        for (int i = 0; i < 256; i++)
            if (back[i] != F->enc(v[i])) bad++;
        CHECK_MSG(bad == 0, "%s from_f32: %d wrong", F->name, bad);
        CHECK(back[256] == 0xAB);
    }
}

/* ---- buffers, names, sizes ---------------------------------------------- */

#define NBUF 37

TEST(buffers_unaligned) {
    uint8_t raw[1 + NBUF * 4 + 8];
    uint8_t *p = raw + 1; /* deliberately misaligned */
    float src[NBUF], out[NBUF], back[NBUF];
    uint16_t bits[NBUF];
    for (int i = 0; i < NBUF; i++) bits[i] = (uint16_t)(rng32() & 0xffff);
    bits[0] = 0x7c00, bits[1] = 0x8000, bits[2] = 0x0001, bits[3] = 0x7e00;

    /* F16 */
    memcpy(p, bits, sizeof bits);
    CHECK_OK(kt_to_f32(KILN_F16, p, out, NBUF));
    int bad = 0;
    for (int i = 0; i < NBUF; i++)
        if (f2u(out[i]) != f2u(kt_f16_to_f32(bits[i]))) bad++;
    CHECK_MSG(bad == 0, "F16 to_f32: %d wrong", bad);
    memset(raw, 0xAB, sizeof raw);
    CHECK_OK(kt_from_f32(KILN_F16, out, p, NBUF));
    bad = 0;
    for (int i = 0; i < NBUF; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        if (h != kt_f32_to_f16(out[i])) bad++;
    }
    CHECK_MSG(bad == 0, "F16 from_f32: %d wrong", bad);
    CHECK(raw[0] == 0xAB && p[2 * NBUF] == 0xAB); /* nothing written outside */

    /* BF16 */
    memcpy(p, bits, sizeof bits);
    CHECK_OK(kt_to_f32(KILN_BF16, p, out, NBUF));
    bad = 0;
    for (int i = 0; i < NBUF; i++)
        if (f2u(out[i]) != (uint32_t)bits[i] << 16) bad++;
    CHECK_MSG(bad == 0, "BF16 to_f32: %d wrong", bad);
    for (int i = 0; i < NBUF; i++) src[i] = u2f(rng32() & 0x7fffffffu) * ((i & 1) ? -1.0f : 1.0f);
    memset(raw, 0xAB, sizeof raw);
    CHECK_OK(kt_from_f32(KILN_BF16, src, p, NBUF));
    bad = 0;
    for (int i = 0; i < NBUF; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        if (h != kt_f32_to_bf16(src[i])) bad++;
    }
    CHECK_MSG(bad == 0, "BF16 from_f32: %d wrong", bad);
    CHECK(raw[0] == 0xAB && p[2 * NBUF] == 0xAB);

    /* F32: bit-exact copies both ways */
    for (int i = 0; i < NBUF; i++) src[i] = u2f(rng32());
    memset(raw, 0xAB, sizeof raw);
    CHECK_OK(kt_from_f32(KILN_F32, src, p, NBUF));
    CHECK(memcmp(p, src, sizeof src) == 0);
    CHECK(raw[0] == 0xAB && p[4 * NBUF] == 0xAB);
    CHECK_OK(kt_to_f32(KILN_F32, p, back, NBUF));
    CHECK(memcmp(back, src, sizeof src) == 0);

    /* n = 0 is fine */
    CHECK_OK(kt_to_f32(KILN_F16, p, out, 0));
    CHECK_OK(kt_from_f32(KILN_BF16, src, p, 0));
}

TEST(unsupported_dtypes) {
    uint8_t buf[16] = {0};
    float f[4] = {0};
    CHECK_FAILS(kt_to_f32(KILN_I8, buf, f, 4), KILN_ERR_DTYPE, "I8");
    CHECK_FAILS(kt_from_f32(KILN_I8, f, buf, 4), KILN_ERR_DTYPE, "I8");
    CHECK_FAILS(kt_from_f32(KILN_U8, f, buf, 4), KILN_ERR_DTYPE, "U8");
    CHECK_FAILS(kt_to_f32(KILN_F64, buf, f, 2), KILN_ERR_DTYPE, "F64");
    CHECK_FAILS(kt_from_f32(KILN_BOOL, f, buf, 4), KILN_ERR_DTYPE, "BOOL");
}

TEST(names_and_sizes) {
    int bad = 0;
    for (int t = 1; t < KILN_DTYPE_COUNT; t++) {
        const char *name = kiln_dtype_name((kiln_dtype)t);
        if (!name || kt_dtype_from_name(name) != (kiln_dtype)t) {
            bad++;
            fprintf(stderr, "  dtype %d name %s does not round trip\n", t, name ? name : "(null)");
        }
    }
    CHECK(bad == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_F32), "F32") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_BF16), "BF16") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_F8_E4M3), "F8_E4M3") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_INVALID), "INVALID") == 0);
    CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_COUNT), "INVALID") == 0);
    CHECK(kt_dtype_from_name("") == KILN_DTYPE_INVALID);
    CHECK(kt_dtype_from_name("F33") == KILN_DTYPE_INVALID);
    CHECK(kt_dtype_from_name("F3") == KILN_DTYPE_INVALID);
    CHECK(kt_dtype_from_name("F32 ") == KILN_DTYPE_INVALID);
    CHECK(kt_dtype_from_name("FLOAT32") == KILN_DTYPE_INVALID);
    CHECK(kt_dtype_from_name("INVALID") == KILN_DTYPE_INVALID);
    CHECK(kiln_dtype_size(KILN_F32) == 4);
    CHECK(kiln_dtype_size(KILN_F16) == 2);
    CHECK(kiln_dtype_size(KILN_BF16) == 2);
    CHECK(kiln_dtype_size(KILN_F64) == 8);
    CHECK(kiln_dtype_size(KILN_I64) == 8);
    CHECK(kiln_dtype_size(KILN_F8_E4M3) == 1);
    CHECK(kiln_dtype_size(KILN_BOOL) == 1);
    CHECK(kiln_dtype_size(KILN_DTYPE_INVALID) == 0);
    CHECK(kiln_dtype_size(KILN_DTYPE_COUNT) == 0);
    CHECK(kt_dtype_is_float_source(KILN_F32) && kt_dtype_is_float_source(KILN_F16) &&
          kt_dtype_is_float_source(KILN_BF16));
    CHECK(!kt_dtype_is_float_source(KILN_F64) && !kt_dtype_is_float_source(KILN_I8) &&
          !kt_dtype_is_float_source(KILN_DTYPE_INVALID));
}

int main(void) {
    RUN(f16_to_f32_exhaustive);
    RUN(f16_to_f32_vs_float16);
    RUN(f16_round_trip);
    RUN(f16_rounding_boundaries);
    RUN(f16_special_inputs);
    RUN(f16_from_f32_cross_check);
    RUN(bf16_to_f32_exhaustive);
    RUN(bf16_round_trip);
    RUN(bf16_rounding_boundaries);
    RUN(bf16_special_inputs);
    RUN(bf16_from_f32_cross_check);
    RUN(fp8_decode_exhaustive);
    RUN(fp8_round_trip);
    RUN(fp8_rounding_boundaries);
    RUN(fp8_special_inputs);
    RUN(fp8_from_f32_cross_check);
    RUN(fp8_buffers);
    RUN(buffers_unaligned);
    RUN(unsupported_dtypes);
    RUN(names_and_sizes);
    return TEST_SUMMARY();
}
