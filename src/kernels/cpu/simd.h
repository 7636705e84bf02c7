/* simd.h - AVX-512 helpers shared by kiln's own kernels (the AMX and fp16
 * GEMMs and attentions): the target attribute they are built with and 2^x
 * over 16 lanes. */
#ifndef KILN_SIMD_H
#define KILN_SIMD_H

#include <immintrin.h>
#include <stdint.h>

/* functions built for AMX; only called after kk_amx_ready() */
#define AMX_FN __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bf16,avx512bw,avx512vl,avx512dq")))

/* functions built for AVX512-BF16 (attn_bf16.c, fast.c's bf16 producers);
 * only called where the CPU has it (kk_bf16_ready(), or kk_fast's bf16
 * backend). AMX_FN's features, so that they inline the helpers below and
 * attn_rows.h's (none of which uses a tile instruction) */
#define BF16_FN AMX_FN

/* 2^x for 16 lanes (-inf and +inf included): x = n + f with n = floor(x),
 * f in [0, 1); 2^f by a degree-3 polynomial (7.5e-5 relative error: for
 * values rounded to bf16, 3.9e-3, anyway) and the 2^n by scalef, which
 * floors x itself and saturates to 0 and inf past the f32 range. Results
 * below 2^-126 are subnormal: this is for code that runs with them flushed
 * (MXCSR's FTZ and DAZ, as the attention does); elsewhere kk_exp2_16. NaN
 * stays NaN. */
AMX_FN static inline __m512 kk_exp2_16_ftz(__m512 x) {
    __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.07802419f), f, _mm512_set1_ps(0.22606721f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69583374f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992517f));
    return _mm512_scalef_ps(p, x);
}

/* 2^x as kk_exp2_16_ftz, with no result below 2^-125 and so no subnormal:
 * each subnormal result or operand costs a microcode assist (~150 cycles),
 * which made the ff GEMMs' GELU epilogue 2-3x slower; 2^-125 is 0 wherever
 * it is used (beside 1 in GELU's 1 + 2^t). -inf gives 2^-125; NaN stays NaN
 * (max_ps returns its second operand then). */
AMX_FN static inline __m512 kk_exp2_16(__m512 x) { return kk_exp2_16_ftz(_mm512_max_ps(_mm512_set1_ps(-125.0f), x)); }

#endif
