/* gemm_avx2.c - kiln's f32 GEMM for CPUs with AVX2 + FMA and no AVX-512
 * (AMD Zen 1-3, Intel before Skylake-SP; or any machine under
 * KILN_MAX_ISA=avx2).
 *
 * Why kiln's own: oneDNN 2.6 has no brgemm matmul for AVX2; its "gemm:jit"
 * splits the inputs (K) of a small-M product between threads and picks
 * kernels by M, so the rows of a batch of two came out other than a batch
 * of one (test_encode). Here every output is one FMA chain over k = 0 ..
 * K-1 in order, from 0, whatever the number of rows, the threads or a
 * row's place in its tile; threads split rows and outputs, never K.
 *
 * y [rows,N] = act(x [rows,K] . W^T + bias):
 *   - W is packed once (at conversion, stored so in the weight cache) in
 *     panels of 16 outputs, [K][16] f32 per panel;
 *   - the micro-kernel keeps a 6 x 16 block of C in 12 ymm registers, a
 *     row's x[k] broadcast against the panel's two vectors at k (BLIS's
 *     Haswell shape: 12 FMAs to 8 loads a step);
 *   - K goes in blocks of KC inputs (the panel's block, 16 KiB, stays in L1
 *     while the row tiles of a work item pass); the block's sums go to a
 *     per-thread C buffer and come back for the next block (an exact f32
 *     store and load: the chain is unchanged);
 *   - a tile short of 6 rows repeats its last row (discarded), so it runs
 *     the same instructions; the epilogue adds the bias, applies GELU
 *     (vec.h's gelu_tanh_f, the bits of fast.c's elementwise GELU) and
 *     writes the tile's rows.
 * Work items: a block of MB row tiles against one panel, taken
 * dynamically; consecutive items share the row block (x in L2). */
#include "kernels/cpu/gemm_avx2.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

#define AVX2_FN __attribute__((target("avx2,fma")))
#define MR 6   /* rows per tile */
#define NR 16  /* outputs per panel */
#define KC 256 /* inputs per block */
#define MB 32  /* row tiles per work item */

static int64_t panels(int64_t N) { return (N + NR - 1) / NR; }

size_t kk_avx2_packed_bytes(int64_t N, int64_t K) { return (size_t)(panels(N) * NR) * (size_t)K * sizeof(float); }

void kk_avx2_pack(const float *w, int64_t N, int64_t K, void *out) {
    float *p = out;
    int64_t NP = panels(N);
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
    for (int64_t q = 0; q < NP; q++) {
        float *panel = p + (size_t)(q * K * NR);
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < NR; j++) {
                int64_t n = q * NR + j;
                panel[k * NR + j] = n < N ? w[n * K + k] : 0.0f;
            }
    }
}

void kk_avx2_unpack(const void *packed, int64_t N, int64_t K, float *out) {
    const float *p = packed;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[n * K + k] = p[(size_t)((n / NR) * K * NR + k * NR + n % NR)];
}

/* c [6][16] (+)= rows a[0..5] (each from its k0) . the panel's [kn][16] at b */
AVX2_FN static void micro(const float *const a[MR], const float *b, int64_t kn, float *c, int first) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (first) {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    } else {
        c00 = _mm256_load_ps(c + 0), c01 = _mm256_load_ps(c + 8);
        c10 = _mm256_load_ps(c + 16), c11 = _mm256_load_ps(c + 24);
        c20 = _mm256_load_ps(c + 32), c21 = _mm256_load_ps(c + 40);
        c30 = _mm256_load_ps(c + 48), c31 = _mm256_load_ps(c + 56);
        c40 = _mm256_load_ps(c + 64), c41 = _mm256_load_ps(c + 72);
        c50 = _mm256_load_ps(c + 80), c51 = _mm256_load_ps(c + 88);
    }
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = 0; k < kn; k++) {
        __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8), x;
        x = _mm256_broadcast_ss(a0 + k);
        c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a1 + k);
        c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a2 + k);
        c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a3 + k);
        c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a4 + k);
        c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a5 + k);
        c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    _mm256_store_ps(c + 0, c00), _mm256_store_ps(c + 8, c01);
    _mm256_store_ps(c + 16, c10), _mm256_store_ps(c + 24, c11);
    _mm256_store_ps(c + 32, c20), _mm256_store_ps(c + 40, c21);
    _mm256_store_ps(c + 48, c30), _mm256_store_ps(c + 56, c31);
    _mm256_store_ps(c + 64, c40), _mm256_store_ps(c + 72, c41);
    _mm256_store_ps(c + 80, c50), _mm256_store_ps(c + 88, c51);
}

/* the tile's sums c [6][16] -> y rows [r0, r0 + nr), outputs [n0, n0 + nc) */
AVX2_FN static void finish(const float *c, const float *bias, int act, float *y, int64_t N, int64_t r0, int64_t nr,
                           int64_t n0, int64_t nc) {
    for (int64_t i = 0; i < nr; i++) {
        float v[NR];
        for (int j = 0; j < NR; j++) v[j] = c[i * NR + j] + (bias && j < nc ? bias[n0 + j] : 0.0f);
        if (act == KK_ACT_GELU_TANH)
#pragma omp simd
            for (int j = 0; j < NR; j++) v[j] = gelu_tanh_f(v[j]);
        memcpy(y + (r0 + i) * N + n0, v, sizeof(float) * (size_t)nc);
    }
}

AVX2_FN int kk_avx2_linear(const float *x, const void *packed, int64_t N, int64_t K, const float *bias, int act,
                           float *y, int64_t rows, int threads) {
    if (kk_cpu_class() < KK_CLASS_AVX2) return 0;
    if (rows <= 0 || N <= 0) return 1;
    const float *w = packed;
    int64_t NP = panels(N), tiles = (rows + MR - 1) / MR, blocks = (tiles + MB - 1) / MB, items = blocks * NP;
    if (K <= 0) { /* no inputs: every sum is 0 */
        _Alignas(32) float z[MR * NR] = {0};
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * N > (1 << 14))
        for (int64_t t = 0; t < tiles; t++)
            for (int64_t q = 0; q < NP; q++)
                finish(z, bias, act, y, N, t * MR, rows - t * MR < MR ? rows - t * MR : MR, q * NR,
                       N - q * NR < NR ? N - q * NR : NR);
        return 1;
    }
#pragma omp parallel num_threads(threads) if (items > 1)
    {
        _Alignas(32) float c[MB][MR * NR];
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t blk = it / NP, q = it % NP;
            int64_t t0 = blk * MB, t1 = t0 + MB < tiles ? t0 + MB : tiles;
            const float *panel = w + (size_t)(q * K * NR);
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                int64_t kn = K - k0 < KC ? K - k0 : KC;
                for (int64_t t = t0; t < t1; t++) {
                    const float *a[MR];
                    int64_t nr = rows - t * MR < MR ? rows - t * MR : MR;
                    for (int i = 0; i < MR; i++) a[i] = x + (t * MR + (i < nr ? i : nr - 1)) * K + k0;
                    micro(a, panel + k0 * NR, kn, c[t - t0], k0 == 0);
                }
            }
            for (int64_t t = t0; t < t1; t++)
                finish(c[t - t0], bias, act, y, N, t * MR, rows - t * MR < MR ? rows - t * MR : MR, q * NR,
                       N - q * NR < NR ? N - q * NR : NR);
        }
    }
    return 1;
}
