/* gemm_f16.h - kiln's bf16 GEMM for CPUs with AVX512-FP16 but no AMX
 * (gemm_f16.c): fp16 products on bf16 weights packed once (the "f16p64"
 * layout of the weight cache), f32 sums. */
#ifndef KILN_GEMM_F16_H
#define KILN_GEMM_F16_H

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/epilogue.h"
#include "kernels/cpu/simd.h"

#include <stddef.h>
#include <stdint.h>


/* The f16p64 layout of W [N outputs, K inputs]: panels of 64 outputs, each
 * [K/2 input pairs][64 outputs x 2] fp16 (an output's two inputs side by
 * side), N padded to 64 and K to 2 with zeros; every output scaled by a
 * power of two so that its largest |w| lies in [8, 16); then the scales'
 * inverses [N padded to 64] f32. Its size in bytes: */
size_t kk_f16_packed_bytes(int64_t N, int64_t K);
/* Pack W [N,K] f32 row-major (rounded to bf16 first, nearest even: the
 * weights are bf16's, exactly, in fp16 times a power of two) into out. */
void kk_f16_pack(const float *w, int64_t N, int64_t K, void *out);
/* W [N,K] f32 back from the packed layout (the bf16-rounded weights). */
void kk_f16_unpack(const void *packed, int64_t N, int64_t K, float *out);

/* The bytes of kk_f16_linear's work buffer on `threads` threads (x packed,
 * its row scales, a row of x per thread). */
size_t kk_f16_work_bytes(int64_t rows, int64_t K, int threads);

/* y [rows,N] = the epilogue e of x [rows,K] . W^T (epilogue.h's
 * kk_amx_epilogue, e->scales included), x f32 or bf16 rows (x_fmt
 * KK_FMT_F32 / KK_FMT_BF16), y f32 or bf16 rows; on `threads` threads;
 * work holds kk_f16_work_bytes(rows, K, threads). Returns 0 (and does nothing)
 * where it does not apply: no AVX512-FP16, a blocked format, no work
 * buffer. */
int kk_f16_linear(const void *x, int x_fmt, const void *packed, int64_t N, int64_t K, const kk_amx_epilogue *e,
                  void *y, int y_fmt, int64_t rows, int threads, void *work);

/* ---- shared by the fp16 kernels (gemm_f16.c, attn_f16.c) ---- */
#include <immintrin.h>
#include <math.h>

/* AVX512-FP16 code; AMX_FN's features too, so that it may inline the AMX
 * kernels' helpers (none of which uses a tile instruction) */
#define F16_FN                                                                                                         \
    __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bf16,avx512bw,avx512vl,avx512dq,avx512fp16")))

#define KK_F16_MR 6     /* rows of a's tile */
#define KK_F16_NV 4     /* 16-output vectors of b's panel (64 outputs) */
#define KK_F16_CHUNK 64 /* input pairs summed in fp16 before they go into f32 */

/* The power of two that puts m (the largest |value| of a row, or of an
 * output's weights) in [8, 16); 1 for 0 and for inf / NaN (which stay what
 * they are). Two such operands' products stay below 256, and 64 of them
 * below 16384, far from fp16's 65504. */
static inline float kk_range_scale(float m) {
    if (!(m > 0) || !isfinite(m)) return 1.0f;
    int ex;
    frexpf(m, &ex); /* m = f 2^ex, f in [0.5, 1) */
    int s = 4 - ex;
    return ldexpf(1.0f, s < -100 ? -100 : s > 100 ? 100 : s);
}

/* c [6][4][32] f32 = a . b over KP input pairs: a's 6 rows (row i's pair p,
 * two fp16 in 32 bits, at a[p * sp + i * si]) by b's panel of 64 outputs
 * ([KP][64 outputs][2] fp16). An output's even and odd inputs are summed
 * apart, in lanes 2j and 2j + 1 of its vector (kk_f16_pairsum adds them);
 * in fp16 for KK_F16_CHUNK pairs at a time, then into f32: 24 accumulator
 * registers, a row's pair broadcast (one 32-bit load) against four
 * vectors of b. far (a constant): b also brought into L2 64 pairs ahead,
 * for a single tile, whose GEMM streams its weights from memory (the
 * modulation GEMVs: 0.89x of their time). */
__attribute__((always_inline)) F16_FN static inline void kk_f16_micro(const uint32_t *a, int64_t sp, int64_t si,
                                                                      const _Float16 *b, int64_t KP, float *c,
                                                                      int far) {
    enum { R = KK_F16_MR, V = KK_F16_NV };
    for (int64_t p0 = 0; p0 < KP; p0 += KK_F16_CHUNK) {
        int64_t pe = KP - p0 < KK_F16_CHUNK ? KP : p0 + KK_F16_CHUNK;
        __m512h acc[R][V];
        for (int i = 0; i < R; i++)
            for (int j = 0; j < V; j++) acc[i][j] = _mm512_setzero_ph();
        for (int64_t p = p0; p < pe; p++) {
            __m512h w[V];
            for (int j = 0; j < V; j++) w[j] = _mm512_loadu_ph(b + (p * V + j) * 32);
            /* b's four lines eight pairs ahead, into L1 (0.96-0.99x of the forward over half of them) */
            for (int j = 0; j < V; j++) _mm_prefetch((const char *)(b + (p + 8) * V * 32 + 32 * j), _MM_HINT_T0);
            if (far)
                for (int j = 0; j < V; j++) _mm_prefetch((const char *)(b + (p + 64) * V * 32 + 32 * j), _MM_HINT_T1);
            for (int i = 0; i < R; i++) {
                __m512h x = (__m512h)_mm512_set1_epi32((int)a[p * sp + i * si]);
                for (int j = 0; j < V; j++) acc[i][j] = _mm512_fmadd_ph(x, w[j], acc[i][j]);
            }
        }
        for (int i = 0; i < R; i++)
            for (int j = 0; j < V; j++) {
                float *o = c + (i * V + j) * 32;
                __m512 lo = _mm512_cvtxph_ps(_mm512_castph512_ph256(acc[i][j]));
                __m512 hi = _mm512_cvtxph_ps((__m256h)_mm512_extracti64x4_epi64((__m512i)acc[i][j], 1));
                if (p0) {
                    lo = _mm512_add_ps(lo, _mm512_load_ps(o));
                    hi = _mm512_add_ps(hi, _mm512_load_ps(o + 16));
                }
                _mm512_store_ps(o, lo);
                _mm512_store_ps(o + 16, hi);
            }
    }
}

/* the 16 outputs of one vector of kk_f16_micro's c (32 f32 at v: output j's
 * even and odd sums in lanes 2j, 2j + 1), each output's two sums added */
F16_FN static inline __m512 kk_f16_pairsum(const float *v) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 lo = _mm512_load_ps(v), hi = _mm512_load_ps(v + 16);
    return _mm512_add_ps(_mm512_permutex2var_ps(lo, ev, hi), _mm512_permutex2var_ps(lo, od, hi));
}

#endif
