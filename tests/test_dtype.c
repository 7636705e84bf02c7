/* test_dtype.c - f16/bf16 <-> f32 conversions checked exhaustively over all
 * 16-bit patterns and every rounding boundary against independent references
 * (ldexp/frexp/rint in double and, where the compiler has it, _Float16), plus
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
    CHECK_FAILS(kt_to_f32(KILN_F8_E4M3, buf, f, 4), KILN_ERR_DTYPE, "F8_E4M3");
    CHECK_FAILS(kt_from_f32(KILN_I8, f, buf, 4), KILN_ERR_DTYPE, "I8");
    CHECK_FAILS(kt_from_f32(KILN_F8_E4M3, f, buf, 4), KILN_ERR_DTYPE, "F8_E4M3");
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
    RUN(buffers_unaligned);
    RUN(unsupported_dtypes);
    RUN(names_and_sizes);
    return TEST_SUMMARY();
}
