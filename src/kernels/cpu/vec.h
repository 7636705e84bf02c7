/* vec.h - scalar helpers the CPU kernels write their loops with so the
 * compiler vectorizes them (per CPU: KK_CLONES makes one copy per target,
 * picked at load time): e^x (exp_f), f32 <-> bf16 bits. Shared by fast.c
 * and conv.c, so each is defined once. */
#ifndef KILN_VEC_H
#define KILN_VEC_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define KK_CLONES __attribute__((target_clones("arch=sapphirerapids", "avx512f", "avx2", "default")))
#else
#define KK_CLONES
#endif

static inline float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* e^x for x <= 0-ish softmax arguments: Cody-Waite reduction and a degree-6
 * polynomial (Cephes' expf), branch-free so loops vectorize; ~1 ulp. */
static inline float exp_f(float x) {
    x = x < -87.3f ? -87.3f : x > 88.7f ? 88.7f : x;
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * bits_f((uint32_t)((int32_t)n + 127) << 23);
}

/* tanh-GELU of v: 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3),
 * tanh(u) = 1 - 2 / (e^2u + 1); the fast backends' f32 GELU (fast.c's
 * elementwise one and the avx2 GEMM's epilogue: the same bits) */
static inline float gelu_tanh_f(float v) {
    float u = 0.7978845608f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (2.0f - 2.0f / (exp_f(2.0f * u) + 1.0f));
}

/* round to nearest even; NaN stays NaN (quiet) - branch-free kt_f32_to_bf16 */
static inline uint16_t bf16_of(float f) {
    uint32_t u = f_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* bf16 bits widened to the f32 they stand for (exact) */
static inline float f32_of(uint16_t h) { return bits_f((uint32_t)h << 16); }

#endif
